package main

import (
	"bufio"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// dpkgDB is the host's dpkg database, read once: which package owns each
// path (the *.list files, as dpkg -S reads them), each installed
// package's version, architecture and dependencies (dpkg-query), and the
// md5 sums each package recorded for its files (*.md5sums, conffiles).
type dpkgDB struct {
	root  string // "/" on the host; a test's fake root
	info  string // root/var/lib/dpkg/info
	owner map[string][]string
	pkgs  map[string]*debPackage
	// provides maps a virtual package name to the installed packages
	// that provide it.
	provides map[string][]string
}

// debPackage is one installed Debian package.
type debPackage struct {
	Name, Version, Arch string
	Depends             string // Depends and Pre-Depends, joined by ", "
	infoName            string // its files' name in dpkg's info: name or name:arch
	md5                 map[string]string
}

// errModified is a copied file whose content is not what its package installed.
var errModified = errors.New("differs from what its package installed")

// loadDpkg reads the database under root (normally "/"). The package
// fields come from query, dpkg-query's output with the format of
// dpkgQueryFormat (a test passes its own).
func loadDpkg(root string, query []byte) (*dpkgDB, error) {
	db := &dpkgDB{root: root, info: filepath.Join(root, "var/lib/dpkg/info"), owner: map[string][]string{},
		pkgs: map[string]*debPackage{}, provides: map[string][]string{}}
	sc := bufio.NewScanner(strings.NewReader(string(query)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 6 {
			return nil, fmt.Errorf("dpkg-query: line %q: %d fields, want 6", sc.Text(), len(f))
		}
		if f[3] != "install ok installed" {
			continue
		}
		p := &debPackage{Name: f[0], Arch: f[1], Version: f[2], Depends: strings.Trim(f[4], ", ")}
		p.infoName = p.Name
		if _, err := os.Stat(filepath.Join(db.info, p.Name+":"+p.Arch+".list")); err == nil {
			p.infoName = p.Name + ":" + p.Arch
		}
		db.pkgs[p.Name] = p
		for _, v := range splitList(f[5]) {
			db.provides[v] = append(db.provides[v], p.Name)
		}
	}
	lists, err := filepath.Glob(filepath.Join(db.info, "*.list"))
	if err != nil {
		return nil, err
	}
	for _, l := range lists {
		name := strings.TrimSuffix(filepath.Base(l), ".list")
		pkg, _, _ := strings.Cut(name, ":")
		if _, ok := db.pkgs[pkg]; !ok {
			continue
		}
		b, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		for _, f := range strings.Split(string(b), "\n") {
			if f != "" && f != "/." {
				db.owner[f] = append(db.owner[f], pkg)
			}
		}
	}
	return db, nil
}

// dpkgQueryFormat is what loadDpkg parses: one package a line.
const dpkgQueryFormat = `${Package}\t${Architecture}\t${Version}\t${Status}\t${Pre-Depends}, ${Depends}\t${Provides}\n`

// queryHost runs dpkg-query for every package of the host.
func queryHost() ([]byte, error) {
	out, err := exec.Command("dpkg-query", "-W", "-f", dpkgQueryFormat).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query -W: %w", err)
	}
	return out, nil
}

// splitList splits a Provides field into package names (versions and
// architecture qualifiers dropped).
func splitList(s string) []string {
	var names []string
	for _, f := range strings.Split(s, ",") {
		if n := depName(f); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// depName is the package name of one dependency: "libc6 (>= 2.34)" and
// "python3:any" give libc6 and python3.
func depName(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " ("); i >= 0 {
		s = s[:i]
	}
	s, _, _ = strings.Cut(s, ":")
	return s
}

// Owner is the installed package that ships path p (an absolute host
// path), trying the merged-/usr spellings (/lib/x and /usr/lib/x name the
// same file on Debian 12, and dpkg records whichever the package ships).
func (db *dpkgDB) Owner(p string) (*debPackage, string, error) {
	for _, alt := range usrAliases(p) {
		if owners := db.owner[alt]; len(owners) > 0 {
			if len(owners) > 1 {
				sort.Strings(owners)
			}
			return db.pkgs[owners[0]], alt, nil
		}
	}
	return nil, "", fmt.Errorf("%s: no installed package ships it (dpkg -S)", p)
}

// usrAliases are p's spellings under merged /usr.
func usrAliases(p string) []string {
	alts := []string{p}
	for _, d := range mergedDirs {
		if strings.HasPrefix(p, "/"+d+"/") {
			alts = append(alts, "/usr"+p)
		}
		if strings.HasPrefix(p, "/usr/"+d+"/") {
			alts = append(alts, strings.TrimPrefix(p, "/usr"))
		}
	}
	return alts
}

// mergedDirs are the top directories Debian 12 links into /usr.
var mergedDirs = []string{"bin", "sbin", "lib", "lib64"}

// imagePath is where host path p goes in an image: under /usr for the
// merged directories, which the image links as Debian 12 does.
func imagePath(p string) string {
	for _, d := range mergedDirs {
		if p == "/"+d || strings.HasPrefix(p, "/"+d+"/") {
			return "/usr" + p
		}
	}
	return p
}

// sums reads the package's md5sums and conffiles sums, once.
func (db *dpkgDB) sums(p *debPackage) (map[string]string, error) {
	if p.md5 != nil {
		return p.md5, nil
	}
	m := map[string]string{}
	f := filepath.Join(db.info, p.infoName+".md5sums")
	b, err := os.ReadFile(f)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		sum, file, ok := strings.Cut(line, "  ")
		if ok {
			m["/"+file] = sum
		}
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Conffiles}", p.Name).Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				m[f[0]] = f[1]
			}
		}
	}
	p.md5 = m
	return m, nil
}

