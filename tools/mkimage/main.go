// Command mkimage builds mdag's container images reproducibly, in pure Go
// with go-containerregistry: no Docker daemon, no root, no user
// namespaces. make images runs it; docs/deploy.md ("Images") describes
// the images.
//
//	go run ./tools/mkimage build [--out build/images] [--only mdag,mdag-lean,mdag-torch-runner] [--torch-base REF|path.oci.tar] [--pin]
//	go run ./tools/mkimage pin [--digests build/images/digests.txt] [--kustomization ...] [--helm-values ...]
//	go run ./tools/mkimage push build/images/mdag.oci.tar REGISTRY/mdag:TAG
//
// build makes mdag (the full build), mdag-lean and mdag-torch-runner as
// OCI image layout archives under build/images (NAME.oci.tar), an SPDX
// 2.3 SBOM each (NAME.sbom.spdx.json) and digests.txt. The Debian files
// come from this host's dpkg database, each checked against its
// package's md5 sums; the binaries are built with -trimpath
// -buildvcs=false and a source stamp (main.buildSource). Every layer is a
// function of its files: tar entries sorted, mtime SOURCE_DATE_EPOCH (0
// when unset: HEAD's commit time would change with the commit that pins
// the digests), uid and gid 0, no xattrs, gzip with a zero header. Two
// builds of one tree give the same digests.
//
// pin writes the digests into deploy/kubernetes/base/kustomization.yaml
// (images: digest in place of newTag) and, where it exists,
// deploy/helm/mdag/values.yaml (images.<key>.digest), keeping comments.
//
// push copies an archive's image to a registry (remote.Write, credentials
// from the Docker config as docker login writes it).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// imageNames are the images build makes, in order.
var imageNames = []string{"mdag", "mdag-lean", "mdag-torch-runner"}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: mkimage build|pin|push|stamp [flags] (go doc ./tools/mkimage)")
		return 2
	}
	var err error
	switch args[0] {
	case "build":
		err = runBuild(args[1:], stdout, stderr)
	case "pin":
		err = runPin(args[1:], stdout, stderr)
	case "push":
		err = runPush(args[1:], stdout, stderr)
	case "stamp":
		var s string
		if s, err = sourceStamp("."); err == nil {
			fmt.Fprintln(stdout, s)
		}
	default:
		err = fmt.Errorf("unknown command %q: build, pin, push or stamp", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "mkimage %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// epochFromEnv is SOURCE_DATE_EPOCH, or 0.
func epochFromEnv() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

func runBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "build/images", "where the archives, SBOMs and digests.txt go")
	only := fs.String("only", strings.Join(imageNames, ","), "the images to build, comma-separated")
	torchBase := fs.String("torch-base", "", "put the runner on this image instead of Debian's CPU PyTorch: a registry reference or an OCI archive (path ending .tar)")
	ort := fs.String("ort-lib", "", "the ONNX Runtime library (default: tools/ort-fetch.sh --print-path)")
	pin := fs.Bool("pin", false, "then pin the digests in the manifests (mkimage pin)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	epoch, err := epochFromEnv()
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, n := range strings.Split(*only, ",") {
		if !slices.Contains(imageNames, n) {
			return fmt.Errorf("--only %s: no image %q (%s)", *only, n, strings.Join(imageNames, ", "))
		}
		want[n] = true
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(*out, ".work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	stamp, err := sourceStamp(".")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mkimage: source %s, epoch %d\n", stamp, epoch.Unix())
	if *ort == "" {
		p, err := exec.Command("tools/ort-fetch.sh", "--print-path").Output()
		if err != nil {
			return fmt.Errorf("tools/ort-fetch.sh --print-path: %w", err)
		}
		*ort = strings.TrimSpace(string(p))
	}
	if _, err := os.Stat(*ort); err != nil {
		return fmt.Errorf("ONNX Runtime: %w (make ort)", err)
	}
	t0 := time.Now()
	full, lean, err := buildBinaries(".", filepath.Join(*out, "bin"), stamp)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mkimage: binaries built in %.1fs\n", time.Since(t0).Seconds())
	q, err := queryHost()
	if err != nil {
		return err
	}
	db, err := loadDpkg("/", q)
	if err != nil {
		return err
	}
	var bs []*built
	for _, n := range imageNames {
		if !want[n] {
			continue
		}
		t0 := time.Now()
		b, err := buildOne(db, n, full, lean, *ort, *torchBase, stamp, *out, work, epoch)
		if err != nil {
			return err
		}
		bs = append(bs, b)
		fmt.Fprintf(stdout, "mkimage: %-18s %s  %6.1f MiB compressed, %6.1f MiB uncompressed (%.1fs)\n", n, b.Digest,
			float64(b.Compressed)/(1<<20), float64(b.Uncompressed)/(1<<20), time.Since(t0).Seconds())
	}
	// digests.txt keeps the images of earlier builds this one did not
	// redo (--only), where their archives are still there.
	dpath := filepath.Join(*out, "digests.txt")
	all := map[string]string{}
	if b, err := os.ReadFile(dpath); err == nil {
		if prev, err := parseDigests(b); err == nil {
			for n, d := range prev {
				if _, err := os.Stat(filepath.Join(*out, n+".oci.tar")); err == nil {
					all[n] = d
				}
			}
		}
	}
	for _, b := range bs {
		all[b.Name] = b.Digest.String()
	}
	if err := os.WriteFile(dpath, digestsFile(all), 0o644); err != nil {
		return err
	}
	if want["mdag-torch-runner"] {
		// what the runner is built on: pin pins only a CUDA one (pin.go)
		base := debianRunner
		if *torchBase != "" {
			base = *torchBase
		}
		if err := os.WriteFile(filepath.Join(*out, "mdag-torch-runner.base"), []byte(base+"\n"), 0o644); err != nil {
			return err
		}
	}
	if *pin && strings.Contains(stamp, "+dirty") {
		return fmt.Errorf("not pinning: the images were built from a tree with uncommitted changes (%s); commit, then make images", stamp)
	}
	fmt.Fprintf(stdout, "mkimage: %s written; built in %.1fs\n", dpath, time.Since(start).Seconds())
	if *pin {
		return runPin([]string{"--digests", dpath}, stdout, stderr)
	}
	return nil
}

// buildOne makes one image and writes its archive and SBOM.
func buildOne(db *dpkgDB, n, full, lean, ort, torchBase, stamp, out, work string, epoch time.Time) (*built, error) {
	var (
		s     spec
		c     *collector
		other []spdxPackage
		bin   string
		err   error
	)
	switch n {
	case "mdag":
		bin = full
		s, c, other, err = mdagImage(db, n, full, ort, stamp, cvData)
	case "mdag-lean":
		bin = lean
		s, c, other, err = mdagImage(db, n, lean, ort, stamp, nil)
	case "mdag-torch-runner":
		var base v1.Image
		if torchBase != "" {
			if base, err = loadBase(torchBase, work); err != nil {
				return nil, err
			}
			d, err := base.Digest()
			if err != nil {
				return nil, err
			}
			other = append(other, spdxPackage{Name: torchBase, SPDXID: spdxID("base", d.Hex), VersionInfo: d.String(),
				DownloadLocation: "NOASSERTION", LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", CopyrightText: "NOASSERTION",
				Checksums: []spdxChecksum{{Algorithm: "SHA256", Value: d.Hex}}, Comment: "the base image (--torch-base); its contents are not listed", Purpose: "CONTAINER"})
		}
		s, c, err = runnerImage(db, ".", stamp, base)
	}
	if err != nil {
		return nil, err
	}
	b, err := assemble(s, work, epoch)
	if err != nil {
		return nil, err
	}
	if err := writeArchive(b.Image, n+":"+strings.TrimSuffix(stamp, "+dirty"), filepath.Join(out, n+".oci.tar"), epoch); err != nil {
		return nil, err
	}
	in := sbomInput{Image: n, Version: stamp, Digest: b.Digest.String(), Other: other}
	if c != nil {
		in.Debs = c.Packages()
	}
	if bin != "" {
		if in.Go, err = goBuildInfo(bin); err != nil {
			return nil, err
		}
	}
	sb, err := SBOM(in, epoch.Format(time.RFC3339))
	if err != nil {
		return nil, err
	}
	return b, os.WriteFile(filepath.Join(out, n+".sbom.spdx.json"), sb, 0o644)
}

// loadBase reads the --torch-base image: an OCI archive (a path ending
// .tar) or a registry reference (linux/amd64).
func loadBase(ref, work string) (v1.Image, error) {
	if strings.HasSuffix(ref, ".tar") {
		img, err := readArchive(ref, work)
		if err != nil {
			return nil, fmt.Errorf("--torch-base %s: %w", ref, err)
		}
		return img, nil
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("--torch-base %s: %w", ref, err)
	}
	img, err := remote.Image(r, remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	if err != nil {
		return nil, fmt.Errorf("--torch-base %s: %w", ref, err)
	}
	return img, nil
}

func runPush(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	fs.SetOutput(stderr)
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("want ARCHIVE REF (build/images/mdag.oci.tar REGISTRY/mdag:TAG), got %q", fs.Args())
	}
	work, err := os.MkdirTemp("", "mkimage-push-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	d, err := push(fs.Arg(0), fs.Arg(1), work, *insecure)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s@%s\n", fs.Arg(1), d)
	return nil
}

// push writes the archive's image to ref and returns its digest.
func push(archive, ref, work string, insecure bool) (v1.Hash, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return v1.Hash{}, err
	}
	img, err := readArchive(archive, work)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Write(r, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s to %s: %w", archive, ref, err)
	}
	return img.Digest()
}
