package coordinator

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/ingest/synth"
)

// memStore is a Store in memory that encodes as the disk one does (JSON),
// so a test can keep a copy of what was written at a given moment: the
// state a kill -9 at that moment leaves.
type memStore struct {
	mu    sync.Mutex
	raw   []byte
	saves int
}

func (m *memStore) Load() (*Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.raw == nil {
		return nil, nil
	}
	s := &Snapshot{}
	if err := json.Unmarshal(m.raw, s); err != nil {
		return nil, err
	}
	return s, s.Check()
}

func (m *memStore) Save(s *Snapshot) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.raw, m.saves = raw, m.saves+1
	return nil
}

// crashCopy is the store as a crash now would leave it.
func (m *memStore) crashCopy(t *testing.T) (*memStore, *Snapshot) {
	m.mu.Lock()
	c := &memStore{raw: slices.Clone(m.raw)}
	m.mu.Unlock()
	s, err := c.Load()
	if err != nil || s == nil {
		t.Fatalf("crash copy: %v, %v", s, err)
	}
	return c, s
}

// TestRestartContinues is issue 22's restart at the engine: a session
// with frames in flight is saved, the coordinator "crashes" (the next
// engine starts from that save, not from a clean shutdown's), and on the
// new engine the counters continue from the saved ones, the frames in
// flight at the save are counted lost with reason coordinator-restart,
// the stream resumes under its ID and the frames it numbered after the
// save (sent to the dead coordinator, or while it was down) are counted
// lost too; every frame is accounted once, and a further restart from a
// save with nothing in flight counts nothing again.
func TestRestartContinues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, prof := loadExample(t, "traffic")
		pat, err := synth.NewPattern(320, 240, 3)
		if err != nil {
			t.Fatal(err)
		}
		disk := &memStore{}
		f1 := startFake(t, Config{Store: disk, Epoch: time.Hour}, everyType)
		if err := f1.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		f1.stream(app.Name, "cam-0", 0, pat, app.FPS, 0)
		f1.advance(3 * time.Second)
		if disk.saves < 10 {
			t.Errorf("%d saves in 3 s at the default 200 ms cadence; want >= 10", disk.saves)
		}
		// Stop right after a frame went in: it (at least) is in flight.
		f1.runTo(f1.streams[0].next)
		before := f1.e.Status().Sessions[0]
		if before.Open == 0 || before.Total.Finished == 0 {
			t.Fatalf("before the save: %+v; want frames finished and some in flight", before.Total)
		}
		if err := f1.e.SaveState(); err != nil {
			t.Fatal(err)
		}
		crashed, saved := disk.crashCopy(t)
		ss := saved.Sessions[0]
		if ss.Total != before.Total || len(ss.Streams) != 1 || ss.Streams[0].ID != "cam-0" || ss.Streams[0].NextSeq != f1.streams[0].seq {
			t.Fatalf("saved %+v %+v; want %+v and cam-0 next %d", ss.Total, ss.Streams, before.Total, f1.streams[0].seq)
		}
		// The stream goes on sending (3 frames the store never sees), then
		// the coordinator dies.
		f1.advance(3 * time.Second / time.Duration(app.FPS))
		unsaved := f1.streams[0].seq - ss.Streams[0].NextSeq
		f1.close()

		f2 := startFake(t, Config{Store: crashed, Epoch: time.Hour}, everyType)
		if err := f2.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		st := f2.e.Status()
		got := st.Sessions[0]
		inFlight := ss.Total.Open()
		want := ss.Total
		want.Dropped += inFlight
		if got.Total != want || got.Open != 0 || got.Drops["-: "+string(why.CoordinatorRestart)] != inFlight {
			t.Fatalf("restored: %+v open %d drops %v; want %+v, %d lost %s", got.Total, got.Open, got.Drops, want, inFlight, string(why.CoordinatorRestart))
		}
		if p := st.Persist; p == nil || p.Restarts != 1 || p.LostFrames != inFlight || !slices.Equal(p.AwaitingStreams, []string{"cam-0"}) {
			t.Fatalf("persist status %+v; want 1 restart, %d lost, cam-0 awaited", p, inFlight)
		}
		if st.ReplansTotal < saved.ReplansTotal {
			t.Errorf("re-plans %d after the restart, %d saved: the counter went back", st.ReplansTotal, saved.ReplansTotal)
		}
		// The stream comes back under its ID, numbering on from where it
		// was (a source that kept its counter while reconnecting).
		if err := f2.e.Join(app.Name, "cam-0"); err != nil {
			t.Fatal(err)
		}
		f2.settle()
		resumeAt := f2.now()
		f2.streams = append(f2.streams, &fakeStream{id: "cam-0", pat: pat, period: time.Second / time.Duration(app.FPS),
			next: resumeAt, seq: ss.Streams[0].NextSeq + unsaved})
		f2.advance(3 * time.Second)
		f2.streams = nil
		f2.until("every frame to end", 10*time.Second, func() bool { return f2.e.Status().Sessions[0].Open == 0 })
		after := f2.e.Status().Sessions[0]
		newFrames := f2.framesEnded() // the restart's losses have no OnFrame: they are counted, not delivered
		lost := inFlight + unsaved
		t.Logf("saved %+v; %d in flight, %d unsaved, %d sent after the resume; now %+v", ss.Total, inFlight, unsaved, newFrames, after.Total)
		if after.Drops["-: "+string(why.CoordinatorRestart)] != lost {
			t.Errorf("lost to the restart: %d; want %d in flight + %d unsaved", after.Drops["-: "+string(why.CoordinatorRestart)], inFlight, unsaved)
		}
		if after.Total.Sent != ss.Total.Sent+unsaved+newFrames || after.Total.Finished+after.Total.Late+after.Total.Dropped != after.Total.Sent {
			t.Errorf("after: %+v; want sent %d (saved) + %d (unsaved) + %d (resumed), every one ended", after.Total, ss.Total.Sent, unsaved, newFrames)
		}
		if after.Total.Finished < ss.Total.Finished || after.Total.Late < ss.Total.Late || after.Total.Dropped < ss.Total.Dropped {
			t.Errorf("a counter went back: %+v after, %+v saved", after.Total, ss.Total)
		}
		// The resumed frames finish as before the crash.
		var fin, sent uint64
		for _, w := range after.Windows {
			if !w.Start.Before(resumeAt.Add(time.Second)) {
				fin, sent = fin+w.Finished, sent+w.Sent
			}
		}
		if sent == 0 || float64(fin) < 0.95*float64(sent) {
			t.Errorf("after the resume: %d of %d frames finished; want >= 95%%", fin, sent)
		}
		// A clean save with nothing in flight, restored: nothing is lost
		// twice and the counters are exactly the saved ones.
		if err := f2.e.SaveState(); err != nil {
			t.Fatal(err)
		}
		again, saved2 := crashed.crashCopy(t)
		f2.close()
		f3 := startFake(t, Config{Store: again, Epoch: time.Hour}, everyType)
		if err := f3.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		third := f3.e.Status()
		if third.Sessions[0].Total != saved2.Sessions[0].Total || third.Sessions[0].Drops["-: "+string(why.CoordinatorRestart)] != lost || third.Persist.Restarts != 2 {
			t.Errorf("second restart: %+v drops %v restarts %d; want %+v, still %d lost, 2 restarts",
				third.Sessions[0].Total, third.Sessions[0].Drops, third.Persist.Restarts, saved2.Sessions[0].Total, lost)
		}
	})
}

