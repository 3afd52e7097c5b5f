package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// tree is the content of one layer: absolute paths in the image to what
// goes there. Written as a tar (writeLayer), it is a function of its
// entries only: entries sorted by name, every mtime the epoch given, uid
// and gid 0 with no user or group names, no xattrs, no access or change
// times, parents made 0755 where not given, gzip with a zero header
// (no name, no mtime) at a fixed level.
type tree struct {
	entries map[string]*entry
}

// entry is one file, directory or symlink of a tree.
type entry struct {
	kind byte   // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	mode int64  // permission bits with setuid, setgid, sticky
	link string // a symlink's target
	src  string // a regular file's content: a host file, or
	data []byte // these bytes
	// what, for a conflict's error: where the entry came from
	what string
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

// cleanPath makes p an absolute, clean path in the image.
func cleanPath(p string) (string, error) {
	c := path.Clean("/" + p)
	if c == "/" || strings.Contains(p, "\x00") {
		return "", fmt.Errorf("path %q: not a file path in the image", p)
	}
	return c, nil
}

// add puts e at p; the same path twice is an error unless both are equal
// (a library two packages' closures reach).
func (t *tree) add(p string, e *entry) error {
	c, err := cleanPath(p)
	if err != nil {
		return err
	}
	if old, ok := t.entries[c]; ok {
		if same, err := old.same(e); err != nil {
			return fmt.Errorf("%s: %w", c, err)
		} else if !same {
			return fmt.Errorf("%s: %s and %s put different things there", c, old.what, e.what)
		}
		return nil
	}
	t.entries[c] = e
	return nil
}

func (a *entry) same(b *entry) (bool, error) {
	if a.kind != b.kind || a.mode != b.mode || a.link != b.link {
		return false, nil
	}
	if a.kind != tar.TypeReg {
		return true, nil
	}
	ad, err := a.content()
	if err != nil {
		return false, err
	}
	bd, err := b.content()
	if err != nil {
		return false, err
	}
	return bytes.Equal(ad, bd), nil
}

func (e *entry) content() ([]byte, error) {
	if e.src == "" {
		return e.data, nil
	}
	return os.ReadFile(e.src)
}

// File adds a host file's content at p with mode perm.
func (t *tree) File(p, src string, perm os.FileMode, what string) error {
	return t.add(p, &entry{kind: tar.TypeReg, mode: int64(perm.Perm()) | modeBits(perm), src: src, what: what})
}

// Data adds bytes at p with mode perm.
func (t *tree) Data(p string, data []byte, perm os.FileMode, what string) error {
	return t.add(p, &entry{kind: tar.TypeReg, mode: int64(perm.Perm()) | modeBits(perm), data: data, what: what})
}

// Dir adds a directory at p with mode perm (parents not given are 0755).
func (t *tree) Dir(p string, perm os.FileMode, what string) error {
	return t.add(p, &entry{kind: tar.TypeDir, mode: int64(perm.Perm()) | modeBits(perm), what: what})
}

// Symlink adds a symlink at p to target.
func (t *tree) Symlink(p, target, what string) error {
	return t.add(p, &entry{kind: tar.TypeSymlink, mode: 0o777, link: target, what: what})
}

// modeBits are the tar mode bits of setuid, setgid and sticky.
func modeBits(m os.FileMode) int64 {
	var b int64
	if m&os.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// Write writes the tree as a gzip-compressed tar to w (see tree).
func (t *tree) Write(w io.Writer, epoch time.Time) error {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	if err := t.WriteTar(zw, epoch); err != nil {
		return err
	}
	return zw.Close()
}

// WriteTar writes the tree as an uncompressed tar to w.
func (t *tree) WriteTar(w io.Writer, epoch time.Time) error {
	all := map[string]*entry{}
	for p, e := range t.entries {
		all[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := t.entries[d]; !ok {
				all[d] = &entry{kind: tar.TypeDir, mode: 0o755, what: "a parent directory"}
			} else if t.entries[d].kind != tar.TypeDir {
				return fmt.Errorf("%s: a parent of %s is not a directory (%s)", d, p, t.entries[d].what)
			}
		}
	}
	names := make([]string, 0, len(all))
	for p := range all {
		names = append(names, p)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, p := range names {
		e := all[p]
		h := &tar.Header{
			Typeflag: e.kind,
			Name:     strings.TrimPrefix(p, "/"),
			Mode:     e.mode,
			ModTime:  epoch,
			Format:   tar.FormatPAX,
		}
		var data []byte
		switch e.kind {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = e.link
		case tar.TypeReg:
			var err error
			if data, err = e.content(); err != nil {
				return fmt.Errorf("%s (%s): %w", p, e.what, err)
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return tw.Close()
}
