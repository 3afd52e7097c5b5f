// Package store is the coordinator's state store on disk: a
// coordinator.Store over an embedded bbolt database (`mdag coordinator
// --state DIR`, `mdag serve --state DIR`). One file, DIR/state.db, holds
// one bucket with the format version and the latest snapshot (JSON); each
// Save replaces them in one transaction that bbolt fsyncs before it
// returns, so a kill -9 leaves the previous snapshot or the new one, never
// a mix. Open refuses, with the path and what to do, a file that is not a
// bbolt database, one another process holds, and a snapshot it cannot
// read (corrupt, or written by another format version).
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mdag/mdag/coordinator"
)

// FileName is the database's name inside the state directory.
const FileName = "state.db"

// MaxSnapshot bounds a snapshot's encoded size (the engine bounds what it
// keeps; beyond this a Save is refused, the previous state kept).
const MaxSnapshot = 64 << 20

var (
	bucket     = []byte("coordinator")
	keyVersion = []byte("version")
	keyState   = []byte("snapshot")
)

// Bolt is a coordinator.Store in a bbolt file.
type Bolt struct {
	db   *bolt.DB
	path string
}

var _ coordinator.Store = (*Bolt)(nil)

// Open opens (creating it and dir if needed) the state database in dir.
// A second process on the same directory waits at most a second for the
// lock, then gets an error.
func Open(dir string) (b *Bolt, err error) {
	path := filepath.Join(dir, FileName)
	// a file shorter than its pages say faults in bbolt's mmap: a panic
	// recovered below, not a SIGBUS that kills the process
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("state %s: corrupt: %v; %s", path, p, moveAside(path))
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", dir, err)
	}
	if err := checkPrivate(dir, path); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("state %s: another process holds it (a coordinator already running on this --state?)", path)
		}
		return nil, fmt.Errorf("state %s: %w; %s", path, err, moveAside(path))
	}
	return &Bolt{db: db, path: path}, nil
}

// checkPrivate refuses state another user could have placed or can
// change, every time it is opened (not only when it was created): the
// directory (symlinks to it followed: an operator's choice) must be
// owned by this user or root and not writable by others; the file, when
// there, must be a regular file, not a symlink, owned by this user, with
// no permission for others. Group bits are allowed: Kubernetes' fsGroup
// gives the volume's group read and write.
func checkPrivate(dir, path string) error {
	uid := os.Geteuid()
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("state directory %s: not a directory", dir)
	case ok && int(st.Uid) != uid && st.Uid != 0:
		return fmt.Errorf("state directory %s: owned by uid %d, not this user (uid %d) or root: another user could replace the state", dir, st.Uid, uid)
	case fi.Mode().Perm()&0o002 != 0:
		return fmt.Errorf("state directory %s: writable by every user (mode %v): another user could replace the state; chmod o-w %s", dir, fi.Mode().Perm(), dir)
	}
	fi, err = os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state %s: %w", path, err)
	}
	st, ok = fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("state %s: a symbolic link: the state must be a file of its own in the directory", path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("state %s: not a regular file (%v)", path, fi.Mode().Type())
	case ok && int(st.Uid) != uid:
		return fmt.Errorf("state %s: owned by uid %d, not this user (uid %d)", path, st.Uid, uid)
	case fi.Mode().Perm()&0o007 != 0:
		return fmt.Errorf("state %s: readable or writable by every user (mode %v): it holds the workers' IDs and the sessions; chmod o-rwx %s", path, fi.Mode().Perm(), path)
	}
	return nil
}

// Path is the database file.
func (b *Bolt) Path() string { return b.path }

func moveAside(path string) string {
	return fmt.Sprintf("it cannot be read: move it aside (mv %s %s.bad) to start with empty state, or restore a good copy", path, path)
}

// Load implements coordinator.Store: (nil, nil) for a new database.
func (b *Bolt) Load() (snap *coordinator.Snapshot, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		// bbolt panics on some corrupt pages: an error to report, not a crash.
		if p := recover(); p != nil {
			snap, err = nil, fmt.Errorf("state %s: corrupt: %v; %s", b.path, p, moveAside(b.path))
		}
	}()
	err = b.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucket)
		if bk == nil {
			return nil
		}
		v := bk.Get(keyVersion)
		raw := bk.Get(keyState)
		if v == nil && raw == nil {
			return nil
		}
		ver, err := strconv.Atoi(string(v))
		if err != nil {
			return fmt.Errorf("version %q is not a number", v)
		}
		if ver != coordinator.SnapshotVersion {
			return fmt.Errorf("%w %d (this build reads version %d; a newer mdag wrote it?)", coordinator.ErrSnapshotVersion, ver, coordinator.SnapshotVersion)
		}
		if raw == nil {
			return errors.New("a version but no snapshot")
		}
		s := &coordinator.Snapshot{}
		if err := json.Unmarshal(raw, s); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		if err := s.Check(); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		snap = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state %s: %w; %s", b.path, err, moveAside(b.path))
	}
	return snap, nil
}

// Save implements coordinator.Store: one fsync'd transaction.
func (b *Bolt) Save(s *coordinator.Snapshot) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("state %s: encode: %w", b.path, err)
	}
	if len(raw) > MaxSnapshot {
		return fmt.Errorf("state %s: snapshot of %d bytes exceeds %d; not saved", b.path, len(raw), MaxSnapshot)
	}
	err = b.db.Update(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		if err := bk.Put(keyVersion, []byte(strconv.Itoa(s.Version))); err != nil {
			return err
		}
		return bk.Put(keyState, raw)
	})
	if err != nil {
		return fmt.Errorf("state %s: save: %w", b.path, err)
	}
	return nil
}

// Close releases the file.
func (b *Bolt) Close() error { return b.db.Close() }
