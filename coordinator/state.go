package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mdag/mdag/coordinator/why"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
)

// SnapshotVersion is the version of the Snapshot format this build writes
// and reads. A store holding another version is refused at start.
const SnapshotVersion = 1

// Store keeps the coordinator's state across restarts (Config.Store;
// coordinator/store is the bbolt one). Load returns (nil, nil) when the
// store holds nothing yet; an unreadable, corrupt or other-version state
// is an error (the engine refuses to start on it). Save replaces the state
// durably. The engine serialises the calls.
type Store interface {
	Load() (*Snapshot, error)
	Save(*Snapshot) error
}

// Snapshot is what the coordinator persists: per app its session (counters,
// drops by reason, streams and the next frame each was due to send,
// learned factors), the workers registered, the re-plan counters. Frames
// in flight are not stored one by one: Total.Open() of a restored session
// is the number of frames in flight at the save, counted lost with reason
// why.CoordinatorRestart when it is restored (the ones in flight when the
// previous coordinator stopped, and those a resumed stream sent that it
// never accounted: module "-").
type Snapshot struct {
	Version          int              `json:"version"`
	SavedAt          time.Time        `json:"saved_at"`
	Restarts         int              `json:"restarts"` // how many times this state was restored
	Sessions         []SessionState   `json:"sessions"`
	Instances        []InstanceRecord `json:"instances"`
	ReplansTotal     int              `json:"replans_total"`
	ReplansUnchanged int              `json:"replans_unchanged"`

	seq uint64 // the engine's count of snapshots taken: an older one is never written over a newer one
}

// SessionState is one app's persisted session.
type SessionState struct {
	App      dag.AppID                `json:"app"`
	FPS      float64                  `json:"fps"`
	SLO      time.Duration            `json:"slo"`
	Total    Counts                   `json:"total"`
	Drops    map[string]uint64        `json:"drops,omitempty"` // "module: reason"
	Streams  []StreamState            `json:"streams,omitempty"`
	Scale    map[dag.ModuleID]float64 `json:"scale,omitempty"`
	Balloon  map[dag.ModuleID]float64 `json:"balloon,omitempty"`
	Headroom float64                  `json:"headroom,omitempty"`
}

// StreamState is a stream of a session: its ID and the sequence number
// after the last frame it sent (a stream that resumes with a later one
// sent the frames between them while the coordinator was away).
type StreamState struct {
	ID      string `json:"id"`
	NextSeq uint64 `json:"next_seq"`
}

// InstanceRecord is a registered worker.
type InstanceRecord struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// ErrSnapshotVersion is wrapped by Check for a snapshot of another version.
var ErrSnapshotVersion = errors.New("unsupported state version")

// Check says whether a loaded snapshot can be restored: its version and
// its counters' consistency (a session cannot have ended more frames than
// it was sent).
func (s *Snapshot) Check() error {
	if s.Version != SnapshotVersion {
		return fmt.Errorf("%w %d (this build reads version %d)", ErrSnapshotVersion, s.Version, SnapshotVersion)
	}
	var errs []error
	seen := map[dag.AppID]bool{}
	for _, ss := range s.Sessions {
		if ss.App == "" {
			errs = append(errs, errors.New("a session without an app name"))
			continue
		}
		if seen[ss.App] {
			errs = append(errs, fmt.Errorf("session %s twice", ss.App))
		}
		seen[ss.App] = true
		t := ss.Total
		// each against what is left of sent, so no sum can wrap
		if t.Finished > t.Sent || t.Late > t.Sent-t.Finished || t.Dropped > t.Sent-t.Finished-t.Late {
			errs = append(errs, fmt.Errorf("session %s: %d finished + %d late + %d dropped exceed %d sent", ss.App, t.Finished, t.Late, t.Dropped, t.Sent))
		}
		if open := t.Sent - t.Finished - t.Late - t.Dropped; t.Finished <= t.Sent && t.Late <= t.Sent-t.Finished && t.Dropped <= t.Sent-t.Finished-t.Late && open > maxInFlight {
			errs = append(errs, fmt.Errorf("session %s: %d frames in flight at the save: more than any session holds (%d)", ss.App, open, maxInFlight))
		}
		if ss.Headroom < 0 {
			errs = append(errs, fmt.Errorf("session %s: headroom %g", ss.App, ss.Headroom))
		}
	}
	return errors.Join(errs...)
}

