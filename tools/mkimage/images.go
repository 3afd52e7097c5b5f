package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Where things go in the images.
const (
	binPath     = "/usr/local/bin/mdag"
	ortDir      = "/usr/local/lib/onnxruntime"
	ortPath     = ortDir + "/libonnxruntime.so.1"
	runnerDir   = "/opt/mdag/runners/torch"
	runnerEntry = runnerDir + "/runner.py"
	uid         = 65532
	sourceURL   = "https://github.com/mdag/mdag"
	// ortVersion is tools/ort-fetch.sh's pin (npm onnxruntime-node).
	ortVersion = "1.30.0"
)

// runnerPackages are the Debian packages the torch runner imports
// (runners/torch: grpc, torch, torchvision for torchvision: model specs,
// google.protobuf, numpy through torch); their dependency closure comes
// with them.
var runnerPackages = []string{"python3", "python3-torch", "python3-torchvision", "python3-grpcio", "python3-protobuf", "python3-numpy"}

// runnerFollow says which packages of the runner's dependency closure
// come whole: Python's (python3*, libpython3*) and the data they read
// (time zones, MIME types); any other package is left out, and the
// shared libraries the included ELF files link come through ldd, file
// by file (HostLibraries).
func runnerFollow(name string) bool {
	switch name {
	case "tzdata", "media-types", "mime-support", "readline-common", "libpython3-stdlib":
		return true
	}
	return strings.HasPrefix(name, "python3") || strings.HasPrefix(name, "libpython3")
}

// cvData are files the full build's CPU ops open at run time (modules/cv:
// haar-face's default cascade, opencv-data).
var cvData = []string{"/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml"}

// sourceStamp is the binary's buildSource: "src-" and 16 hex digits of
// the sha256 of `git ls-files -s` over the files that go into the binary
// (all tracked files but deploy/, docs/, tools/ (the build's own tools,
// this one among them: none is in the binary), the top-level *.md and the
// Go tests: what a commit that pins image digests, edits docs or the image
// builder or adds a test changes), "+dirty" when
// those differ from HEAD or untracked files are among them.
func sourceStamp(repo string) (string, error) {
	spec := []string{"--", ".", ":(exclude)deploy", ":(exclude)docs", ":(exclude)tools", ":(exclude,top,glob)*.md", ":(exclude)build", ":(exclude,glob)**/*_test.go"}
	out, err := gitOut(repo, append([]string{"ls-files", "-s"}, spec...)...)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(out)
	stamp := "src-" + hex.EncodeToString(sum[:8])
	status, err := gitOut(repo, append([]string{"status", "--porcelain", "--untracked-files=all"}, spec...)...)
	if err != nil {
		return "", err
	}
	if len(bytes.TrimSpace(status)) > 0 {
		stamp += "+dirty"
	}
	return stamp, nil
}

func gitOut(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s in %s: %v: %s", strings.Join(args, " "), repo, err, stderr.String())
	}
	return out, nil
}

// buildBinaries builds bin/mdag and bin/mdag-lean for the images under
// dir: -trimpath -buildvcs=false, the source stamp as buildSource, the
// lean build with lp_solve's libraries static (as make lean).
func buildBinaries(repo, dir, stamp string) (full, lean string, err error) {
	full, lean = filepath.Join(dir, "mdag"), filepath.Join(dir, "mdag-lean")
	ld := "-X main.buildSource=" + stamp
	for _, b := range []struct {
		out, tags, cgoLD string
	}{{full, "", "-lcolamd -lm"}, {lean, "lean", "-l:libcolamd.a -l:libsuitesparseconfig.a -lm"}} {
		args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags", ld, "-o", b.out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		cmd := exec.Command("go", append(args, "./cmd/mdag")...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-g -O2 -I/usr/include/lpsolve", "CGO_LDFLAGS="+b.cgoLD)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return full, lean, nil
}

