package remote

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// routedCameras are reconnecting synthetic cameras that route their
// streams (issue 41): to the ingest worker the coordinator names.
type routedCameras struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	results []*source.StreamResult
	logs    []*logBuf
}

func (c *loopback) routedCameras(t *testing.T, n int) *routedCameras {
	t.Helper()
	pat, err := synth.NewPattern(320, 240, 3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs := &routedCameras{cancel: cancel, results: make([]*source.StreamResult, n), logs: make([]*logBuf, n)}
	for i := range n {
		cs.logs[i] = &logBuf{}
		cs.wg.Add(1)
		go func() {
			defer cs.wg.Done()
			rc := source.Reconnect{DialIngest: client.Dial, Log: slog.New(slog.NewTextHandler(cs.logs[i], nil))}
			r, err := source.StreamReconnecting(ctx, c.cc, "traffic", "cam-"+string(rune('a'+i)), pat, i, 10, 0, rc)
			if err != nil {
				t.Error(err)
			}
			cs.results[i] = r
		}()
	}
	return cs
}

func (cs *routedCameras) stop() []*source.StreamResult {
	cs.cancel()
	cs.wg.Wait()
	return cs.results
}

// TestIngestOnWorkers: the traffic app with two cameras routed to two
// ingest workers. The coordinator receives each frame's identity and
// never its pixels: what it takes in a frame is bounded by a small
// constant (references, results' metadata, heartbeats), against 230,520
// bytes a 320x240 frame when it ingests them itself (TestDirectDataPlane).
// Then an ingest worker dies: its camera routes again and goes on through
// the other, as one stream; every frame the coordinator saw ends finished,
// late or dropped with a reason.
func TestIngestOnWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a few seconds of live streams")
	}
	c, workers, thumbs := startIngestFleetThumbs(t, "gpu-a", "gpu-b")
	cams := c.routedCameras(t, 2)
	defer cams.stop()
	defer func() {
		if t.Failed() {
			for i, l := range cams.logs {
				t.Logf("camera %d:\n%s", i, l.String())
			}
			for id, w := range workers {
				t.Logf("worker %s: ingest %+v", id, w.ingest)
			}
			t.Logf("status %+v ingested %+v", c.e.Status().Sessions, c.srv.Ingested())
		}
	}()
	// frames ended, not finished: on a loaded machine the 400 ms SLO may
	// drop most of them (cannot-finish), which is not what this test is of
	waitFor(t, "both cameras ingested on workers and frames ended", 30*time.Second, func() bool {
		st := c.e.Status()
		if len(st.Sessions) == 0 {
			return false
		}
		tot := st.Sessions[0].Total
		return workers["cpu-a"].ingest.Stats().Frames > 0 && workers["cpu-b"].ingest.Stats().Frames > 0 &&
			tot.Finished+tot.Late+tot.Dropped > 20
	})
	// What the coordinator takes in for the next 60 frames (registrations
	// and routes are behind): a frame is ~6 tasks' results of metadata,
	// its Ingested message and a share of heartbeats. 4 KiB a frame bounds
	// it with room; a 320x240 frame's pixels are 230,400 bytes.
	rcv0, sent0 := c.srv.Received(), c.e.Status().Sessions[0].Total.Sent
	waitFor(t, "60 more frames", 20*time.Second, func() bool { return c.e.Status().Sessions[0].Total.Sent >= sent0+60 })
	rcv, sent := c.srv.Received(), c.e.Status().Sessions[0].Total.Sent-sent0
	const perFrame = 4096
	in := rcv.Sources + rcv.Workers + rcv.Other - rcv0.Sources - rcv0.Workers - rcv0.Other
	if in > perFrame*sent || rcv.Sources != rcv0.Sources {
		t.Errorf("received %+v (before %+v) for %d frames: %d bytes a frame, want at most %d and none from sources (no pixels)", rcv, rcv0, sent, in/sent, perFrame)
	}
	t.Logf("received a frame sent (%d frames): %d bytes (from workers)", sent, in/sent)
	if p := c.srv.Plane(); p.RelayedBytes != 0 {
		t.Errorf("data plane %+v: pixels came through the coordinator", p)
	}
	// The dashboard is read: each camera's thumbnail comes from the worker
	// that ingests it (none came before: the pixels stay there unasked).
	for _, cam := range []string{"cam-a", "cam-b"} {
		if thumbs.get(cam) != nil {
			t.Fatalf("a thumbnail of %s before the dashboard asked", cam)
		}
	}
	c.srv.WantThumbs()
	waitFor(t, "both cameras' thumbnails from their ingest workers", 20*time.Second, func() bool {
		return bytes.HasPrefix(thumbs.get("cam-a"), jpegMagic) && bytes.HasPrefix(thumbs.get("cam-b"), jpegMagic)
	})

	// The ingest worker of cam-a's stream dies.
	victim, other := workers["cpu-a"], workers["cpu-b"]
	if victim.ingest.Stats().Open == 0 {
		victim, other = other, victim
	}
	joinedBefore := other.ingest.Stats().Joined
	sentBefore := c.e.Status().Sessions[0].Total.Sent
	victim.kill()
	waitFor(t, "the victim's camera to join on the other ingest worker and frames to go on", 30*time.Second, func() bool {
		st := c.e.Status().Sessions[0]
		return other.ingest.Stats().Joined > joinedBefore && other.ingest.Stats().Open == 2 && st.Total.Sent > sentBefore+20 && st.Streams == 2
	})
	results := cams.stop()
	waitFor(t, "every frame to end", 30*time.Second, func() bool {
		st := c.e.Status().Sessions[0]
		return st.Open == 0 && st.Streams == 0
	})
	st := c.e.Status().Sessions[0]
	tot := st.Total
	var accepted, unconfirmed, rejected uint64
	for i, r := range results {
		if r == nil {
			t.Fatalf("camera %d returned no result", i)
		}
		accepted, unconfirmed, rejected = accepted+r.Accepted, unconfirmed+r.Unconfirmed, rejected+r.Rejected
		if r.Generated != r.Accepted+r.Rejected+r.Unconfirmed+r.Skipped {
			t.Errorf("camera %d: generated %d != accepted %d + rejected %d + unconfirmed %d + skipped %d", i, r.Generated, r.Accepted, r.Rejected, r.Unconfirmed, r.Skipped)
		}
	}
	// The engine saw every frame a clean close confirmed, and at most those
	// and the ones sent to the worker that died.
	if tot.Sent < accepted || tot.Sent > accepted+unconfirmed || rejected != 0 {
		t.Errorf("the coordinator saw %d frames; the cameras: accepted %d, unconfirmed %d, rejected %d", tot.Sent, accepted, unconfirmed, rejected)
	}
	if tot.Finished+tot.Late+tot.Dropped != tot.Sent {
		t.Errorf("accounting: sent %d = finished %d + late %d + dropped %d?", tot.Sent, tot.Finished, tot.Late, tot.Dropped)
	}
	var reasons uint64
	for _, n := range st.Drops {
		reasons += n
	}
	if reasons != tot.Dropped {
		t.Errorf("%d frames dropped, %d with a reason: %v", tot.Dropped, reasons, st.Drops)
	}
	if in := c.srv.Ingested(); in.Rejected != 0 || in.Frames != tot.Sent {
		t.Errorf("ingested %+v: want every frame the engine saw, none refused", in)
	}
	if rcv := c.srv.Received(); rcv.Sources > 64<<10 {
		t.Errorf("the sources sent the coordinator %d bytes: routes only, no frames", rcv.Sources)
	}
	if l := c.e.Loop(); l.Events == 0 || l.Busy <= 0 {
		t.Errorf("the engine loop's counters %+v: it ran events", l)
	}
	t.Logf("victim %s; totals %+v; drops %v; cameras %+v %+v", victim.id, tot, st.Drops, *results[0], *results[1])
}

