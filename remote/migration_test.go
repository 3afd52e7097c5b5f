package remote

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/allocator/milp"
	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules"
	"github.com/mdag/mdag/remote/source"
)

// TestDistributedTrackMigration is issue 23's acceptance test: the tracker
// app (detect -> crop -> reid -> track) served by a coordinator and its
// workers over loopback gRPC, two CPU workers among them. Mid-stream the
// CPU worker holding the streams' `track` state is drained (a forced
// re-plan): the module moves to the other CPU worker and each stream's
// tracker state moves with it (export, transfer, import). Then:
//
//   - no frame is lost to the move: nothing dropped for want of a route,
//     a worker or a loaded module, every frame accounted;
//   - zero id switches: the tracks of every frame that reached the
//     tracker are exactly those of one uninterrupted tracker run over the
//     same frames (the same detections grouped into the same tracks, ids
//     mapped one to one), which a state lost or frames reordered by the
//     move would break;
//   - one migrate event per stream, no reset.
func TestDistributedTrackMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("streams ~5 s over loopback gRPC")
	}
	r := serveTracker(t)
	e, holder, app, pat, streams := r.e, r.holder, r.app, r.pat, r.streams
	drained := time.Now()
	if err := e.Drain(holder); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "each stream's state to move", 10*time.Second, func() bool {
		ms := trackStatus(e.Status())
		return ms != nil && ms.Events["migrate"] == 2
	})
	moved := time.Since(drained)
	waitFor(t, "1.5 s of frames on the new holder", 10*time.Second, func() bool { return time.Since(drained) > moved+1500*time.Millisecond })
	st := r.finish(t)
	ss := st.Sessions[0]
	tot := ss.Total
	for k, n := range ss.Drops {
		for _, r := range []string{"no-instance", "worker-lost", "no-plan", "module-not-loaded", "unloaded", "queue-full", "bad-task", "module-error"} {
			if len(k) >= len(r) && k[len(k)-len(r):] == r {
				t.Errorf("%d frames dropped %q: the move lost them", n, k)
			}
		}
	}
	ms := trackStatus(st)
	if ms.Events["reset"] != 0 || ms.Events["restore"] != 0 || ms.Events["failed"] != 0 {
		t.Errorf("state events %v: want migrations only", ms.Events)
	}
	for _, in := range st.Instances {
		if in.ID == holder && slices.Contains(in.Modules, "tracker/track") {
			t.Errorf("the drained worker %s still hosts track: %v", holder, in.Modules)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range streams {
		checkSameTracks(t, app, id, i, pat, r.results[id])
	}
	t.Logf("drained %s; state moved in %v (pause p50 %.2f ms, max %.2f ms); %d frames: %d finished, %d late, %d dropped %v",
		holder, moved.Round(time.Millisecond), ms.PauseP50MS, ms.PauseMaxMS, tot.Sent, tot.Finished, tot.Late, tot.Dropped, ss.Drops)
}

// trackerServed is the tracker app served over loopback gRPC to two
// V100 and two CPU workers, two streams of two people streaming into it,
// waited for until both streams have tracker state on one CPU worker.
type trackerServed struct {
	app     *dag.App
	e       *coordinator.Engine
	pat     *synth.Pattern
	streams []string
	holder  string
	stop    map[string]func() // each worker's
	mu      sync.Mutex
	results map[string][]coordinator.FrameResult
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func serveTracker(t testing.TB) *trackerServed { return serveTrackerN(t, 2) }

// serveTrackerN is serveTracker with n streams.
func serveTrackerN(t testing.TB, n int) *trackerServed {
	t.Helper()
	app, prof := loadExample(t, "tracker")
	r := &trackerServed{app: app, results: map[string][]coordinator.FrameResult{}, stop: map[string]func(){}}
	for i := range n {
		r.streams = append(r.streams, fmt.Sprintf("cam-%02d", i))
	}
	r.e = newEngine(t, coordinator.Config{MILPSolver: milp.Solver{}, Checkpoint: 300 * time.Millisecond,
		OnFrame: func(fr coordinator.FrameResult) {
			r.mu.Lock()
			r.results[fr.Stream] = append(r.results[fr.Stream], fr)
			r.mu.Unlock()
		}})
	c := startEngine(t, r.e, app, prof, &Server{Heartbeat: 100 * time.Millisecond})
	for _, w := range []struct{ id, typ string }{{"gpu-a", "V100"}, {"gpu-b", "V100"}, {"cpu-a", "CPU"}, {"cpu-b", "CPU"}} {
		r.stop[w.id] = c.worker(t, w.id, w.typ)
	}
	pat, err := synth.NewPattern(320, 240, 2)
	if err != nil {
		t.Fatal(err)
	}
	pat.Classes = []string{"person"}
	r.pat = pat
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for i, id := range r.streams {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if _, err := source.Stream(ctx, c.cc, "tracker", id, pat, i, 10, 0); err != nil {
				t.Error(err)
			}
		}()
	}
	t.Cleanup(r.end)
	waitFor(t, "both streams' tracker state on a worker", 20*time.Second, func() bool {
		st := r.e.Status()
		r.holder = ""
		for _, in := range st.Instances {
			if slices.Contains(in.Modules, "tracker/track") {
				r.holder = in.ID
			}
		}
		ms := trackStatus(st)
		return r.holder != "" && ms != nil && ms.Streams == n && len(st.Sessions[0].Windows) >= 1
	})
	return r
}

// end stops the sources (the streams leave).
func (r *trackerServed) end() {
	r.cancel()
	r.wg.Wait()
}

// finish ends the sources, waits for every frame to end and checks the
// accounting; it returns the status.
func (r *trackerServed) finish(t testing.TB) coordinator.Status {
	t.Helper()
	r.end()
	waitFor(t, "every frame to end", 10*time.Second, func() bool { return r.e.Status().Sessions[0].Open == 0 })
	st := r.e.Status()
	tot := st.Sessions[0].Total
	if tot.Sent == 0 || tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Fatalf("accounting: %+v", tot)
	}
	return st
}

