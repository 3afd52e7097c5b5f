package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

// debianRunner is what mdag-torch-runner.base says of a runner built on
// Debian's CPU PyTorch (no --torch-base).
const debianRunner = "debian (CPU PyTorch)"

// helmKeys maps an image to its key under the chart's images:.
var helmKeys = map[string]string{"mdag": "mdag", "mdag-lean": "lean", "mdag-torch-runner": "torchRunner"}

func runPin(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	digests := fs.String("digests", "build/images/digests.txt", "the digests (mkimage build writes them)")
	kust := fs.String("kustomization", "deploy/kubernetes/base/kustomization.yaml", "the kustomization whose images: entries get the digests")
	helm := fs.String("helm-values", "deploy/helm/mdag/values.yaml", "the chart's values, whose images.<key>.digest are set (skipped when the file does not exist)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := os.ReadFile(*digests)
	if err != nil {
		return err
	}
	d, err := parseDigests(b)
	if err != nil {
		return fmt.Errorf("%s: %w", *digests, err)
	}
	// The manifests run the runner beside GPU workers with --device=cuda,
	// which a runner on Debian's CPU PyTorch refuses: it is pinned only
	// when built on a CUDA PyTorch base (--torch-base), else the manifests
	// keep naming it by tag, for the image you build on your base.
	keep := map[string]bool{}
	if base, _ := os.ReadFile(filepath.Join(filepath.Dir(*digests), "mdag-torch-runner.base")); strings.TrimSpace(string(base)) == debianRunner || len(base) == 0 {
		delete(d, "mdag-torch-runner")
		keep["mdag-torch-runner"] = true
		fmt.Fprintf(stdout, "mkimage pin: mdag-torch-runner left as it is: it was built on Debian's CPU PyTorch, and the manifests run it with --device=cuda; "+
			"build it on a CUDA PyTorch image to pin it (mkimage build --only mdag-torch-runner --torch-base REF --pin; docs/deploy.md, \"Images\")\n")
	}
	if err := editFile(*kust, func(doc *yaml.Node) error { return pinKustomization(doc, d, keep) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mkimage pin: %s\n", *kust)
	if _, err := os.Stat(*helm); os.IsNotExist(err) {
		fmt.Fprintf(stdout, "mkimage pin: %s does not exist, skipped\n", *helm)
		return nil
	}
	if err := editFile(*helm, func(doc *yaml.Node) error { return pinHelmValues(doc, d) }); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mkimage pin: %s\n", *helm)
	return nil
}

// editFile rewrites a YAML file through its node tree (comments kept),
// indented by 2 as the repository's YAML is; unchanged files are not
// written.
func editFile(path string, edit func(*yaml.Node) error) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := editYAML(b, edit)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if bytes.Equal(out, b) {
		return nil
	}
	return os.WriteFile(path, out, 0o644)
}

func editYAML(b []byte, edit func(*yaml.Node) error) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("not a YAML mapping")
	}
	if err := edit(doc.Content[0]); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return keepBlankLines(b, out.Bytes()), nil
}

// keepBlankLines puts back the blank lines of in that yaml.v3 drops when
// it encodes out, when the edit kept every other line in place (values
// changed, no line added or removed): the k-th non-blank line of out gets
// the blank lines that came before the k-th of in.
func keepBlankLines(in, out []byte) []byte {
	inLines := strings.Split(strings.TrimSuffix(string(in), "\n"), "\n")
	outLines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	blanksBefore := map[int]int{} // k-th non-blank line of in -> blank lines before it
	k, blanks := 0, 0
	for _, l := range inLines {
		if strings.TrimSpace(l) == "" {
			blanks++
			continue
		}
		blanksBefore[k] = blanks
		k, blanks = k+1, 0
	}
	nonBlank := 0
	for _, l := range outLines {
		if strings.TrimSpace(l) != "" {
			nonBlank++
		}
	}
	if nonBlank != k {
		return out
	}
	var b strings.Builder
	k = 0
	for _, l := range outLines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		b.WriteString(strings.Repeat("\n", blanksBefore[k]))
		b.WriteString(l + "\n")
		k++
	}
	return []byte(b.String())
}

// lookup is the value of key in mapping m, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// set puts key: value (a string) in mapping m, after the last key when new.
func set(m *yaml.Node, key, value string) {
	if v := lookup(m, key); v != nil {
		v.Kind, v.Tag, v.Value, v.Style = yaml.ScalarNode, "!!str", value, 0
		return
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}

func remove(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}

// pinKustomization sets digest: in each images: entry whose name is an
// image built (mdag, mdag-torch-runner) and drops its newTag; newName
// stays. An image the kustomization maps with no digest given is an error.
func pinKustomization(m *yaml.Node, digests map[string]string, keep map[string]bool) error {
	images := lookup(m, "images")
	if images == nil || images.Kind != yaml.SequenceNode {
		return fmt.Errorf("no images: list")
	}
	for i, im := range images.Content {
		n := lookup(im, "name")
		if n == nil {
			return fmt.Errorf("images[%d]: no name", i)
		}
		d, ok := digests[n.Value]
		if keep[n.Value] {
			continue
		}
		if !ok {
			return fmt.Errorf("images[%d] (%s): no digest for it in digests.txt (build it: make images)", i, n.Value)
		}
		remove(im, "newTag")
		set(im, "digest", d)
	}
	return nil
}

// pinHelmValues sets images.<key>.digest for each image built (keys
// mdag, lean, torchRunner: maps of repository, tag, digest).
func pinHelmValues(m *yaml.Node, digests map[string]string) error {
	images := lookup(m, "images")
	if images == nil || images.Kind != yaml.MappingNode {
		return fmt.Errorf("no images: mapping")
	}
	for _, name := range imageNames {
		d, ok := digests[name]
		if !ok {
			continue
		}
		key := helmKeys[name]
		v := lookup(images, key)
		if v == nil {
			return fmt.Errorf("images.%s: missing (the %s image)", key, name)
		}
		if v.Kind != yaml.MappingNode {
			return fmt.Errorf("images.%s: not a mapping of repository, tag, digest", key)
		}
		set(v, "digest", d)
	}
	return nil
}