// TestRoutedForwarder: the cameras `mdag source --camera` decodes go to
// ingest workers too (source.NewRoutedForwarder): no frame's pixels reach
// the coordinator; when the stream's ingest worker dies the stream joins
// again, routed to the other, and its frames go on.
func TestRoutedForwarder(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a few seconds of a live stream")
	}
	c, workers := startIngestFleet(t, "gpu-a")
	f := source.NewRoutedForwarder(c.cc, client.Dial)
	defer f.Close()
	if err := f.Join("traffic", "door"); err != nil {
		t.Fatal(err)
	}
	frame := media.NewFrame(320, 240)
	var seq uint64
	send := func(n int) {
		for range n {
			if err := f.Ingest("door", seq, time.Now(), frame, nil); err != nil {
				t.Fatal(err)
			}
			seq++
			<-time.After(20 * time.Millisecond) // a camera's pace, roughly: frames that find the stream broken are skipped
		}
	}
	holder := func() *directWorker {
		for _, w := range workers {
			if w.ingest != nil && w.ingest.Stats().Open == 1 {
				return w
			}
		}
		return nil
	}
	send(10)
	waitFor(t, "door's frames held by an ingest worker", 10*time.Second, func() bool { return holder() != nil && c.srv.Ingested().Frames >= 5 })
	victim := holder()
	victim.kill()
	waitFor(t, "door joined again on the other ingest worker", 20*time.Second, func() bool {
		send(1)
		h := holder()
		return h != nil && h != victim && h.ingest.Stats().Frames > 0
	})
	before := c.srv.Ingested().Frames
	send(5)
	waitFor(t, "door's frames through the other worker", 10*time.Second, func() bool { return c.srv.Ingested().Frames >= before+5 })
	if err := f.Leave("door"); err != nil {
		t.Fatal(err)
	}
	if rcv := c.srv.Received(); rcv.Sources > 16<<10 {
		t.Errorf("the forwarder sent the coordinator %d bytes: routes only, no frames", rcv.Sources)
	}
	waitFor(t, "door to leave", 10*time.Second, func() bool { return c.e.Status().Sessions[0].Streams == 0 })
}