// TestDistributedTrackWorkerKilled: the CPU worker holding the streams'
// tracker state dies mid-stream (its connection ends, as when the process
// is killed). Each stream's state is restored from its last checkpoint on
// the other CPU worker (counted "restore"; "reset" when none was taken), the
// frames it had in flight are dropped worker-lost, and every frame is
// accounted for.
func TestDistributedTrackWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("streams ~3 s over loopback gRPC")
	}
	r := serveTracker(t)
	waitFor(t, "a checkpoint of each stream", 10*time.Second, func() bool {
		var n int
		r.e.Status() // (the checkpoints are taken on the loop)
		for _, id := range r.streams {
			if r.e.HasCheckpoint("tracker", "track", id) {
				n++
			}
		}
		return n == len(r.streams)
	})
	killed := time.Now()
	r.stop[r.holder]()
	waitFor(t, "each stream's state restored", 10*time.Second, func() bool {
		ms := trackStatus(r.e.Status())
		return ms != nil && ms.Events["restore"]+ms.Events["reset"] == 2
	})
	waitFor(t, "1 s of frames after the kill", 10*time.Second, func() bool { return time.Since(killed) > time.Second })
	st := r.finish(t)
	ms := trackStatus(st)
	if ms.Events["restore"] != 2 || ms.Events["migrate"] != 0 {
		t.Errorf("state events %v: want a restore from checkpoint per stream", ms.Events)
	}
	for k, n := range st.Sessions[0].Drops {
		// The kill drops what the worker had in flight and what found no
		// instance before the re-plan: counted, with the reason.
		if !strings.HasSuffix(k, "worker-lost") && !strings.HasSuffix(k, "no-instance") && !strings.HasSuffix(k, "cannot-finish") {
			t.Errorf("%d frames dropped %q", n, k)
		}
	}
	t.Logf("killed %s: %s; drops %v", r.holder, ms.LastEvent, st.Sessions[0].Drops)
}

