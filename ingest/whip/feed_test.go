package whip

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// h264AUs encodes n pattern frames as a camera sends them: Annex-B access
// units, a key frame every keyEvery.
func h264AUs(t *testing.T, n, keyEvery int) [][]byte {
	t.Helper()
	pat, err := synth.NewPattern(160, 120, 2)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := avc.NewEncoder(avc.EncoderConfig{Width: 160, Height: 120, FPS: 10, KeyEvery: keyEvery})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var out [][]byte
	for i := range n {
		f, _, err := pat.Frame(0, uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		es, err := enc.Encode(f, int64(i), i%keyEvery == 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out = append(out, e.Data)
		}
	}
	return out
}

// TestFeed: a camera's stream through the server: pending, admitted at
// its first frame, frames at the session with capture times from its RTP
// timestamps; lost and back (one stream, the gap counted, frames wait for
// a key frame); ended by the camera, it leaves the session.
func TestFeed(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	sink := newSink()
	var logs syncBuffer
	srv, err := New(Config{Apps: map[dag.AppID]float64{"face": 10}, Clock: clk, CPUTime: func() time.Duration { return 0 }, Log: slog.New(slog.NewTextHandler(&logs, nil))}, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	f, err := srv.OpenFeed(ingest.FeedConfig{App: "face", Name: "door", Codec: "h264", Source: "rtsp://cam.local/door"})
	if err != nil {
		t.Fatal(err)
	}
	if info := srv.Streams(); len(info) != 1 || info[0].State != StatePending || info[0].Source != "rtsp://cam.local/door" || info[0].Codec != "h264" {
		t.Fatalf("after open: %+v", info)
	}
	aus := h264AUs(t, 30, 10)
	send := func(from, to int, ts0 uint32) {
		for i := from; i < to; i++ {
			f.Frame(aus[i], ts0+uint32(i)*9000, avc.IsKeyFrame(avc.H264, aus[i]))
			clk.Advance(100 * time.Millisecond)
		}
	}
	send(0, 10, 5000)
	if got := sink.count("door"); got != 10 {
		t.Fatalf("ingested %d of 10 frames", got)
	}
	sink.mu.Lock()
	fr := sink.frames["door"]
	sink.mu.Unlock()
	if gap := fr[5].capture.Sub(fr[4].capture); gap != 100*time.Millisecond {
		t.Errorf("capture gap %v, want 100 ms (RTP 9000 ticks)", gap)
	}
	// The camera goes away for 3 s and comes back mid-GOP: frames wait for
	// the next key frame (frame 20), on a new timeline.
	f.Disconnected("connection reset")
	if info := srv.Streams()[0]; info.CameraLost != 1 || !strings.Contains(info.Waiting, "camera lost: connection reset") {
		t.Errorf("while lost: %+v", info)
	}
	if adm := srv.Admission(); len(adm.Streams) != 1 || adm.Streams[0].ID != "door" || adm.Streams[0].Codec != "h264" ||
		adm.Streams[0].CameraLost != 1 || adm.Streams[0].Waiting == "" || adm.Streams[0].Source != "rtsp://cam.local/door" {
		t.Errorf("the dashboard's view while lost: %+v", adm.Streams)
	}
	if tot := srv.IngestTotals(); tot[0].CameraLost != 1 || tot[0].Codecs["h264"] != 1 {
		t.Errorf("metrics' view while lost: %+v", tot)
	}
	clk.Advance(3 * time.Second)
	send(15, 30, 1)
	info := srv.Streams()[0]
	if info.Ingested != 20 || info.WaitingKey != 5 || info.Waiting != "" || info.GapMS != 3000 || info.State != StateAdmitted {
		t.Errorf("after the camera came back: ingested %d (want 20), waiting-key %d (want 5), waiting %q, gap %v ms (want 3000), state %s",
			info.Ingested, info.WaitingKey, info.Waiting, info.GapMS, info.State)
	}
	f.End(EndClient, "camera removed")
	select {
	case <-f.Done():
	default:
		t.Fatal("Done not closed after End")
	}
	sink.mu.Lock()
	left := sink.left["door"]
	sink.mu.Unlock()
	if !left {
		t.Error("the ended camera's stream did not leave the session")
	}
	// a camera's stream is said to be one in the log (issue 43: it said
	// "whip stream admitted")
	if l := logs.String(); !strings.Contains(l, `msg="camera stream admitted"`) || !strings.Contains(l, `msg="camera stream ended"`) || strings.Contains(l, "whip stream") {
		t.Errorf("the log does not call the camera's stream one:\n%s", l)
	}
	f.Frame(aus[0], 1, true) // after the end: ignored, no crash
	if tot := srv.IngestTotals(); tot[0].Ingested != 20 || tot[0].Ended[EndClient] != 1 {
		t.Errorf("totals %+v", tot)
	}
}

// TestOpenFeedRefused: what a camera cannot open, and why.
func TestOpenFeedRefused(t *testing.T) {
	srv, _, _ := newTestServer(t, Config{MaxStreams: 1, MaxPending: 1})
	if _, err := srv.OpenFeed(ingest.FeedConfig{App: "face", Name: "a", Codec: "h264"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  ingest.FeedConfig
		says string
	}{
		{"unknown app", ingest.FeedConfig{App: "nope", Name: "b", Codec: "h264"}, `unknown app "nope" (deployed: face)`},
		{"bad name", ingest.FeedConfig{App: "face", Name: "a/b", Codec: "h264"}, `stream name "a/b"`},
		{"codec", ingest.FeedConfig{App: "face", Name: "b", Codec: "mjpeg"}, `codec "mjpeg": a camera's stream is h264 or h265`},
		{"pending limit", ingest.FeedConfig{App: "face", Name: "b", Codec: "h264"}, "pending limit reached"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := srv.OpenFeed(c.cfg); err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("%v; want %q", err, c.says)
			}
		})
	}
	srv2, _, _ := newTestServer(t, Config{})
	if _, err := srv2.OpenFeed(ingest.FeedConfig{App: "face", Name: "a", Codec: "h264"}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv2.OpenFeed(ingest.FeedConfig{App: "face", Name: "a", Codec: "h264"}); err == nil || !strings.Contains(err.Error(), `a stream named "a" is live already`) {
		t.Errorf("duplicate name: %v", err)
	}
}

// TestFeedEnds: a camera's stream that never decodes a frame is ended at
// three connect timeouts (it must not hold a pending slot for ever), and
// one whose frames the session keeps refusing is ended after 10 in a row,
// every refused frame counted; the camera reads why from Ended.
func TestFeedEnds(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	sink := newSink()
	srv, err := New(Config{Apps: map[dag.AppID]float64{"face": 0}, Clock: clk, CPUTime: func() time.Duration { return 0 }}, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	silent, err := srv.OpenFeed(ingest.FeedConfig{App: "face", Name: "silent", Codec: "h264"})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(29 * time.Second)
	if kind, _ := silent.Ended(); kind != "" {
		t.Fatalf("ended at 29 s: %s", kind)
	}
	clk.Advance(time.Second)
	<-silent.Done()
	if kind, why := silent.Ended(); kind != EndConnectTimeout || !strings.Contains(why, "no video frame decoded within 30s of the camera's stream opening") {
		t.Errorf("a silent camera's stream: %s %q", kind, why)
	}

	refused, err := srv.OpenFeed(ingest.FeedConfig{App: "face", Name: "refused", Codec: "h264"})
	if err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	sink.ingestErr = errors.New("coordinator unreachable")
	sink.mu.Unlock()
	aus := h264AUs(t, 12, 12)
	for i, au := range aus {
		refused.Frame(au, uint32(i)*9000, i == 0)
		clk.Advance(100 * time.Millisecond)
	}
	<-refused.Done()
	kind, why := refused.Ended()
	info := srv.Streams()
	var st StreamInfo
	for _, s := range info {
		if s.ID == "refused" {
			st = s
		}
	}
	if kind != EndError || !strings.Contains(why, "the session refused 10 frames in a row: coordinator unreachable") || st.Refused != 10 || st.Ingested != 0 {
		t.Errorf("refused frames: end %s %q, refused %d, ingested %d", kind, why, st.Refused, st.Ingested)
	}
}

// reorderingDecoder releases each picture one access unit late, as a
// decoder of a stream with B-frames does, stamped with its own unit.
type reorderingDecoder struct {
	held  int64
	has   bool
	calls int
}

func (d *reorderingDecoder) DecodeAt(data []byte, stamp int64) (*media.Frame, int64, error) {
	d.calls++
	prev, had := d.held, d.has
	d.held, d.has = stamp, true
	if !had {
		return nil, 0, nil
	}
	return media.NewFrame(16, 16), prev, nil
}
func (d *reorderingDecoder) SkipAt(data []byte, stamp int64) error {
	_, _, err := d.DecodeAt(data, stamp)
	return err
}
func (d *reorderingDecoder) Decode([]byte) (*media.Frame, error) {
	panic("Decode on a stamped decoder")
}
func (d *reorderingDecoder) Skip([]byte) error { panic("Skip on a stamped decoder") }
func (d *reorderingDecoder) Close()            {}

// TestReorderedCapture: a picture a decoder releases late (B-frames) goes
// to the session with its own frame's capture time, not that of the frame
// that released it; the first frame, which released nothing, is counted
// (no_picture).
func TestReorderedCapture(t *testing.T) {
	sink := newSink()
	p, st := testPipelineCodec(t, sink, CodecH264)
	p.dec = &reorderingDecoder{}
	t0 := time.Unix(1e9, 0)
	for i := range 5 {
		p.frame(codedFrame{Data: []byte{0, 0, 0, 1, 0x65}, TS: uint32(i * 9000), Key: true}, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	sink.mu.Lock()
	got := sink.frames["s"]
	sink.mu.Unlock()
	if len(got) != 4 || st.c.noPicture.Load() != 1 {
		t.Fatalf("%d frames at the session, %d without a picture; want 4 and 1", len(got), st.c.noPicture.Load())
	}
	// Frame i arrives at t0 + i x 100 ms with RTP time i x 100 ms: its
	// capture time is its arrival (the first frame anchors the clock).
	for i, f := range got {
		if want := t0.Add(time.Duration(i) * 100 * time.Millisecond); !f.capture.Equal(want) {
			t.Errorf("picture %d (released by frame %d): capture t0+%v, want t0+%v (its own frame's)", i, i+1, f.capture.Sub(t0), want.Sub(t0))
		}
	}
}

// syncBuffer is a log sink the server's goroutines may write to while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