// startIngestFleet serves the traffic app with a V100 worker of each ID in
// gpus and two CPU workers that ingest, cpu-a and cpu-b, all on the
// direct data plane.
func startIngestFleet(t *testing.T, gpus ...string) (*loopback, map[string]*directWorker) {
	t.Helper()
	c, workers, _ := startIngestFleetThumbs(t, gpus...)
	return c, workers
}

// thumbSink is the dashboard's side of Server.Thumbs in tests: the last
// thumbnail of each stream.
type thumbSink struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (k *thumbSink) put(stream string, jpeg []byte) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string][]byte{}
	}
	k.m[stream] = jpeg
}

func (k *thumbSink) get(stream string) []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.m[stream]
}

// startIngestFleetThumbs is startIngestFleet with the coordinator's
// thumbnails going to the returned sink.
func startIngestFleetThumbs(t *testing.T, gpus ...string) (*loopback, map[string]*directWorker, *thumbSink) {
	t.Helper()
	app, prof := loadExample(t, "traffic")
	thumbs := &thumbSink{}
	c := startServer(t, app, prof, &Server{Heartbeat: 100 * time.Millisecond, Thumbs: thumbs.put})
	workers := map[string]*directWorker{}
	for _, id := range gpus {
		workers[id] = c.directWorkerWith(t, id, "V100", false)
	}
	for _, id := range []string{"cpu-a", "cpu-b"} {
		workers[id] = c.directWorkerWith(t, id, "CPU", true)
	}
	return c, workers, thumbs
}
