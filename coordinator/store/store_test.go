package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func sample() *coordinator.Snapshot {
	return &coordinator.Snapshot{Version: coordinator.SnapshotVersion, SavedAt: time.Unix(1700000000, 5).UTC(), Restarts: 2,
		Sessions: []coordinator.SessionState{{App: "traffic", FPS: 10, SLO: 200 * time.Millisecond,
			Total:    coordinator.Counts{Sent: 100, Finished: 90, Late: 3, Dropped: 4},
			Drops:    map[string]uint64{"-: lost": 1, "detect: cannot-finish": 3},
			Streams:  []coordinator.StreamState{{ID: "cam-0", NextSeq: 50}, {ID: "cam-1", NextSeq: 50}},
			Scale:    map[dag.ModuleID]float64{"detect": 2.5},
			Balloon:  map[dag.ModuleID]float64{"classify": 1.3},
			Headroom: 1.25}},
		Instances:    []coordinator.InstanceRecord{{ID: "gpu-1", Type: "V100"}},
		ReplansTotal: 7, ReplansUnchanged: 1}
}

// TestRoundTrip: an empty store loads nothing; a saved snapshot loads back
// equal, also after the database is closed and opened again; a later save
// replaces it.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := b.Load(); err != nil || s != nil {
		t.Fatalf("empty store: %+v, %v; want nil, nil", s, err)
	}
	want := sample()
	if err := b.Save(want); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got, err := b.Load()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got, cmpopts.IgnoreUnexported(coordinator.Snapshot{})); d != "" {
		t.Fatalf("round trip (-saved +loaded):\n%s", d)
	}
	want.Sessions[0].Total.Sent, want.Sessions[0].Total.Finished = 120, 105
	if err := b.Save(want); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Load(); got.Sessions[0].Total != want.Sessions[0].Total {
		t.Fatalf("second save: loaded %+v, want %+v", got.Sessions[0].Total, want.Sessions[0].Total)
	}
}

// TestRefused: a file that is not a database, a future version, a
// snapshot that does not decode or whose counters cannot be, and a second
// process on the same directory are errors that name the file and say
// what to do, never a panic.
func TestRefused(t *testing.T) {
	put := func(version, snap string) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Update(func(tx *bolt.Tx) error {
				bk, _ := tx.CreateBucketIfNotExists(bucket)
				if err := bk.Put(keyVersion, []byte(version)); err != nil {
					return err
				}
				if snap == "" {
					return nil
				}
				return bk.Put(keyState, []byte(snap))
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, path string)
		atOpen bool
		want   []string
		is     error
	}{
		{"garbage file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(strings.Repeat("not a bbolt file ", 1000)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, true, []string{"mv ", ".bad"}, nil},
		{"truncated database", func(t *testing.T, path string) {
			put("1", `{"version":1}`)(t, path)
			if err := os.Truncate(path, 100); err != nil {
				t.Fatal(err)
			}
		}, true, []string{"mv "}, nil},
		{"future version", put("2", `{"version":2}`), false, []string{"version 2", "reads version 1", "mv "}, coordinator.ErrSnapshotVersion},
		{"version not a number", put("x", `{}`), false, []string{`version "x"`}, nil},
		{"version without snapshot", put("1", ""), false, []string{"no snapshot"}, nil},
		{"snapshot not JSON", put("1", `{"version":1,`), false, []string{"snapshot:", "mv "}, nil},
		{"counters inconsistent", put("1", `{"version":1,"sessions":[{"app":"a","total":{"sent":1,"finished":2}}]}`), false,
			[]string{"exceed 1 sent"}, nil},
		{"version field disagrees", put("1", `{"version":3}`), false, []string{"version 3"}, coordinator.ErrSnapshotVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			tc.setup(t, path)
			b, err := Open(dir)
			if err == nil {
				defer b.Close()
				_, err = b.Load()
			} else if !tc.atOpen {
				t.Fatalf("Open: %v", err)
			}
			if err == nil {
				t.Fatal("loaded; want an error")
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
		})
	}
	t.Run("held by another", func(t *testing.T) {
		dir := t.TempDir()
		b, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "another process holds it") {
			t.Fatalf("second Open: %v; want 'another process holds it'", err)
		}
	})
}