// Persistence bounds: what a snapshot keeps at most.
const (
	maxPersistStreams   = 4096 // per session
	maxPersistInstances = 4096
	// resumeWindow is how long a restored stream or worker is expected
	// back; after it, it is forgotten.
	resumeWindow = 10 * time.Minute
	// maxGap bounds the frames a resumed stream may claim it sent while
	// the coordinator was away (beyond, the numbering restarted or it is
	// not believed: logged, not counted).
	maxGap = 1 << 20
	// maxInFlight bounds the frames a saved session may have had open: a
	// snapshot claiming more is not believed (a restart counts each lost,
	// one by one).
	maxInFlight = 1 << 20
)

// PersistStatus is the state store's part of Status.
type PersistStatus struct {
	Restarts   int       `json:"restarts"`
	RestoredAt time.Time `json:"restored_at,omitzero"`
	LostFrames uint64    `json:"lost_frames"` // counted lost with reason coordinator-restart since this start
	Saves      uint64    `json:"saves"`
	SaveErrors uint64    `json:"save_errors"`
	LastError  string    `json:"last_error,omitempty"`
	LastSaved  time.Time `json:"last_saved,omitzero"`
	// Awaiting lists the streams and workers of the previous run not back
	// yet (for resumeWindow after the restart).
	AwaitingStreams []string `json:"awaiting_streams,omitempty"`
	AwaitingWorkers []string `json:"awaiting_workers,omitempty"`
}

// persist is the engine's loop-owned store state.
type persist struct {
	restored   *Snapshot
	restoredAt time.Time
	carried    map[dag.AppID]SessionState // restored sessions not deployed (yet): kept in every save
	expect     map[string]string          // workers of the previous run not registered again: id -> type
	lost       uint64
	saves      uint64
	errs       uint64
	lastErr    string
	lastSaved  time.Time
	lastLog    time.Time
	tm         clock.Timer
	pending    chan *Snapshot // latest-wins hand-off to the saver goroutine
	seq        uint64         // snapshots taken (loop)
	writeMu    sync.Mutex     // serialises writes; guards written
	written    uint64         // the newest snapshot written: an older one is never written after it
	quit       chan struct{}
	saverDone  chan struct{}
}

// loadState reads the store (New): a snapshot that cannot be restored is
// an error.
func (e *Engine) loadState() error {
	snap, err := e.cfg.Store.Load()
	if err != nil {
		return err
	}
	e.ps.carried, e.ps.expect = map[dag.AppID]SessionState{}, map[string]string{}
	if snap == nil {
		return nil
	}
	if err := snap.Check(); err != nil {
		return err
	}
	snap.Restarts++
	e.ps.restored, e.ps.restoredAt = snap, e.clk.Now()
	for _, ss := range snap.Sessions {
		e.ps.carried[ss.App] = ss
	}
	for _, in := range snap.Instances {
		e.ps.expect[in.ID] = in.Type
	}
	e.nextPlan, e.unchanged = snap.ReplansTotal, snap.ReplansUnchanged
	e.log.Warn("coordinator state restored: sessions continue, frames in flight at the stop are counted lost ("+string(why.CoordinatorRestart)+")",
		"restarts", snap.Restarts, "saved_at", snap.SavedAt, "sessions", len(snap.Sessions), "workers_expected", len(snap.Instances))
	return nil
}