// framesEnded is how many frames ended with an outcome (OnFrame) on f.
func (f *fakeRun) framesEnded() uint64 {
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	return uint64(len(f.rec.frames))
}

// TestRestoreRefused: a state the engine cannot continue from is an
// error from New (the coordinator refuses to start), never a panic and
// never a silent fresh start.
func TestRestoreRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  string
		want string
	}{
		{"future version", `{"version":99}`, "unsupported state version 99"},
		{"not JSON", `{"version":`, "unexpected end"},
		{"more ended than sent", `{"version":1,"sessions":[{"app":"traffic","total":{"sent":2,"dropped":3}}]}`, "exceed 2 sent"},
		{"session twice", `{"version":1,"sessions":[{"app":"traffic"},{"app":"traffic"}]}`, "session traffic twice"},
		// the sum wraps to 0 without a per-counter check
		{"counters that wrap", `{"version":1,"sessions":[{"app":"traffic","total":{"sent":10,"late":18446744073709551615,"dropped":1}}]}`, "exceed 10 sent"},
		// a restart counts each frame in flight lost: 1e18 of them would hang the loop
		{"in flight beyond belief", `{"version":1,"sessions":[{"app":"traffic","total":{"sent":1000000000000000000}}]}`, "frames in flight at the save"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{MILPSolver: milp.Solver{}, Store: &memStore{raw: []byte(tc.raw)}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want an error with %q", err, tc.want)
			}
		})
	}
	_, err := New(Config{MILPSolver: milp.Solver{}, Store: failing{}})
	if !errors.Is(err, errDisk) {
		t.Fatalf("New with a store that cannot load: %v; want %v", err, errDisk)
	}
}