func trackStatus(st coordinator.Status) *coordinator.StateStatus {
	if len(st.Sessions) == 0 {
		return nil
	}
	for _, m := range st.Sessions[0].Modules {
		if m.Module == "track" {
			return m.State
		}
	}
	return nil
}

// checkSameTracks runs one tracker, uninterrupted, over the frames of the
// stream that reached the tracker (those that completed), in order, with
// the detections the emulated detector reports (the pattern's ground
// truth), and checks each frame's tracks match the served run's: the same
// boxes, with ids mapped one to one for the whole run.
func checkSameTracks(t *testing.T, app *dag.App, stream string, index int, pat *synth.Pattern, res []coordinator.FrameResult) {
	t.Helper()
	m, _ := app.Module("track")
	p, err := modules.Builtin().New("track", m.Params)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ref := p.(modules.Stateful)
	sort.Slice(res, func(i, j int) bool { return res[i].Seq < res[j].Seq })
	toRef, fromRef := map[uint64]uint64{}, map[uint64]uint64{}
	compared := 0
	for _, r := range res {
		if r.Outcome == coordinator.Dropped {
			continue
		}
		_, truth, err := pat.Frame(index, r.Seq)
		if err != nil {
			t.Fatal(err)
		}
		var items []*media.Item
		for _, b := range truth {
			box := b
			items = append(items, &media.Item{Stream: stream, Seq: r.Seq, Region: &box, Labels: []string{b.Class}})
		}
		out, err := ref.ProcessFrame(stream, r.Seq, items)
		if err != nil {
			t.Fatal(err)
		}
		var want []media.Track
		for _, o := range out {
			want = append(want, o.Tracks...)
		}
		if len(want) != len(r.Tracks) {
			t.Errorf("%s frame %d: served %d tracks %v, an uninterrupted tracker %d %v", stream, r.Seq, len(r.Tracks), r.Tracks, len(want), want)
			continue
		}
		for _, w := range want {
			i := slices.IndexFunc(r.Tracks, func(g media.Track) bool { return g.Box == w.Box })
			if i < 0 {
				t.Errorf("%s frame %d: no served track at %+v (served %v)", stream, r.Seq, w.Box, r.Tracks)
				continue
			}
			g := r.Tracks[i]
			if x, ok := toRef[g.ID]; ok && x != w.ID || fromRef[w.ID] != 0 && fromRef[w.ID] != g.ID {
				t.Errorf("%s frame %d: id switch: served track %d is the uninterrupted tracker's %d (mapped %d -> %d before)",
					stream, r.Seq, g.ID, w.ID, g.ID, toRef[g.ID])
			}
			toRef[g.ID], fromRef[w.ID] = w.ID, g.ID
			compared++
		}
	}
	if compared == 0 {
		t.Errorf("%s: no track compared (%d results)", stream, len(res))
	}
	t.Log(fmt.Sprintf("%s: %d tracks in %d frames compared, ids %v", stream, compared, len(res), toRef))
}

// BenchmarkDistributedMigrationPause is TestDistributedTrackMigration's
// figure: how long each stream's frames wait at the tracker while its
// state moves from the drained CPU worker to the other over loopback gRPC,
// p50 and p99 over the streams.
func BenchmarkDistributedMigrationPause(b *testing.B) {
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			var p50, p99 []float64
			for range b.N {
				r := serveTrackerN(b, n)
				if err := r.e.Drain(r.holder); err != nil {
					b.Fatal(err)
				}
				waitFor(b, "every stream's state to move", 20*time.Second, func() bool {
					ms := trackStatus(r.e.Status())
					return ms != nil && ms.Events["migrate"] == n
				})
				ms := trackStatus(r.finish(b))
				p50, p99 = append(p50, ms.PauseP50MS), append(p99, ms.PauseP99MS)
			}
			slices.Sort(p50)
			slices.Sort(p99)
			b.ReportMetric(p50[len(p50)/2], "p50-pause-ms")
			b.ReportMetric(p99[len(p99)/2], "p99-pause-ms")
		})
	}
}
