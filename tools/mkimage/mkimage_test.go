package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"gopkg.in/yaml.v3"
)

var epoch0 = time.Unix(0, 0).UTC()

// hostFile writes a file with a given mtime, for trees built from "host" files.
func hostFile(t *testing.T, dir, name, content string, mtime time.Time) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLayerDeterministic: the same files added in another order, from
// host files with other mtimes, give the same layer bytes; the tar is
// sorted, with mtime the epoch, uid and gid 0, no names, parents made.
func TestLayerDeterministic(t *testing.T) {
	build := func(order []int, mtime time.Time) []byte {
		dir := t.TempDir()
		a := hostFile(t, dir, "a", "alpha", mtime)
		b := hostFile(t, dir, "b", "beta", mtime.Add(time.Hour))
		adds := []func(*tree) error{
			func(tr *tree) error { return tr.File("/usr/bin/a", a, 0o755, "test") },
			func(tr *tree) error { return tr.File("/etc/b", b, 0o644, "test") },
			func(tr *tree) error { return tr.Symlink("/usr/bin/c", "a", "test") },
			func(tr *tree) error { return tr.Dir("/tmp", 0o777|os.ModeSticky, "test") },
		}
		tr := newTree()
		for _, i := range order {
			if err := adds[i](tr); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if err := tr.Write(&buf, epoch0); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	one := build([]int{0, 1, 2, 3}, time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC))
	two := build([]int{3, 2, 1, 0}, time.Date(2024, 6, 7, 8, 9, 10, 0, time.UTC))
	if !bytes.Equal(one, two) {
		t.Fatalf("two builds of the same files differ (%d and %d bytes)", len(one), len(two))
	}
	zr, err := gzip.NewReader(bytes.NewReader(one))
	if err != nil {
		t.Fatal(err)
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		t.Errorf("gzip header: mtime %v, name %q; want none", zr.ModTime, zr.Name)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(epoch0) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || len(h.PAXRecords) != 0 || len(h.Xattrs) != 0 { //nolint:staticcheck // Xattrs: none may be there
			t.Errorf("%s: mtime %v uid %d gid %d uname %q gname %q pax %v: want the epoch, 0, 0, no names, no PAX records", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname, h.PAXRecords)
		}
		if h.Name == "tmp/" && h.Mode != 0o1777 {
			t.Errorf("tmp/: mode %o, want 1777", h.Mode)
		}
		if h.Name == "usr/bin/a" && h.Mode != 0o755 {
			t.Errorf("usr/bin/a: mode %o, want 755 (as added, not the host file's 640)", h.Mode)
		}
	}
	want := []string{"etc/", "etc/b", "tmp/", "usr/", "usr/bin/", "usr/bin/a", "usr/bin/c"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("entries %q, want %q", names, want)
	}
	if three := build([]int{0, 1, 2}, epoch0); bytes.Equal(one, three) {
		t.Error("a layer without /tmp has the same bytes")
	}
}

func TestTreeConflict(t *testing.T) {
	tr := newTree()
	if err := tr.Data("/etc/x", []byte("1"), 0o644, "first"); err != nil {
		t.Fatal(err)
	}
	if err := tr.Data("/etc/x", []byte("1"), 0o644, "same"); err != nil {
		t.Errorf("the same content twice: %v", err)
	}
	err := tr.Data("/etc/x", []byte("2"), 0o644, "second")
	if err == nil || !strings.Contains(err.Error(), "/etc/x: first and second") {
		t.Errorf("other content at the same path: %v, want an error naming both", err)
	}
	if err := tr.Data("/etc/x/y", []byte("1"), 0o644, "under a file"); err != nil {
		t.Fatal(err)
	}
	if err := tr.WriteTar(io.Discard, epoch0); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file under a file: %v, want an error", err)
	}
}

// fakeDpkg is a dpkg database under a temporary root: packages with
// files, md5sums, dependencies.
type fakeDpkg struct {
	root  string
	query strings.Builder
}