// baseTree is what every image built from scratch holds: the merged-/usr
// links, /etc/passwd and /etc/group with root and nonroot (65532), an
// empty /tmp (1777, the only world-writable path), the CA bundle,
// os-release, nsswitch.conf.
func baseTree(c *collector) error {
	t := c.t
	for _, d := range mergedDirs {
		if err := t.Symlink("/"+d, "usr/"+d, "merged /usr"); err != nil {
			return err
		}
	}
	files := map[string]string{
		"/etc/passwd":        "root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin\n",
		"/etc/group":         "root:x:0:\nnonroot:x:65532:\n",
		"/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
	}
	for p, s := range files {
		if err := t.Data(p, []byte(s), 0o644, "mkimage"); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{{"/tmp", 0o777 | os.ModeSticky}, {"/root", 0o700}, {"/etc/ssl/certs", 0o755}} {
		if err := t.Dir(d.p, d.mode, "mkimage"); err != nil {
			return err
		}
	}
	if err := t.Symlink("/etc/os-release", "../usr/lib/os-release", "base-files"); err != nil {
		return err
	}
	if err := c.Host("/usr/lib/os-release"); err != nil {
		return err
	}
	return caBundle(c)
}

// caBundle writes /etc/ssl/certs/ca-certificates.crt as
// update-ca-certificates does from the package's certificates that
// /etc/ca-certificates.conf enables, each verified against
// ca-certificates' md5 sums (the bundle itself is made by the package's
// postinst, so dpkg has no sum for it).
func caBundle(c *collector) error {
	pkg, ok := c.db.pkgs["ca-certificates"]
	if !ok {
		return fmt.Errorf("package ca-certificates is not installed (make deps)")
	}
	conf, err := os.ReadFile(filepath.Join(c.db.root, "etc/ca-certificates.conf"))
	if err != nil {
		return err
	}
	var certs []string
	for _, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") {
			continue
		}
		certs = append(certs, "/usr/share/ca-certificates/"+line)
	}
	sort.Strings(certs)
	var bundle bytes.Buffer
	for _, p := range certs {
		if err := c.db.Verify(pkg, p); err != nil {
			return fmt.Errorf("CA bundle: %w", err)
		}
		b, err := os.ReadFile(filepath.Join(c.db.root, p))
		if err != nil {
			return err
		}
		bundle.Write(b)
		if !bytes.HasSuffix(b, []byte("\n")) {
			bundle.WriteByte('\n')
		}
	}
	if len(certs) == 0 {
		return fmt.Errorf("CA bundle: /etc/ca-certificates.conf enables no certificate")
	}
	if err := c.t.Data("/etc/ssl/certs/ca-certificates.crt", bundle.Bytes(), 0o644, "ca-certificates"); err != nil {
		return err
	}
	return c.use(pkg)
}

// statusD writes /var/lib/dpkg/status.d/<package>, a stanza each (as
// distroless images do), for scanners that read the image's packages.
func statusD(t *tree, pkgs []*debPackage) error {
	for _, p := range pkgs {
		s := fmt.Sprintf("Package: %s\nStatus: install ok installed\nArchitecture: %s\nVersion: %s\n", p.Name, p.Arch, p.Version)
		if err := t.Data("/var/lib/dpkg/status.d/"+p.Name, []byte(s), 0o644, "mkimage"); err != nil {
			return err
		}
	}
	return nil
}

// labels are the OCI annotations of an image's config.
func labels(name, stamp, title string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.version":     stamp,
		"org.opencontainers.image.licenses":    "NOASSERTION",
		"org.opencontainers.image.title":       name,
		"org.opencontainers.image.description": title,
	}
}

func mdagConfig(name, stamp, title string) v1.Config {
	return v1.Config{
		User:       fmt.Sprintf("%d:%d", uid, uid),
		Entrypoint: []string{binPath},
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
			"MDAG_ORT_LIB=" + ortPath},
		WorkingDir: "/tmp",
		Labels:     labels(name, stamp, title),
	}
}

// mdagImage is mdag (full) or mdag-lean: the binary's ldd closure and
// ONNX Runtime's (verified Debian files), the base, then a layer with
// the binary and ONNX Runtime (sha256-pinned by tools/ort-fetch.sh).
func mdagImage(db *dpkgDB, name, bin, ort, stamp string, data []string) (spec, *collector, []spdxPackage, error) {
	deb := newTree()
	c := newCollector(db, deb)
	fail := func(err error) (spec, *collector, []spdxPackage, error) {
		return spec{}, nil, nil, fmt.Errorf("image %s: %w", name, err)
	}
	if err := baseTree(c); err != nil {
		return fail(err)
	}
	for _, elf := range []string{bin, ort} {
		libs, err := Libraries(elf)
		if err != nil {
			return fail(err)
		}
		for _, l := range libs {
			if err := c.Host(l); err != nil {
				return fail(fmt.Errorf("%s (a library of %s): %w", l, elf, err))
			}
		}
	}
	for _, d := range data {
		if err := c.Host(d); err != nil {
			return fail(err)
		}
	}
	if err := statusD(deb, c.Packages()); err != nil {
		return fail(err)
	}
	app := newTree()
	if err := app.File(binPath, bin, 0o755, "the mdag binary"); err != nil {
		return fail(err)
	}
	if err := app.File(ortPath, ort, 0o644, "ONNX Runtime"); err != nil {
		return fail(err)
	}
	ortSum, err := fileSHA256(ort)
	if err != nil {
		return fail(err)
	}
	other := []spdxPackage{{Name: "onnxruntime", SPDXID: spdxID("npm", "onnxruntime-node-"+ortVersion), VersionInfo: ortVersion,
		DownloadLocation: "https://registry.npmjs.org/onnxruntime-node/-/onnxruntime-node-" + ortVersion + ".tgz",
		LicenseConcluded: "NOASSERTION", LicenseDeclared: "MIT", CopyrightText: "NOASSERTION",
		Checksums:    []spdxChecksum{{Algorithm: "SHA256", Value: ortSum}},
		ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:npm/onnxruntime-node@" + ortVersion}},
		Comment:      "libonnxruntime.so.1 of the npm package, at " + ortPath}}
	title := "mdag, the full build (OpenCV ops, WHIP and RTSP ingest)"
	if name == "mdag-lean" {
		title = "mdag, the lean build (only the C runtime linked)"
	}
	return spec{Name: name, Config: mdagConfig(name, stamp, title), Layers: []namedTree{
		{"Debian files: the ldd closure of mdag and ONNX Runtime, CA certificates, passwd", deb},
		{"mdag and ONNX Runtime", app},
	}}, c, other, nil
}

