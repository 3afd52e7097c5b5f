package kserve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ShmDir is where POSIX shared memory objects live on Linux (shm_open's
// names are files here).
var ShmDir = "/dev/shm"

// Region is a POSIX shared memory object mapped into this process: the
// system shared memory extension's region. The client creates one per
// concurrency slot and registers it with its key; the server opens the key
// and reads inputs from, and writes outputs to, the offsets a request names.
type Region struct {
	Key  string // the shm_open name, "/mdag-..."
	Data []byte // the mapping
	own  bool   // created here: Close removes the object
	base []byte // the whole mapping when Data starts inside it
}

// checkKey refuses a key that is not one shm_open name.
func checkKey(key string) error {
	name, ok := strings.CutPrefix(key, "/")
	if !ok || name == "" || strings.Contains(name, "/") || name == "." || name == ".." || len(name) > 255 {
		return fmt.Errorf("shared memory key %q: want /NAME (one path element, as shm_open takes)", key)
	}
	return nil
}

// CreateRegion creates (or truncates) the object key of size bytes, its
// pages reserved (an error, ENOSPC, where ShmDir lacks the room), and maps
// it. Close unmaps and removes it.
func CreateRegion(key string, size int) (*Region, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shared memory %s: size %d", key, size)
	}
	path := filepath.Join(ShmDir, key[1:])
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shared memory %s: %w", key, err)
	}
	defer f.Close()
	// reserve the pages now: a sparse object's pages are allocated when
	// first written, and a full tmpfs then faults (SIGBUS) the writer
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, int64(size)); err != nil {
		if !errors.Is(err, syscall.EOPNOTSUPP) {
			os.Remove(path)
			return nil, fmt.Errorf("shared memory %s: reserving %d bytes in %s: %w", key, size, ShmDir, err)
		}
		if err := f.Truncate(int64(size)); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("shared memory %s: %w", key, err)
		}
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("shared memory %s: mmap: %w", key, err)
	}
	return &Region{Key: key, Data: b, own: true}, nil
}

// OpenRegion maps an existing object key from offset for size bytes (the
// server's side of SystemSharedMemoryRegister). Close unmaps it.
//
// A register request names the object; it is mapped read-write, so
// OpenRegion takes only what the server's own user could have created
// with shm_open: it refuses a symbolic link (O_NOFOLLOW: /dev/shm is
// world-writable, and a link there could lead to any file the server may
// write), anything but a regular file (a FIFO, a directory, a device), an
// object owned by another uid than the server's effective uid (another
// user's region, or a file they planted), and a hard link (st_nlink != 1:
// one object under two names). The key's name itself is not restricted
// (no "/mdag-" prefix): Triton clients choose any name, and a prefix says
// nothing about who made the object; the owner does.
func OpenRegion(key string, offset, size uint64) (*Region, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	// O_NONBLOCK: opening a FIFO or a device must not wait for a peer
	// (the type is refused below, after fstat on the open descriptor)
	f, err := os.OpenFile(filepath.Join(ShmDir, key[1:]), os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ELOOP):
			return nil, fmt.Errorf("shared memory %s: %w: %s is a symbolic link, not a shared memory object", key, ErrNotShm, filepath.Join(ShmDir, key[1:]))
		case errors.Is(err, syscall.EISDIR):
			return nil, fmt.Errorf("shared memory %s: %w: %s is a directory, not a shared memory object", key, ErrNotShm, filepath.Join(ShmDir, key[1:]))
		}
		return nil, fmt.Errorf("shared memory %s: %w", key, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shared memory %s: %w", key, err)
	}
	if err := checkObject(key, st); err != nil {
		return nil, err
	}
	if size == 0 || offset+size > uint64(st.Size()) || offset+size < offset {
		return nil, fmt.Errorf("shared memory %s: offset %d + byte_size %d is outside its %d bytes", key, offset, size, st.Size())
	}
	// mmap's offset must be page aligned: map from the page and slice
	page := uint64(os.Getpagesize())
	start := offset / page * page
	b, err := syscall.Mmap(int(f.Fd()), int64(start), int(offset+size-start), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shared memory %s: mmap: %w", key, err)
	}
	return &Region{Key: key, Data: b[offset-start:], own: false, base: b}, nil
}

// ErrNotShm says a key names something the server does not map: a link,
// not a regular file, or another user's object.
var ErrNotShm = errors.New("refused")

// checkObject refuses an open object that is not a regular file owned by
// the server's effective uid with one link.
func checkObject(key string, st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("shared memory %s: %w: it is a %s, not a shared memory object (a regular file in %s)", key, ErrNotShm, fileType(st.Mode()), ShmDir)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("shared memory %s: %w: no owner known", key, ErrNotShm)
	}
	if me := os.Geteuid(); int(sys.Uid) != me {
		return fmt.Errorf("shared memory %s: %w: it is owned by uid %d, and the server maps only its own uid's (%d) objects", key, ErrNotShm, sys.Uid, me)
	}
	if sys.Nlink != 1 {
		return fmt.Errorf("shared memory %s: %w: it has %d links, want 1 (a hard link to another object?)", key, ErrNotShm, sys.Nlink)
	}
	return nil
}

// fileType names a file mode's type for an error.
func fileType(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file (" + m.Type().String() + ")"
}

// Close unmaps the region (and removes the object when it was created
// here). Idempotent.
func (r *Region) Close() error {
	if r == nil || r.Data == nil {
		return nil
	}
	m := r.base
	if m == nil {
		m = r.Data
	}
	err := syscall.Munmap(m)
	r.Data, r.base = nil, nil
	if r.own {
		if e := os.Remove(filepath.Join(ShmDir, r.Key[1:])); e != nil && !errors.Is(e, os.ErrNotExist) && err == nil {
			err = e
		}
	}
	return err
}
