package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// spec is one image: its layers (trees, bottom first) and its config.
type spec struct {
	Name   string
	Layers []namedTree
	Config v1.Config
	Base   v1.Image // nil: from scratch
}

type namedTree struct {
	What string // the history's created_by
	Tree *tree
}

// built is an image made, with what its summary prints.
type built struct {
	Name         string
	Image        v1.Image
	Digest       v1.Hash
	Compressed   int64 // layers, config and manifest as a registry stores them
	Uncompressed int64 // the layers' tars
}

// assemble makes the image of s: each tree a gzip layer written under
// work (OCI media types), history and config created at epoch.
func assemble(s spec, work string, epoch time.Time) (*built, error) {
	img := s.Base
	if img == nil {
		img = mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: the base's config: %w", s.Name, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = s.Config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	b := &built{Name: s.Name}
	for i, l := range s.Layers {
		f := filepath.Join(work, fmt.Sprintf("%s-layer%d.tar.gz", s.Name, i))
		out, err := os.Create(f)
		if err != nil {
			return nil, err
		}
		err = l.Tree.Write(out, epoch)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("%s, layer %d (%s): %w", s.Name, i, l.What, err)
		}
		layer, err := tarball.LayerFromFile(f, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("%s, layer %d: %w", s.Name, i, err)
		}
		if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: l.What, Comment: "tools/mkimage"}}); err != nil {
			return nil, err
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return nil, err
		}
		b.Compressed += n
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		u, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		b.Uncompressed += u
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	man, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	b.Compressed += int64(len(raw) + len(man))
	b.Image = img
	if b.Digest, err = img.Digest(); err != nil {
		return nil, err
	}
	return b, nil
}

// writeArchive writes img as an OCI image layout archive at out: a tar
// of oci-layout, index.json (one manifest, annotated with refName) and
// blobs/sha256/, entries sorted with fixed times as the layers are.
func writeArchive(img v1.Image, refName, out string, epoch time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName}),
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		return fmt.Errorf("%s: %w", out, err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := tarDir(f, dir, epoch); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// tarDir writes the files under dir as an uncompressed tar, sorted, with
// mode 0644 (directories 0755), uid 0 and mtime epoch.
func tarDir(w io.Writer, dir string, epoch time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			rel += "/"
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if strings.HasSuffix(n, "/") {
			h.Mode, h.Typeflag = 0o755, tar.TypeDir
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fi, err := f.Stat()
		if err == nil {
			h.Size = fi.Size()
			if err = tw.WriteHeader(h); err == nil {
				_, err = io.Copy(tw, f)
			}
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return tw.Close()
}

// readArchive reads the one image of an OCI layout archive (as
// writeArchive writes, or skopeo copy ... oci-archive: does), unpacked
// under a temporary directory of work.
func readArchive(archive, work string) (v1.Image, error) {
	dir, err := os.MkdirTemp(work, ".unpack-")
	if err != nil {
		return nil, err
	}
	if err := untar(archive, dir); err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: not an OCI image layout: %w", archive, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("%s: %d manifests in index.json, want 1", archive, len(im.Manifests))
	}
	d := im.Manifests[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, m := range cm.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == "amd64" {
				return child.Image(m.Digest)
			}
		}
		return nil, fmt.Errorf("%s: no linux/amd64 image in its index", archive)
	}
	return idx.Image(d.Digest)
}

// untar unpacks a plain tar of regular files and directories (an OCI
// layout archive) into dir.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.Create(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %c, want a file or directory", h.Name, h.Typeflag)
		}
	}
}

// digestsFile is build/images/digests.txt: "name sha256:..." a line, sorted.
func digestsFile(digests map[string]string) []byte {
	var lines []string
	for n, d := range digests {
		lines = append(lines, n+" "+d)
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n") + "\n")
}

// parseDigests reads digests.txt.
func parseDigests(b []byte) (map[string]string, error) {
	m := map[string]string{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[1], "sha256:") || len(f[1]) != len("sha256:")+64 {
			return nil, fmt.Errorf("line %d: %q, want NAME sha256:HEX", i+1, line)
		}
		m[f[0]] = f[1]
	}
	return m, nil
}