// restoreSession continues a deployed app's session from its saved state
// (loop).
func (e *Engine) restoreSession(s *session) {
	ss, ok := e.ps.carried[s.app.Name]
	if !ok {
		return
	}
	delete(e.ps.carried, s.app.Name)
	s.acct.total = ss.Total
	s.acct.drops = maps.Clone(ss.Drops)
	if s.acct.drops == nil {
		s.acct.drops = map[string]uint64{}
	}
	if open := ss.Total.Open(); open > 0 {
		e.countRestartLost(s, open, false)
	}
	for m, v := range ss.Scale {
		if s.mods[m] != nil && v > 0 {
			s.scale[m] = v
		}
	}
	for m, v := range ss.Balloon {
		if s.mods[m] != nil && v > 0 {
			s.balloon[m] = v
		}
	}
	if ss.Headroom >= 1 {
		s.headroom = ss.Headroom
	}
	s.resume = map[string]uint64{}
	for _, st := range ss.Streams {
		s.resume[st.ID] = st.NextSeq
	}
	if ss.SLO != s.app.SLO || ss.FPS != s.app.FPS {
		e.log.Warn("app changed since the state was saved; its counters continue", "app", s.app.Name,
			"slo_saved", ss.SLO, "slo", s.app.SLO, "fps_saved", ss.FPS, "fps", s.app.FPS)
	}
	e.log.Info("session restored", "app", s.app.Name, "sent", s.acct.total.Sent, "finished", s.acct.total.Finished,
		"lost_in_flight", ss.Total.Open(), "streams_expected", len(ss.Streams))
}

// countRestartLost counts n frames of s lost to a restart; sent says they
// were never counted sent (a resumed stream's gap).
func (e *Engine) countRestartLost(s *session, n uint64, sent bool) {
	if sent {
		s.acct.total.Sent += n
	}
	s.acct.total.Dropped += n
	s.acct.drops["-: "+string(why.CoordinatorRestart)] += n
	e.ps.lost += n
	for range n {
		if sent {
			s.mx.FrameSent()
		}
		s.mx.Frame(string(Dropped), "-", why.CoordinatorRestart, 0)
	}
}

// resumed is called with a restored stream's first frame (loop): frames it
// numbered between the last one the store saw and this one were sent while
// the coordinator was away (or after its last save): lost.
func (e *Engine) resumed(st *stream, seq uint64) {
	st.resumed = false
	if seq <= st.next {
		return // nothing missing, or the stream numbers afresh
	}
	gap := seq - st.next
	if gap > maxGap {
		e.log.Warn("resumed stream skipped too many frames to believe; not counted", "stream", st.id, "from", st.next, "to", seq)
		return
	}
	e.countRestartLost(st.s, gap, true)
	e.log.Info("stream resumed", "app", st.s.app.Name, "stream", st.id, "lost_while_away", gap)
}

// snapshot is the engine's state to save (loop).
func (e *Engine) snapshot() *Snapshot {
	e.ps.seq++
	snap := &Snapshot{Version: SnapshotVersion, SavedAt: e.now(), ReplansTotal: e.nextPlan, ReplansUnchanged: e.unchanged,
		Sessions: []SessionState{}, Instances: []InstanceRecord{}, seq: e.ps.seq}
	if e.ps.restored != nil {
		snap.Restarts = e.ps.restored.Restarts
	}
	expired := e.ps.restored != nil && e.now().Sub(e.ps.restoredAt) > resumeWindow
	for _, id := range e.appIDs() {
		s := e.sessions[id]
		ss := SessionState{App: id, FPS: s.app.FPS, SLO: s.app.SLO, Total: s.acct.total, Drops: maps.Clone(s.acct.drops),
			Scale: maps.Clone(s.scale), Balloon: maps.Clone(s.balloon), Headroom: s.headroom}
		for sid, st := range s.streams {
			ss.Streams = append(ss.Streams, StreamState{ID: sid, NextSeq: st.next})
		}
		if expired {
			s.resume = nil
		}
		for sid, next := range s.resume {
			ss.Streams = append(ss.Streams, StreamState{ID: sid, NextSeq: next})
		}
		sort.Slice(ss.Streams, func(i, j int) bool { return ss.Streams[i].ID < ss.Streams[j].ID })
		ss.Streams = ss.Streams[:min(len(ss.Streams), maxPersistStreams)]
		snap.Sessions = append(snap.Sessions, ss)
	}
	for _, id := range slices.Sorted(maps.Keys(e.ps.carried)) {
		snap.Sessions = append(snap.Sessions, e.ps.carried[id])
	}
	if expired {
		e.ps.expect = map[string]string{}
	}
	for _, in := range e.sortedInsts() {
		if in.registered {
			snap.Instances = append(snap.Instances, InstanceRecord{ID: in.id, Type: string(in.typ)})
		}
	}
	for _, id := range slices.Sorted(maps.Keys(e.ps.expect)) {
		snap.Instances = append(snap.Instances, InstanceRecord{ID: id, Type: e.ps.expect[id]})
	}
	snap.Instances = snap.Instances[:min(len(snap.Instances), maxPersistInstances)]
	return snap
}