func newFakeDpkg(t *testing.T) *fakeDpkg {
	f := &fakeDpkg{root: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(f.root, "var/lib/dpkg/info"), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

// add installs a package with its files (path -> content); md5sums
// records them all. A content starting with "->" is a symlink.
func (f *fakeDpkg) add(t *testing.T, pkg, depends, provides string, files map[string]string) {
	t.Helper()
	var list, sums strings.Builder
	files["/usr/share/doc/"+pkg+"/copyright"] = "Copyright " + pkg
	for p, content := range files {
		hp := filepath.Join(f.root, p)
		if err := os.MkdirAll(filepath.Dir(hp), 0o755); err != nil {
			t.Fatal(err)
		}
		list.WriteString(p + "\n")
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, hp); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(hp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		s := md5.Sum([]byte(content))
		sums.WriteString(hex.EncodeToString(s[:]) + "  " + strings.TrimPrefix(p, "/") + "\n")
	}
	info := filepath.Join(f.root, "var/lib/dpkg/info", pkg)
	if err := os.WriteFile(info+".list", []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info+".md5sums", []byte(sums.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	f.query.WriteString(pkg + "\tamd64\t1.0-1\tinstall ok installed\t, " + depends + "\t" + provides + "\n")
}

func (f *fakeDpkg) load(t *testing.T) *dpkgDB {
	t.Helper()
	db, err := loadDpkg(f.root, []byte(f.query.String()))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestVerifyModified: a copied file that differs from its package's md5
// sum fails the build, naming the file and the package.
func TestVerifyModified(t *testing.T) {
	f := newFakeDpkg(t)
	f.add(t, "libfoo1", "", "", map[string]string{"/usr/lib/x86_64-linux-gnu/libfoo.so.1.2": "foo", "/usr/lib/x86_64-linux-gnu/libfoo.so.1": "->libfoo.so.1.2"})
	db := f.load(t)
	c := newCollector(db, newTree())
	hostFile(t, f.root, "libstray.so", "x", epoch0)
	if err := c.Host("/libstray.so"); err == nil || !strings.Contains(err.Error(), "/libstray.so: no installed package ships it") {
		t.Errorf("a file of no package: %v, want an error naming it", err)
	}
	pkg := db.pkgs["libfoo1"]
	if err := db.Verify(pkg, "/usr/lib/x86_64-linux-gnu/libfoo.so.1.2"); err != nil {
		t.Fatalf("an unchanged file: %v", err)
	}
	if err := c.Package(pkg); err != nil {
		t.Fatalf("an unchanged package: %v", err)
	}
	if e := c.t.entries["/usr/lib/x86_64-linux-gnu/libfoo.so.1"]; e == nil || e.kind != tar.TypeSymlink || e.link != "libfoo.so.1.2" {
		t.Errorf("the symlink: %+v", e)
	}
	if c.t.entries["/usr/share/doc/libfoo1/copyright"] == nil {
		t.Error("no copyright file")
	}
	if err := os.WriteFile(filepath.Join(f.root, "usr/lib/x86_64-linux-gnu/libfoo.so.1.2"), []byte("foO"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := db.Verify(pkg, "/usr/lib/x86_64-linux-gnu/libfoo.so.1.2")
	if !errors.Is(err, errModified) || !strings.Contains(err.Error(), "/usr/lib/x86_64-linux-gnu/libfoo.so.1.2 (package libfoo1 1.0-1)") {
		t.Errorf("a modified file: %v, want errModified naming the file and package", err)
	}
	if err := newCollector(db, newTree()).Package(pkg); !errors.Is(err, errModified) {
		t.Errorf("a package with a modified file: %v, want errModified", err)
	}
	if err := db.Verify(pkg, "/usr/lib/x86_64-linux-gnu/libbar.so"); err == nil || !strings.Contains(err.Error(), "no md5 sum recorded") {
		t.Errorf("a file without a sum: %v", err)
	}
}

func TestClosure(t *testing.T) {
	f := newFakeDpkg(t)
	f.add(t, "python3", "python3.11 (>= 3.11.2-1~), libpython3-stdlib", "python3-supported-min", map[string]string{"/usr/bin/python3": "->python3.11"})
	f.add(t, "python3.11", "libc6 (>= 2.34), media-types | mime-support", "", map[string]string{"/usr/bin/python3.11": "py"})
	f.add(t, "libpython3-stdlib", "libpython3.11-stdlib", "", map[string]string{})
	f.add(t, "libpython3.11-stdlib", "libblas.so.3", "", map[string]string{})
	f.add(t, "libopenblas0-pthread", "libc6", "libblas.so.3", map[string]string{})
	f.add(t, "mime-support", "", "", map[string]string{})
	f.add(t, "libc6", "", "", map[string]string{})
	f.add(t, "unrelated", "libc6", "", map[string]string{})
	db := f.load(t)
	pkgs, err := db.Closure([]string{"python3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pkgs {
		got = append(got, p.Name)
	}
	want := "libc6 libopenblas0-pthread libpython3-stdlib libpython3.11-stdlib mime-support python3 python3.11"
	if strings.Join(got, " ") != want {
		t.Errorf("closure %q, want %q", strings.Join(got, " "), want)
	}
	f.add(t, "broken", "libmissing1 | libmissing2", "", map[string]string{})
	follow, err := db.Closure([]string{"python3"}, func(n string) bool { return strings.HasPrefix(n, "python3") || n == "libpython3-stdlib" })
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, p := range follow {
		got = append(got, p.Name)
	}
	if want := "libpython3-stdlib python3 python3.11"; strings.Join(got, " ") != want {
		t.Errorf("closure following python3* and libpython3-stdlib: %q, want %q", strings.Join(got, " "), want)
	}
	if _, err := f.load(t).Closure([]string{"broken"}, nil); err == nil || !strings.Contains(err.Error(), `package broken depends on "libmissing1 | libmissing2"`) {
		t.Errorf("a dependency not installed: %v", err)
	}
}

func TestLddLine(t *testing.T) {
	for line, want := range map[string][2]string{
		"\tlinux-vdso.so.1 (0x00007ffd)":                              {"linux-vdso.so.1", ""},
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2d)": {"libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"},
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f2d9cf30000)":          {"/lib64/ld-linux-x86-64.so.2", ""},
		"\tlibfoo.so.1 => not found":                                  {"libfoo.so.1", "not found"},
	} {
		m := lddLine.FindStringSubmatch(line)
		if m == nil || m[1] != want[0] || m[2] != want[1] {
			t.Errorf("%q: %q, want %q", line, m, want)
		}
	}
	if imagePath("/lib/x86_64-linux-gnu/libc.so.6") != "/usr/lib/x86_64-linux-gnu/libc.so.6" || imagePath("/etc/x") != "/etc/x" || imagePath("/library") != "/library" {
		t.Error("imagePath: merged /usr")
	}
}

func TestSBOM(t *testing.T) {
	in := sbomInput{Image: "mdag", Version: "src-0123", Digest: "sha256:" + strings.Repeat("ab", 32),
		Debs: []*debPackage{{Name: "libc6", Version: "2.36-9+deb12u9", Arch: "amd64"}, {Name: "libavcodec59", Version: "7:5.1.6-0+deb12u1", Arch: "amd64"}},
		Go: &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/mdag/mdag", Version: "(devel)"},
			Deps: []*debug.Module{{Path: "github.com/pion/webrtc/v4", Version: "v4.1.0", Sum: "h1:x"}}}}
	a, err := SBOM(in, "1970-01-01T00:00:00Z")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SBOM(in, "1970-01-01T00:00:00Z")
	if !bytes.Equal(a, b) {
		t.Error("two SBOMs of one image differ")
	}
	var doc spdxDoc
	if err := json.Unmarshal(a, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.DocumentNamespace != "https://github.com/mdag/mdag/spdx/mdag/sha256-"+strings.Repeat("ab", 32) {
		t.Errorf("version %q, namespace %q", doc.SPDXVersion, doc.DocumentNamespace)
	}
	found := map[string]string{}
	for _, p := range doc.Packages {
		for _, r := range p.ExternalRefs {
			found[r.Locator] = p.VersionInfo
		}
	}
	for _, w := range []string{"pkg:deb/debian/libc6@2.36-9+deb12u9?arch=amd64&distro=debian-12", "pkg:deb/debian/libavcodec59@7%3A5.1.6-0+deb12u1?arch=amd64&distro=debian-12",
		"pkg:golang/github.com/pion/webrtc/v4@v4.1.0", "pkg:golang/github.com/mdag/mdag@(devel)"} {
		if _, ok := found[w]; !ok {
			t.Errorf("no package %s in %v", w, found)
		}
	}
	if len(doc.Relationships) != len(doc.Packages) {
		t.Errorf("%d relationships for %d packages (DESCRIBES the image, CONTAINS each)", len(doc.Relationships), len(doc.Packages))
	}
	in.Digest = "sha256:" + strings.Repeat("cd", 32)
	c, _ := SBOM(in, "1970-01-01T00:00:00Z")
	if bytes.Equal(a, c) {
		t.Error("another digest, the same SBOM")
	}
	in.Digest = "latest"
	if _, err := SBOM(in, ""); err == nil {
		t.Error("a digest that is not sha256: no error")
	}
}

// smallImage is a two-layer image and its archive.
func smallImage(t *testing.T, dir string) (*built, string) {
	t.Helper()
	base := newTree()
	if err := base.Data("/etc/passwd", []byte("root:x:0:0::/:/nologin\n"), 0o644, "t"); err != nil {
		t.Fatal(err)
	}
	app := newTree()
	if err := app.Data("/usr/local/bin/app", []byte("#!/bin/true\n"), 0o755, "t"); err != nil {
		t.Fatal(err)
	}
	b, err := assemble(spec{Name: "small", Config: v1.Config{User: "65532:65532", Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "HOME=/root"}},
		Layers: []namedTree{{"base", base}, {"app", app}}}, dir, epoch0)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "small.oci.tar")
	if err := writeArchive(b.Image, "small:test", archive, epoch0); err != nil {
		t.Fatal(err)
	}
	return b, archive
}

// TestArchive: an image twice, the same digest and archive bytes; OCI
// media types; the archive reads back to the same digest.
func TestArchive(t *testing.T) {
	one, a1 := smallImage(t, t.TempDir())
	two, a2 := smallImage(t, t.TempDir())
	if one.Digest != two.Digest {
		t.Fatalf("digests %s and %s", one.Digest, two.Digest)
	}
	b1, _ := os.ReadFile(a1)
	b2, _ := os.ReadFile(a2)
	if !bytes.Equal(b1, b2) {
		t.Error("two archives of one image differ")
	}
	m, err := one.Image.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("media types %s, %s, %s: want OCI", m.MediaType, m.Config.MediaType, m.Layers[0].MediaType)
	}
	img, err := readArchive(a1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != one.Digest {
		t.Errorf("read back: %s, want %s", d, one.Digest)
	}
	cf, _ := img.ConfigFile()
	if !cf.Created.Time.Equal(epoch0) || cf.History[1].CreatedBy != "app" || !cf.History[1].Created.Time.Equal(epoch0) {
		t.Errorf("created %v, history %+v: want the epoch", cf.Created, cf.History)
	}
}

// TestPushPull pushes an archive to an in-process registry and pulls the
// same digest back.
func TestPushPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	b, archive := smallImage(t, t.TempDir())
	ref := u.Host + "/mdag/small:test"
	d, err := push(archive, ref, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	if d != b.Digest {
		t.Errorf("pushed %s, built %s", d, b.Digest)
	}
	r, _ := name.ParseReference(ref, name.Insecure)
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got != b.Digest {
		t.Errorf("pulled %s, pushed %s", got, b.Digest)
	}
	var out bytes.Buffer
	if code := run([]string{"push", "--insecure", archive, u.Host + "/mdag/small:cli"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "@"+b.Digest.String()) {
		t.Errorf("mkimage push: exit %d, %q", code, out.String())
	}
}

// TestTorchBase puts the runner's layer on a base image read from an OCI
// archive: the base's layers kept, one layer added, its config merged.
func TestTorchBase(t *testing.T) {
	dir := t.TempDir()
	baseBuilt, archive := smallImage(t, dir)
	base, err := loadBase(archive, dir)
	if err != nil {
		t.Fatal(err)
	}
	s, c, err := runnerImage(nil, "../..", "src-test", base)
	if err != nil {
		t.Fatal(err)
	}
	if c != nil {
		t.Error("a collector with a base image: no Debian files are added")
	}
	b, err := assemble(s, dir, epoch0)
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := b.Image.Layers()
	baseLayers, _ := baseBuilt.Image.Layers()
	if len(layers) != len(baseLayers)+1 {
		t.Fatalf("%d layers, want the base's %d and the runner's", len(layers), len(baseLayers))
	}
	for i, l := range baseLayers {
		want, _ := l.Digest()
		if got, _ := layers[i].Digest(); got != want {
			t.Errorf("layer %d: %s, want the base's %s", i, got, want)
		}
	}
	cf, _ := b.Image.ConfigFile()
	env := strings.Join(cf.Config.Env, " ")
	for _, w := range []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"} {
		if !strings.Contains(env, w) {
			t.Errorf("env %q lacks %s", env, w)
		}
	}
	if strings.Contains(env, "HOME=/root") || cf.Config.User != "65532:65532" || strings.Join(cf.Config.Cmd, " ") != "python3 "+runnerEntry || cf.Config.Labels["org.opencontainers.image.version"] != "src-test" {
		t.Errorf("config %+v", cf.Config)
	}
	rc, _ := layers[len(layers)-1].Uncompressed()
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "opt/mdag/runners/torch/runner.py") || strings.Contains(strings.Join(names, " "), "test_runner.py") {
		t.Errorf("the runner's layer: %q", names)
	}
}

func TestPin(t *testing.T) {
	digests := map[string]string{"mdag": "sha256:" + strings.Repeat("1", 64), "mdag-lean": "sha256:" + strings.Repeat("2", 64), "mdag-torch-runner": "sha256:" + strings.Repeat("3", 64)}
	in, err := os.ReadFile("testdata/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := editYAML(in, func(n *yaml.Node) error { return pinKustomization(n, digests, nil) })
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	for _, w := range []string{"  - name: mdag\n    newName: registry.example.com/mdag\n    digest: sha256:" + strings.Repeat("1", 64),
		"  - name: mdag-torch-runner\n    newName: registry.example.com/mdag-torch-runner\n    digest: sha256:" + strings.Repeat("3", 64),
		"# Replace with where your images are", "resources:\n  - namespace.yaml"} {
		if !strings.Contains(s, w) {
			t.Errorf("pinned kustomization lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, "newTag") {
		t.Errorf("newTag left:\n%s", s)
	}
	again, _ := editYAML(out, func(n *yaml.Node) error { return pinKustomization(n, digests, nil) })
	if !bytes.Equal(again, out) {
		t.Errorf("pinning twice changes the file:\n%s", again)
	}
	if _, err := editYAML(in, func(n *yaml.Node) error { return pinKustomization(n, map[string]string{"mdag": digests["mdag"]}, nil) }); err == nil || !strings.Contains(err.Error(), "mdag-torch-runner") {
		t.Errorf("a digest missing: %v", err)
	}
	vin, err := os.ReadFile("testdata/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vout, err := editYAML(vin, func(n *yaml.Node) error { return pinHelmValues(n, digests) })
	if err != nil {
		t.Fatal(err)
	}
	v := string(vout)
	for _, w := range []string{"  mdag:\n    repository: registry.example.com/mdag\n    tag: v0.1.0\n    digest: sha256:" + strings.Repeat("1", 64) + " # set by make images",
		"  lean:\n    repository: registry.example.com/mdag-lean\n    tag: v0.1.0\n    digest: sha256:" + strings.Repeat("2", 64),
		"torchRunner:\n    repository: registry.example.com/mdag-torch-runner\n    tag: v0.1.0\n    digest: sha256:" + strings.Repeat("3", 64),
		"# the full build: WHIP", "replicas: 1 # one coordinator per app"} {
		if !strings.Contains(v, w) {
			t.Errorf("pinned values lack %q:\n%s", w, v)
		}
	}
}

// TestKeepBlankLines: the blank lines between a file's sections survive a
// pin (yaml.v3 drops them when it encodes); when the edit adds or removes
// lines, the encoder's output is kept as it is.
func TestKeepBlankLines(t *testing.T) {
	in := "# top\na: {x: 1, d: \"\"}\n\n# b\nb: 2\n\n\nc: 3\n"
	out, err := editYAML([]byte(in), func(n *yaml.Node) error { set(lookup(n, "a"), "d", "sha256:1"); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := "# top\na: {x: 1, d: 'sha256:1'}\n\n# b\nb: 2\n\n\nc: 3\n"; string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	out, err = editYAML([]byte(in), func(n *yaml.Node) error { set(n, "e", "4"); return nil })
	if err != nil || !strings.HasSuffix(string(out), "c: 3\ne: \"4\"\n") {
		t.Errorf("a line added: %v\n%s", err, out)
	}
}

// TestSourceStamp: the stamp changes with the sources, not with deploy/,
// docs/ or the top-level *.md; untracked or changed sources add +dirty.
func TestSourceStamp(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stamp := func() string {
		t.Helper()
		s, err := sourceStamp(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	git("init", "-q")
	write("main.go", "package main\n")
	write("examples/a/README.md", "embedded\n")
	write("deploy/k.yaml", "newTag: v1\n")
	write("README.md", "readme\n")
	git("add", ".")
	git("commit", "-qm", "one")
	s1 := stamp()
	if !strings.HasPrefix(s1, "src-") || strings.HasSuffix(s1, "+dirty") {
		t.Fatalf("stamp %q", s1)
	}
	write("deploy/k.yaml", "digest: sha256:1\n")
	write("README.md", "readme 2\n")
	write("tools/mkimage/pin.go", "package main\n")
	if s := stamp(); s != s1 {
		t.Errorf("deploy/ and README.md changed, a file under tools/ added: stamp %s, want %s", s, s1)
	}
	write("main_test.go", "package main\n")
	git("add", ".")
	git("commit", "-qam", "pin")
	if s := stamp(); s != s1 {
		t.Errorf("a commit of deploy/, README.md and a test: stamp %s, want %s", s, s1)
	}
	write("examples/a/README.md", "embedded 2\n")
	if s := stamp(); s != s1+"+dirty" {
		t.Errorf("an embedded README changed: %s, want %s+dirty", s, s1)
	}
	git("commit", "-qam", "two")
	if s := stamp(); s == s1 || strings.HasSuffix(s, "+dirty") {
		t.Errorf("a source committed: %s, want a new clean stamp (was %s)", s, s1)
	}
	write("new.go", "package main\n")
	if s := stamp(); !strings.HasSuffix(s, "+dirty") {
		t.Errorf("an untracked source: %s, want +dirty", s)
	}
}

// TestPinRunnerBase: a runner built on Debian's CPU PyTorch is not pinned
// (the manifests run it with --device=cuda): its entries keep their tag
// while the mdag images get their digests; one built on a CUDA base
// (--torch-base) is pinned.
func TestPinRunnerBase(t *testing.T) {
	for _, tc := range []struct {
		base      string
		runnerPin bool
	}{{debianRunner, false}, {"", false}, {"docker.io/pytorch/pytorch@sha256:" + strings.Repeat("9", 64), true}} {
		dir := t.TempDir()
		kust, vals := filepath.Join(dir, "kustomization.yaml"), filepath.Join(dir, "values.yaml")
		for src, dst := range map[string]string{"testdata/kustomization.yaml": kust, "testdata/values.yaml": vals} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		digests := map[string]string{"mdag": "sha256:" + strings.Repeat("1", 64), "mdag-lean": "sha256:" + strings.Repeat("2", 64), "mdag-torch-runner": "sha256:" + strings.Repeat("3", 64)}
		if err := os.WriteFile(filepath.Join(dir, "digests.txt"), digestsFile(digests), 0o644); err != nil {
			t.Fatal(err)
		}
		if tc.base != "" {
			if err := os.WriteFile(filepath.Join(dir, "mdag-torch-runner.base"), []byte(tc.base+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var out strings.Builder
		if err := runPin([]string{"--digests", filepath.Join(dir, "digests.txt"), "--kustomization", kust, "--helm-values", vals}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		k, _ := os.ReadFile(kust)
		v, _ := os.ReadFile(vals)
		runner := strings.Repeat("3", 64)
		if got := strings.Contains(string(k), runner) && strings.Contains(string(v), runner); got != tc.runnerPin {
			t.Errorf("base %q: runner pinned %v, want %v\n%s\n%s", tc.base, got, tc.runnerPin, k, v)
		}
		if !strings.Contains(string(k), strings.Repeat("1", 64)) || !strings.Contains(string(v), strings.Repeat("2", 64)) {
			t.Errorf("base %q: the mdag images are not pinned:\n%s\n%s", tc.base, k, v)
		}
		if !tc.runnerPin && (!strings.Contains(string(k), "newTag: v0.1.0") || !strings.Contains(out.String(), "--torch-base")) {
			t.Errorf("base %q: the runner's tag is gone, or pin did not say how to pin it: %s", tc.base, out.String())
		}
	}
}