// runnerTree is runners/torch's tracked files (tests left out) at
// /opt/mdag/runners/torch.
func runnerTree(repo string) (*tree, error) {
	out, err := gitOut(repo, "ls-files", "runners/torch")
	if err != nil {
		return nil, err
	}
	t := newTree()
	for _, f := range strings.Fields(string(out)) {
		base := filepath.Base(f)
		if !strings.HasSuffix(base, ".py") || strings.HasPrefix(base, "test_") {
			continue
		}
		if err := t.File(runnerDir+"/"+base, filepath.Join(repo, f), 0o644, "runners/torch"); err != nil {
			return nil, err
		}
	}
	if _, ok := t.entries[runnerEntry]; !ok {
		return nil, fmt.Errorf("%s: no runners/torch/runner.py tracked", repo)
	}
	return t, nil
}

func runnerConfig(stamp string, base *v1.Config) v1.Config {
	cfg := v1.Config{}
	if base != nil {
		cfg = *base.DeepCopy()
	}
	cfg.User = fmt.Sprintf("%d:%d", uid, uid)
	cfg.Entrypoint = nil
	cfg.Cmd = []string{"python3", runnerEntry}
	cfg.WorkingDir = "/tmp"
	env := []string{"HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"}
	if base == nil {
		env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	}
	keep := cfg.Env[:0:0]
	for _, e := range cfg.Env {
		k, _, _ := strings.Cut(e, "=")
		if k != "HOME" && k != "PYTHONDONTWRITEBYTECODE" && k != "PYTHONUNBUFFERED" {
			keep = append(keep, e)
		}
	}
	cfg.Env = append(keep, env...)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	for k, v := range labels("mdag-torch-runner", stamp, "mdag's PyTorch runner (runners/torch) for the kserve executor") {
		cfg.Labels[k] = v
	}
	return cfg
}

// runnerImage is mdag-torch-runner: Debian's python3 and PyTorch (CPU)
// with their dependency closure, the base, runners/torch. With a base
// image (--torch-base), only the runner's layer goes on it.
func runnerImage(db *dpkgDB, repo, stamp string, base v1.Image) (spec, *collector, error) {
	fail := func(err error) (spec, *collector, error) {
		return spec{}, nil, fmt.Errorf("image mdag-torch-runner: %w", err)
	}
	rt, err := runnerTree(repo)
	if err != nil {
		return fail(err)
	}
	if base != nil {
		cf, err := base.ConfigFile()
		if err != nil {
			return fail(fmt.Errorf("the torch base's config: %w", err))
		}
		if err := rt.Dir("/tmp", 0o777|os.ModeSticky, "mkimage"); err != nil {
			return fail(err)
		}
		return spec{Name: "mdag-torch-runner", Base: base, Config: runnerConfig(stamp, &cf.Config),
			Layers: []namedTree{{"runners/torch", rt}}}, nil, nil
	}
	deb := newTree()
	c := newCollector(db, deb)
	if err := baseTree(c); err != nil {
		return fail(err)
	}
	pkgs, err := db.Closure(runnerPackages, runnerFollow)
	if err != nil {
		return fail(err)
	}
	for _, p := range pkgs {
		if err := c.Package(p); err != nil {
			return fail(err)
		}
	}
	if err := c.HostLibraries(); err != nil {
		return fail(err)
	}
	if err := statusD(deb, c.Packages()); err != nil {
		return fail(err)
	}
	return spec{Name: "mdag-torch-runner", Config: runnerConfig(stamp, nil), Layers: []namedTree{
		{"Debian packages: python3, python3-torch, grpcio, protobuf, numpy and their dependencies", deb},
		{"runners/torch", rt},
	}}, c, nil
}

func fileSHA256(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// goBuildInfo is the Go modules of a binary, for its SBOM.
func goBuildInfo(bin string) (*debug.BuildInfo, error) {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return bi, nil
}
