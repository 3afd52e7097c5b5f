package kserve

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A region one side creates is the same bytes the other side opens, at any
// offset (mmap needs page alignment; OpenRegion hides it), and Close
// removes only what was created.
func TestRegion(t *testing.T) {
	key := fmt.Sprintf("/mdag-test-%d", os.Getpid())
	c, err := CreateRegion(key, 3*os.Getpagesize())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	off := uint64(os.Getpagesize() + 7)
	s, err := OpenRegion(key, off, 100)
	if err != nil {
		t.Fatal(err)
	}
	s.Data[0], s.Data[99] = 42, 43
	if c.Data[off] != 42 || c.Data[off+99] != 43 {
		t.Fatalf("the creator sees %d %d, want 42 43", c.Data[off], c.Data[off+99])
	}
	if len(s.Data) != 100 {
		t.Fatalf("opened %d bytes, want 100", len(s.Data))
	}
	if err := s.Close(); err != nil || s.Close() != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, key[1:])); err != nil {
		t.Fatalf("the server's Close removed the object: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, key[1:])); !os.IsNotExist(err) {
		t.Fatalf("the creator's Close left the object: %v", err)
	}
	for _, tc := range []struct {
		key       string
		off, size uint64
	}{{"noslash", 0, 1}, {"/a/b", 0, 1}, {"/..", 0, 1}, {key, 0, 1}} {
		if _, err := OpenRegion(tc.key, tc.off, tc.size); err == nil {
			t.Errorf("OpenRegion(%q): no error", tc.key)
		}
	}
	c2, err := CreateRegion(key, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for _, tc := range []struct{ off, size uint64 }{{0, 11}, {5, 6}, {0, 0}, {^uint64(0), 2}} {
		if _, err := OpenRegion(key, tc.off, tc.size); err == nil {
			t.Errorf("OpenRegion(off %d, size %d) of 10 bytes: no error", tc.off, tc.size)
		}
	}
}

// copyGuarded copies a large batch on several goroutines, and a region
// truncated under it is an error naming the fault, from whichever
// goroutine met it, never a crash.
func TestCopyGuarded(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // several goroutines on any machine
	key := fmt.Sprintf("/mdag-test-copy-%d", os.Getpid())
	size := 8 * copyChunk
	r, err := CreateRegion(key, size)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i * 7)
	}
	if err := copyGuarded("region", r.Data, src); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Data, src) {
		t.Fatal("the region differs from what was copied")
	}
	if err := os.Truncate(filepath.Join(ShmDir, key[1:]), int64(copyChunk)); err != nil {
		t.Fatal(err)
	}
	err = copyGuarded("region", r.Data, src)
	var fe *faultError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "region faulted") {
		t.Fatalf("copy into a truncated region: %v, want a fault", err)
	}
	if err := copyGuarded("region", r.Data[:10], src); err == nil || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("copy of more than the region holds: %v", err)
	}
}
