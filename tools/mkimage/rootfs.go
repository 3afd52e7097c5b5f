package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// collector copies host files into a tree: each regular file is checked
// against the md5 sum of the Debian package that ships it, and the
// packages used are kept for the SBOM.
type collector struct {
	db   *dpkgDB
	t    *tree
	pkgs map[string]*debPackage
}

func newCollector(db *dpkgDB, t *tree) *collector {
	return &collector{db: db, t: t, pkgs: map[string]*debPackage{}}
}

// Packages are the Debian packages whose files are in the tree, by name.
func (c *collector) Packages() []*debPackage {
	out := make([]*debPackage, 0, len(c.pkgs))
	for _, p := range c.pkgs {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Host adds the host file at p (a path under the database's root) and, when p is a symlink, the chain of
// links to the file it names (each link at its own path, as ld.so
// follows them); a directory on the way that is a symlink (other than
// the merged /lib, /bin) is added as one too. The file must belong to
// an installed package and match its md5 sum; its package's copyright
// file comes with it.
func (c *collector) Host(p string) error {
	for hops := 0; hops < 40; hops++ {
		var err error
		if p, err = c.dirLinks(p); err != nil {
			return err
		}
		fi, err := os.Lstat(c.hp(p))
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(c.hp(p))
			if err != nil {
				return err
			}
			if err := c.t.Symlink(imagePath(p), target, "host "+p); err != nil {
				return err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			p = target
			continue
		case fi.Mode().IsRegular():
			return c.packageFile(p, fi.Mode())
		default:
			return fmt.Errorf("%s: not a regular file or symlink (%s)", p, fi.Mode())
		}
	}
	return fmt.Errorf("%s: more than 40 symlinks", p)
}

// packageFile adds the regular host file p, verified against its package.
func (c *collector) packageFile(p string, mode os.FileMode) error {
	pkg, dp, err := c.db.Owner(p)
	if err != nil {
		return err
	}
	if err := c.db.Verify(pkg, dp); err != nil {
		return err
	}
	if err := c.t.File(imagePath(dp), filepath.Join(c.db.root, dp), mode, "package "+pkg.Name); err != nil {
		return err
	}
	return c.use(pkg)
}

// use records pkg and adds its copyright file.
func (c *collector) use(pkg *debPackage) error {
	if _, ok := c.pkgs[pkg.Name]; ok {
		return nil
	}
	c.pkgs[pkg.Name] = pkg
	cp := "/usr/share/doc/" + pkg.Name + "/copyright"
	if _, err := os.Stat(c.hp(cp)); err != nil {
		return fmt.Errorf("package %s: no copyright file at %s: %w", pkg.Name, cp, err)
	}
	return c.Host(cp)
}

// hp is the host file of path p of the database's root ("/" but in tests).
func (c *collector) hp(p string) string { return filepath.Join(c.db.root, p) }

// dirLinks adds the symlinks among p's parent directories (but the
// merged top directories) and returns p with them resolved.
func (c *collector) dirLinks(p string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := ""
	for i, part := range parts[:len(parts)-1] {
		cur += "/" + part
		if i == 0 {
			continue // /lib, /bin: links the image makes itself
		}
		fi, err := os.Lstat(c.hp(cur))
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(c.hp(cur))
		if err != nil {
			return "", err
		}
		if err := c.t.Symlink(imagePath(cur), target, "host "+cur); err != nil {
			return "", err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(cur), target)
		}
		return c.dirLinks(filepath.Join(append([]string{target}, parts[i+1:]...)...))
	}
	return p, nil
}

// Package adds every file of pkg but documentation (skipDoc), each
// regular file verified; symlinks as they are.
func (c *collector) Package(pkg *debPackage) error {
	files, err := c.db.Files(pkg)
	if err != nil {
		return err
	}
	for _, f := range files {
		if skipDoc(f) {
			continue
		}
		hp := filepath.Join(c.db.root, f)
		fi, err := os.Lstat(hp)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(hp)
			if err != nil {
				return err
			}
			if err := c.t.Symlink(imagePath(f), target, "package "+pkg.Name); err != nil {
				return err
			}
			// a link into a package not taken whole (torch/lib/*.so ->
			// libtorch1.13's files): the file it names comes too
			if fi, err := os.Stat(hp); err == nil && fi.Mode().IsRegular() {
				if err := c.Host(f); err != nil {
					return fmt.Errorf("%s (a link of package %s): %w", f, pkg.Name, err)
				}
			}
		case fi.Mode().IsRegular():
			if err := c.db.Verify(pkg, f); err != nil {
				return err
			}
			if err := c.t.File(imagePath(f), hp, fi.Mode(), "package "+pkg.Name); err != nil {
				return err
			}
		}
	}
	return c.use(pkg)
}

// lddLine is one library of ldd's output: "name => /path (0x...)" or
// "/path (0x...)" (the loader); "name => not found" is an error.
var lddLine = regexp.MustCompile(`^\s*(\S+)(?: => (\S+|not found))?(?: \(0x[0-9a-f]+\))?\s*$`)

// Libraries are the shared libraries ldd resolves for the ELF file bin
// (the whole closure, as the loader finds it on this host); a library
// not found is an error naming it.
func Libraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) || bytes.Contains(out, []byte("statically linked")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "statically linked" {
			continue
		}
		m := lddLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("ldd %s: cannot read line %q", bin, line)
		}
		switch {
		case m[2] == "not found":
			return nil, fmt.Errorf("ldd %s: %s not found", bin, m[1])
		case m[2] != "":
			libs = append(libs, m[2])
		case strings.HasPrefix(m[1], "/"):
			libs = append(libs, m[1])
		}
		// else linux-vdso: the kernel's
	}
	return libs, nil
}

// isELF says whether the host file is an ELF object (a library, a program
// or a Python extension module).
func isELF(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Type == elf.ET_DYN || f.Type == elf.ET_EXEC
}

// HostLibraries adds the ldd closure of every ELF file among the tree's
// regular files taken from the host (libraries the packages reach only
// through update-alternatives links, which dpkg lists nowhere).
func (c *collector) HostLibraries() error {
	var elfs []string
	for p, e := range c.t.entries {
		if e.kind != tar.TypeReg || e.src == "" {
			continue
		}
		if isELF(e.src) {
			elfs = append(elfs, p)
		}
	}
	sort.Strings(elfs)
	for _, p := range elfs {
		libs, err := Libraries(c.t.entries[p].src)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, l := range libs {
			if err := c.Host(l); err != nil {
				return fmt.Errorf("%s, a library of %s: %w", l, p, err)
			}
		}
	}
	return nil
}