// TestCountersNeverDecrease (property): whatever frames a session sends
// and ends between saves, what loads back is what was saved last, so the
// counters read after any save/load never go below the ones before.
func TestCountersNeverDecrease(t *testing.T) {
	dir := t.TempDir()
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rapid.Check(t, func(t *rapid.T) {
		var prev coordinator.Counts
		if s, err := b.Load(); err != nil {
			t.Fatal(err)
		} else if s != nil {
			prev = s.Sessions[0].Total
		}
		cur := prev
		for range rapid.IntRange(1, 20).Draw(t, "saves") {
			sent := rapid.Uint64Range(0, 1000).Draw(t, "sent")
			cur.Sent += sent
			open := cur.Open()
			f := rapid.Uint64Range(0, open).Draw(t, "finished")
			l := rapid.Uint64Range(0, open-f).Draw(t, "late")
			d := rapid.Uint64Range(0, open-f-l).Draw(t, "dropped")
			cur.Finished, cur.Late, cur.Dropped = cur.Finished+f, cur.Late+l, cur.Dropped+d
			s := sample()
			s.Sessions[0].Total = cur
			if err := b.Save(s); err != nil {
				t.Fatal(err)
			}
			got, err := b.Load()
			if err != nil {
				t.Fatal(err)
			}
			g := got.Sessions[0].Total
			if g != cur || g.Sent < prev.Sent || g.Finished < prev.Finished || g.Late < prev.Late || g.Dropped < prev.Dropped {
				t.Fatalf("loaded %+v after saving %+v (before: %+v)", g, cur, prev)
			}
			prev = g
		}
	})
}

// FuzzLoad: whatever bytes the snapshot key holds, Load returns a
// snapshot that passes Check or an error; it never panics.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"version":1,"sessions":[{"app":"a","total":{"sent":3,"finished":1}}]}`))
	f.Add([]byte(`{"version":1,"sessions":[{"app":"a"},{"app":"a"}]}`))
	f.Add([]byte(`{"version":1,"sessions":[{"total":{"sent":1}}],"instances":[{"id":"x"}]}`))
	f.Add([]byte(`null`))
	dir := f.TempDir()
	b, err := Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { b.Close() })
	f.Fuzz(func(t *testing.T, raw []byte) {
		if err := b.db.Update(func(tx *bolt.Tx) error {
			bk, _ := tx.CreateBucketIfNotExists(bucket)
			if err := bk.Put(keyVersion, []byte("1")); err != nil {
				return err
			}
			return bk.Put(keyState, raw)
		}); err != nil {
			t.Fatal(err)
		}
		s, err := b.Load()
		if err == nil && s != nil {
			if cerr := s.Check(); cerr != nil {
				t.Fatalf("Load returned a snapshot Check refuses: %v", cerr)
			}
		}
	})
}

// A state file cut short (a partial copy, a bad restore) is an error that
// says what to do, at every length: never a fault that kills the process.
func TestTruncated(t *testing.T) {
	for _, frac := range []int64{2, 3, 4, 8, 16} {
		dir := t.TempDir()
		b, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		s := &coordinator.Snapshot{Version: coordinator.SnapshotVersion}
		for i := range 3000 {
			s.Sessions = append(s.Sessions, coordinator.SessionState{App: dag.AppID(fmt.Sprintf("app-%04d-%s", i, strings.Repeat("x", 12)))})
		}
		if err := b.Save(s); err != nil {
			t.Fatal(err)
		}
		b.Close()
		p := filepath.Join(dir, FileName)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, fi.Size()/frac); err != nil {
			t.Fatal(err)
		}
		b2, err := Open(dir)
		if err == nil {
			_, err = b2.Load()
			b2.Close()
		}
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("cut to 1/%d of %d bytes: %v, want an error naming %s", frac, fi.Size(), err, p)
		}
	}
}

// TestStateMustBePrivate (issue 36, Low: the directory's permissions were
// checked only when it was created, and symlinks followed): every open
// refuses state another user could have placed or can change, saying
// what and how to fix it; a group-writable volume (Kubernetes' fsGroup)
// is fine.
func TestStateMustBePrivate(t *testing.T) {
	fresh := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "state")
		b, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
		return dir
	}
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string // "" opens
	}{
		{"private", func(*testing.T, string) {}, ""},
		{"group-writable directory and file (fsGroup)", func(t *testing.T, dir string) {
			must(t, os.Chmod(dir, 0o2770))
			must(t, os.Chmod(filepath.Join(dir, FileName), 0o660))
		}, ""},
		{"world-writable directory", func(t *testing.T, dir string) { must(t, os.Chmod(dir, 0o777)) }, "writable by every user"},
		{"world-readable file", func(t *testing.T, dir string) { must(t, os.Chmod(filepath.Join(dir, FileName), 0o644)) }, "readable or writable by every user"},
		{"symlinked file", func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "elsewhere.db")
			must(t, os.Rename(filepath.Join(dir, FileName), other))
			must(t, os.Symlink(other, filepath.Join(dir, FileName)))
		}, "a symbolic link"},
		{"a directory in the file's place", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, FileName)))
			must(t, os.Mkdir(filepath.Join(dir, FileName), 0o700))
		}, "not a regular file"},
		{"file of another user", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			must(t, os.Chown(filepath.Join(dir, FileName), 65534, 65534))
		}, "owned by uid 65534"},
		{"directory of another user", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			must(t, os.Chown(dir, 65534, 65534))
		}, "owned by uid 65534"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fresh(t)
			c.setup(t, dir)
			b, err := Open(dir)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				b.Close()
				return
			}
			if err == nil {
				b.Close()
				t.Fatalf("opened, want an error with %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("error %q, want %q and the path", err, c.want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