var errDisk = errors.New("disk on fire")

type failing struct{}

func (failing) Load() (*Snapshot, error) { return nil, errDisk }
func (failing) Save(*Snapshot) error     { return errDisk }

// TestSaveFailureCounted: a store that cannot write is counted in Status
// (and logged), the engine keeps serving.
func TestSaveFailureCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, prof := loadExample(t, "traffic")
		f := startFake(t, Config{Store: saveFails{}, Epoch: time.Hour}, everyType)
		if err := f.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		f.advance(time.Second)
		p := f.e.Status().Persist
		if p == nil || p.SaveErrors < 4 || p.Saves != 0 || !strings.Contains(p.LastError, "disk on fire") {
			t.Fatalf("persist status %+v; want >= 4 failures counted with the error", p)
		}
	})
}

type saveFails struct{}

func (saveFails) Load() (*Snapshot, error) { return nil, nil }
func (saveFails) Save(*Snapshot) error     { return errDisk }

// TestOlderSnapshotNeverWritten: the periodic saver and SaveState (or
// Close) may race; a snapshot taken before one already written is never
// written over it, so what is on disk never goes back.
func TestOlderSnapshotNeverWritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		app, prof := loadExample(t, "traffic")
		disk := &memStore{}
		f := startFake(t, Config{Store: disk, Epoch: time.Hour}, everyType)
		if err := f.e.Deploy(app, prof); err != nil {
			t.Fatal(err)
		}
		var older *Snapshot
		f.e.call(func() { older = f.e.snapshot() })
		if err := f.e.Join(app.Name, "late-joiner"); err != nil {
			t.Fatal(err)
		}
		f.settle()
		if err := f.e.SaveState(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name      string
			snap      *Snapshot
			wantWrote bool
		}{{"the older one", older, false}, {"a newer one", nil, true}} {
			snap := tc.snap
			if snap == nil {
				f.e.call(func() { snap = f.e.snapshot() })
			}
			saves := disk.saves
			wrote, err := f.e.write(snap)
			if err != nil || wrote != tc.wantWrote || (disk.saves > saves) != tc.wantWrote {
				t.Errorf("%s: wrote %v (%d -> %d saves), %v; want wrote %v", tc.name, wrote, saves, disk.saves, err, tc.wantWrote)
			}
			got, _ := disk.Load()
			if len(got.Sessions[0].Streams) != 1 {
				t.Errorf("%s: the store holds %+v; want the stream that joined after the older snapshot", tc.name, got.Sessions[0].Streams)
			}
		}
	})
}