// startSaver starts the periodic save (Start): every Config.SaveEvery on
// the clock the loop takes a snapshot and hands it to a goroutine that
// writes it (the latest one wins if a write is slow).
func (e *Engine) startSaver() {
	e.ps.pending = make(chan *Snapshot, 1)
	e.ps.quit = make(chan struct{})
	e.ps.saverDone = make(chan struct{})
	go func() {
		defer close(e.ps.saverDone)
		for {
			select {
			case snap := <-e.ps.pending:
				if wrote, err := e.write(snap); wrote {
					e.post(func() { e.saved(snap, err) })
				}
			case <-e.ps.quit:
				return
			}
		}
	}()
	e.post(e.armSave)
}

func (e *Engine) armSave() {
	e.ps.tm = e.clk.AfterFunc(e.cfg.SaveEvery, func() {
		e.post(func() {
			snap := e.snapshot()
			select {
			case <-e.ps.pending: // a slow write: this one replaces it
			default:
			}
			e.ps.pending <- snap
			e.armSave()
		})
	})
}

// saved records a write's outcome (loop); failures are logged at most
// every 10 s and counted in Status.
func (e *Engine) saved(snap *Snapshot, err error) {
	if err == nil {
		e.ps.saves++
		e.ps.lastSaved = snap.SavedAt
		return
	}
	e.ps.errs++
	e.ps.lastErr = err.Error()
	if now := e.now(); now.Sub(e.ps.lastLog) >= 10*time.Second {
		e.ps.lastLog = now
		e.log.Error("saving coordinator state failed; a restart would lose what happened since the last save", "err", err, "failures", e.ps.errs)
	}
}

// SaveState writes the state now and waits for it (tests; Close does it
// at a clean shutdown). Without a store it does nothing.
func (e *Engine) SaveState() error {
	if e.cfg.Store == nil {
		return nil
	}
	var snap *Snapshot
	e.call(func() { snap = e.snapshot() })
	if snap == nil {
		return errors.New("coordinator closed")
	}
	wrote, err := e.write(snap)
	if wrote {
		e.call(func() { e.saved(snap, err) })
	}
	return err
}

// write saves snap unless a newer snapshot was written already (the
// saver and SaveState or Close may race); wrote says whether it tried.
func (e *Engine) write(snap *Snapshot) (wrote bool, err error) {
	e.ps.writeMu.Lock()
	defer e.ps.writeMu.Unlock()
	if snap.seq <= e.ps.written {
		return false, nil
	}
	if err := e.cfg.Store.Save(snap); err != nil {
		return true, err
	}
	e.ps.written = snap.seq
	return true, nil
}

// persistStatus is Status's view of the store (loop).
func (e *Engine) persistStatus() *PersistStatus {
	if e.cfg.Store == nil {
		return nil
	}
	ps := &PersistStatus{RestoredAt: e.ps.restoredAt, LostFrames: e.ps.lost, Saves: e.ps.saves, SaveErrors: e.ps.errs,
		LastError: e.ps.lastErr, LastSaved: e.ps.lastSaved}
	if e.ps.restored != nil {
		ps.Restarts = e.ps.restored.Restarts
	}
	for _, id := range e.appIDs() {
		for sid := range e.sessions[id].resume {
			ps.AwaitingStreams = append(ps.AwaitingStreams, sid)
		}
	}
	sort.Strings(ps.AwaitingStreams)
	ps.AwaitingWorkers = slices.Sorted(maps.Keys(e.ps.expect))
	return ps
}