// Verify checks the host file at dpkg path p (as the package lists it)
// against the md5 sum its package recorded: a file changed on the host
// fails the build, naming the file and the package.
func (db *dpkgDB) Verify(p *debPackage, file string) error {
	sums, err := db.sums(p)
	if err != nil {
		return err
	}
	want, ok := sums[file]
	if !ok {
		return fmt.Errorf("%s (package %s): no md5 sum recorded in %s", file, p.Name, filepath.Join(db.info, p.infoName+".md5sums"))
	}
	f, err := os.Open(filepath.Join(db.root, file))
	if err != nil {
		return err
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s (package %s %s): md5 %s, want %s: %w", file, p.Name, p.Version, got, want, errModified)
	}
	return nil
}

// Closure is the packages names need, names included: Pre-Depends and
// Depends, recursively, each alternative's first installed choice
// (virtual packages through Provides). A dependency with no installed
// choice is an error naming the package that needs it.
//
// follow, when not nil, says which packages' own dependencies are
// followed: the runner follows Python packages' and leaves shared-library
// packages to ldd (their libraries come through HostLibraries, without
// the rest of their dependency trees: Debian's torchvision depends on
// OpenCV and ffmpeg, which depend on Mesa, Qt, LLVM, GDAL...).
func (db *dpkgDB) Closure(names []string, follow func(string) bool) ([]*debPackage, error) {
	seen := map[string]bool{}
	var out []*debPackage
	var visit func(name, from string) error
	visit = func(name, from string) error {
		if seen[name] {
			return nil
		}
		p, ok := db.pkgs[name]
		if !ok {
			return fmt.Errorf("package %s (needed by %s) is not installed: apt-get install %s", name, from, name)
		}
		seen[name] = true
		if follow != nil && !follow(name) {
			return nil
		}
		out = append(out, p)
		for _, dep := range strings.Split(p.Depends, ",") {
			if strings.TrimSpace(dep) == "" {
				continue
			}
			choice := ""
			for _, alt := range strings.Split(dep, "|") {
				n := depName(alt)
				if _, ok := db.pkgs[n]; ok {
					choice = n
					break
				}
				if prov := db.provides[n]; len(prov) > 0 {
					sort.Strings(prov)
					choice = prov[0]
					break
				}
			}
			if choice == "" {
				return fmt.Errorf("package %s depends on %q: none of it is installed", p.Name, strings.TrimSpace(dep))
			}
			if err := visit(choice, p.Name); err != nil {
				return err
			}
		}
		return nil
	}
	for _, n := range names {
		if err := visit(n, "the image"); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Files are the paths the package ships (its .list), directories left out.
func (db *dpkgDB) Files(p *debPackage) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(db.info, p.infoName+".list"))
	if err != nil {
		return nil, fmt.Errorf("package %s: %w", p.Name, err)
	}
	var files []string
	for _, f := range strings.Split(string(b), "\n") {
		if f == "" || f == "/." || slices.Contains(mergedDirs, strings.TrimPrefix(f, "/")) {
			continue
		}
		fi, err := os.Lstat(filepath.Join(db.root, f))
		if err != nil {
			// dpkg-divert moves a file; a diverted file is not this package's.
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		if fi.IsDir() {
			continue
		}
		files = append(files, f)
	}
	return files, nil
}

// skipDoc says whether a package file is one the image leaves out:
// docs, man and info pages, locales, lintian overrides (never a
// copyright file), and python3-torch's C++ test programs (torch/bin/,
// 28 MB, one linking a library Debian does not ship; torch_shm_manager,
// which torch.multiprocessing runs, stays).
func skipDoc(p string) bool {
	if strings.HasPrefix(p, "/usr/lib/python3/dist-packages/torch/bin/") {
		return path.Base(p) != "torch_shm_manager"
	}
	if strings.HasPrefix(p, "/usr/share/doc/") {
		return path.Base(p) != "copyright"
	}
	for _, d := range []string{"/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/", "/usr/share/doc-base/", "/usr/share/bug/", "/usr/share/bash-completion/", "/usr/share/zsh/"} {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}
