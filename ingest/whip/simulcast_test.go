package whip

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"
	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/clock"
)

// simSender is a pion sender with simulcast: one track per rid, sent as
// encodings of one RTPSender (AddEncoding), each layer encoded at its own
// size (libvpx or x264), every packet tagged with the mid and rid header
// extensions (pion does not add them), a key frame on a layer when the
// server asks for one (PLI on that layer's SSRC).
type simSender struct {
	pc       *webrtc.PeerConnection
	sender   *webrtc.RTPSender
	rids     []string
	tracks   []*webrtc.TrackLocalStaticRTP
	encs     []encoder
	packs    []rtp.Packetizer
	pats     []*synth.Pattern
	keyReq   []atomic.Bool
	plis     []atomic.Uint64
	mid      string
	midID    uint8
	ridID    uint8
	resource string
	Stream   string
	wg       sync.WaitGroup
	n        uint64
}

type simLayer struct {
	rid  string
	w, h int
}

func newSimSender(t *testing.T, base, app, codec string, layers []simLayer) *simSender {
	t.Helper()
	api, err := clientAPI([]string{codec})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		t.Fatal(err)
	}
	s := &simSender{pc: pc, keyReq: make([]atomic.Bool, len(layers)), plis: make([]atomic.Uint64, len(layers))}
	t.Cleanup(s.close)
	capability := webrtc.RTPCodecCapability{MimeType: codecMime(codec), ClockRate: videoClockRate}
	if codec == CodecH264 {
		capability.SDPFmtpLine = "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f"
	}
	for i, l := range layers {
		tr, err := webrtc.NewTrackLocalStaticRTP(capability, "video", "mdag", webrtc.WithRTPStreamID(l.rid))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			s.sender, err = pc.AddTrack(tr)
		} else {
			err = s.sender.AddEncoding(tr)
		}
		if err != nil {
			t.Fatalf("layer %s: %v", l.rid, err)
		}
		enc, err := newEncoder(ClientConfig{Codec: codec, Width: l.w, Height: l.h, FPS: 30, BitrateKbps: 300})
		if err != nil {
			t.Fatal(err)
		}
		pat, err := synth.NewPattern(l.w, l.h, 2)
		if err != nil {
			t.Fatal(err)
		}
		var payloader rtp.Payloader = &codecs.VP8Payloader{EnablePictureID: true}
		if codec == CodecH264 {
			payloader = &codecs.H264Payloader{}
		}
		s.rids, s.tracks, s.encs, s.pats = append(s.rids, l.rid), append(s.tracks, tr), append(s.encs, enc), append(s.pats, pat)
		s.packs = append(s.packs, rtp.NewPacketizer(1200, 96, 0, payloader, rtp.NewRandomSequencer(), videoClockRate))
	}
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		t.Fatal(err)
	}
	<-gathered
	resp, err := http.Post(base+"/whip/"+app, "application/sdp", bytes.NewReader([]byte(pc.LocalDescription().SDP)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %d %s", resp.StatusCode, body)
	}
	loc, _ := url.Parse(base)
	s.resource = loc.JoinPath(resp.Header.Get("Location")).String()
	s.Stream = resp.Header.Get("Mdag-Stream")
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		t.Fatalf("answer: %v", err)
	}
	for _, tr := range pc.GetTransceivers() {
		if tr.Sender() == s.sender {
			s.mid = tr.Mid()
		}
	}
	for _, e := range s.sender.GetParameters().HeaderExtensions {
		switch e.URI {
		case sdp.SDESMidURI:
			s.midID = uint8(e.ID)
		case sdp.SDESRTPStreamIDURI:
			s.ridID = uint8(e.ID)
		}
	}
	if s.mid == "" || s.midID == 0 || s.ridID == 0 {
		t.Fatalf("mid %q, header extensions mid %d rid %d: the answer did not accept simulcast", s.mid, s.midID, s.ridID)
	}
	for i, rid := range s.rids {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				pkts, _, err := s.sender.ReadSimulcastRTCP(rid)
				if err != nil {
					return
				}
				for _, p := range pkts {
					if _, ok := p.(*rtcp.PictureLossIndication); ok {
						s.keyReq[i].Store(true)
						s.plis[i].Add(1)
					}
				}
			}
		}()
	}
	return s
}

// send encodes and sends one frame on every layer (a key frame on a
// layer asked for one, and on every layer each keyEvery frames).
func (s *simSender) send(t *testing.T, keyEvery uint64) {
	t.Helper()
	ts := uint32(s.n * videoClockRate / 30)
	for i := range s.tracks {
		f, _, err := s.pats[i].Frame(0, s.n)
		if err != nil {
			t.Fatal(err)
		}
		key := s.keyReq[i].Swap(false) || s.n%keyEvery == 0
		out, err := s.encs[i].Encode(f, int64(s.n), key)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range out {
			for _, pkt := range s.packs[i].Packetize(e.Data, 0) {
				pkt.Timestamp = ts + uint32(i)*7777 // each layer its own timeline
				if err := pkt.Header.SetExtension(s.midID, []byte(s.mid)); err != nil {
					t.Fatal(err)
				}
				if err := pkt.Header.SetExtension(s.ridID, []byte(s.rids[i])); err != nil {
					t.Fatal(err)
				}
				if err := s.tracks[i].WriteRTP(pkt); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	s.n++
}

func (s *simSender) close() {
	if s.resource != "" {
		if req, err := http.NewRequest(http.MethodDelete, s.resource, nil); err == nil {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}
	_ = s.pc.Close() // ends the RTCP readers
	s.wg.Wait()
	for _, e := range s.encs {
		e.Close()
	}
}

func layerOf(info StreamInfo, rid string) LayerInfo {
	for _, l := range info.Layers {
		if l.RID == rid {
			return l
		}
	}
	return LayerInfo{}
}

// TestSimulcast: a pion sender offers three layers (160x120, 320x240,
// 640x480) for an app whose frames are at most 320x240: the server decodes
// the 320x240 layer only (the other layers' frames arrive, none is
// decoded); CPU overload (fed through the CPUTime seam, the fake clock
// drives the load samples) steps it down to the 160x120 layer at that
// layer's key frame (asked for with a PLI) without a decode error, before
// any stream is shed; when the load has stayed low the stream steps back
// up.
func TestSimulcast(t *testing.T) {
	for _, codec := range []string{CodecVP8, CodecH264} {
		t.Run(codec, func(t *testing.T) {
			clk := clock.NewFake(time.Now())
			var cpuNS atomic.Int64
			srv, sink, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"face": 0},
				MaxWidth: 320, MaxHeight: 240, CPUCores: 1, CPUCeiling: 0.5, StreamCost: 0.01, ShedAfter: 2 * time.Second,
				IdleTimeout: time.Hour, ConnectTimeout: time.Hour, Clock: clk,
				CPUTime: func() time.Duration { return time.Duration(cpuNS.Load()) }})
			s := newSimSender(t, hs.URL, "face", codec, []simLayer{{"q", 160, 120}, {"h", 320, 240}, {"f", 640, 480}})
			info := func() StreamInfo {
				for _, i := range srv.Streams() {
					if i.ID == s.Stream {
						return i
					}
				}
				t.Fatalf("stream %s is not listed", s.Stream)
				return StreamInfo{}
			}
			pace := time.NewTicker(time.Second / 30) // a real-time source
			defer pace.Stop()
			// sendUntil sends frames until cond holds (at most max frames).
			sendUntil := func(what string, maxFrames int, cond func(StreamInfo) bool) StreamInfo {
				t.Helper()
				for range maxFrames {
					<-pace.C
					s.send(t, 45)
					if i := info(); cond(i) {
						return i
					}
				}
				t.Fatalf("%s: not after %d frames: %+v", what, maxFrames, info())
				return StreamInfo{}
			}
			// The fitting layer, h, once all three are known.
			st := sendUntil("decoding layer h", 150, func(i StreamInfo) bool {
				return len(i.Layers) == 3 && i.Layer == "h 320x240" && layerOf(i, "h").Decoded > 0
			})
			for range 20 {
				<-pace.C
				s.send(t, 45)
			}
			after := info()
			for _, rid := range []string{"q", "f"} {
				was, now := layerOf(st, rid), layerOf(after, rid)
				if now.Decoded != was.Decoded || now.Frames < was.Frames+15 {
					t.Errorf("layer %s while h is decoded: %d frames arrived, %d decoded (want arrivals and no decoding)",
						rid, now.Frames-was.Frames, now.Decoded-was.Decoded)
				}
			}
			if h := layerOf(after, "h"); h.Decoded < layerOf(st, "h").Decoded+15 || h.Width != 320 {
				t.Errorf("layer h: %+v", h)
			}
			if f := layerOf(after, "f"); f.Width != 640 || f.Height != 480 {
				t.Errorf("layer f's size %dx%d, want 640x480 (from its key frames)", f.Width, f.Height)
			}
			// Two newer streams without simulcast (offers that send no
			// media, admitted): those shedding would end.
			clk.Advance(time.Millisecond) // admitted after the simulcast stream
			plain := admitStreams(t, srv, hs.URL, clk, 2)
			// Overload: 0.9 cores used of a capacity of 0.5. The simulcast
			// stream steps down; nothing is shed.
			clk.Advance(time.Second) // the first sample: the baseline
			cpuNS.Add(int64(900 * time.Millisecond))
			clk.Advance(time.Second)
			if a := srv.Admission(); a.Admitted != 3 || a.Ended[EndOverload] != 0 || a.OverloadedFor == 0 {
				t.Fatalf("at the first overloaded sample: %+v (want the simulcast stream stepped down, none shed)", a)
			}
			ingestedBefore := sink.count(s.Stream)
			st = sendUntil("stepping down to q", 150, func(i StreamInfo) bool { return i.Layer == "q 160x120" })
			if st.LayerDown != 1 || st.DecodeErrors != 0 || st.State != StateAdmitted || srv.Admission().Ended[EndOverload] != 0 {
				t.Errorf("after the step down: %+v", st)
			}
			a := srv.Admission().Streams
			i := slices.IndexFunc(a, func(x ingest.Stream) bool { return x.ID == s.Stream })
			if i < 0 || a[i].Layer != "q 160x120" || a[i].LayerDown != 1 || len(a[i].Layers) != 3 {
				t.Errorf("status's stream view: %+v", a)
			} else if l := slices.Sorted(slices.Values(a[i].Layers)); !slices.Equal(l, []string{"f 640x480", "h 320x240", "q 160x120"}) {
				t.Errorf("status's layers: %v", a[i].Layers)
			}
			if q := layerOf(st, "q"); q.Decoded == 0 || s.plis[0].Load() == 0 {
				t.Errorf("layer q: %+v, %d PLIs on it", q, s.plis[0].Load())
			}
			for range 10 {
				<-pace.C
				s.send(t, 45)
			}
			// The frames handed to the session: numbered without a gap,
			// 320x240 then 160x120.
			sink.mu.Lock()
			frames := sink.frames[s.Stream]
			sink.mu.Unlock()
			small := 0
			for i, f := range frames {
				if f.seq != uint64(i+1) {
					t.Fatalf("frame %d has seq %d", i, f.seq)
				}
				if i < ingestedBefore {
					continue
				}
				if f.w == 160 {
					small++
				} else if small > 0 || f.w != 320 {
					t.Errorf("frame %d: %dx%d after the switch to 160x120", f.seq, f.w, f.h)
				}
			}
			if small < 5 || len(frames) <= ingestedBefore {
				t.Errorf("%d frames at 160x120 of %d", small, len(frames))
			}
			// Still overloaded, and no layer below: after ShedAfter the
			// newest streams are shed, the simulcast stream (the oldest)
			// stays.
			for range 3 {
				cpuNS.Add(int64(900 * time.Millisecond))
				clk.Advance(time.Second)
			}
			waitFor(t, "the plain streams shed", 10*time.Second, func() bool {
				return srv.lookup(plain[0].id) == nil && srv.lookup(plain[1].id) == nil
			})
			if a := srv.Admission(); a.Admitted != 1 || a.Ended[EndOverload] != 2 || info().Layer != "q 160x120" {
				t.Errorf("after shedding: %+v, layer %q", a, info().Layer)
			}
			// Room again: the load stays low for stepUpAfter intervals.
			for range stepUpAfter + 2 {
				cpuNS.Add(int64(50 * time.Millisecond))
				clk.Advance(time.Second)
			}
			st = sendUntil("stepping back up to h", 150, func(i StreamInfo) bool { return i.Layer == "h 320x240" })
			if st.LayerDown != 0 || st.LayerSwitches < 2 || st.DecodeErrors != 0 {
				t.Errorf("after the step up: %+v", st)
			}
			t.Logf("%s: %+v", codec, st)
		})
	}
}

// TestLayerChoice: the layer decoded is the smallest covering the app's
// frame size, else the largest, less the steps down; a step down stops at
// the smallest layer, a step up at the fitting one.
func TestLayerChoice(t *testing.T) {
	sizes := [][2]int{{640, 360}, {320, 180}, {1280, 720}} // arrival order, not size order
	cases := []struct {
		name      string
		maxW      int
		maxH      int
		downs     int // step(-1) calls
		want      int // index in sizes of the layer chosen
		stepped   int // step(-1) calls that moved
		canDown   bool
		upsToFits int // step(+1) calls that move back to the fitting layer
	}{
		{"fits 640x360", 640, 360, 0, 0, 0, true, 0},
		{"between: the next larger", 400, 200, 0, 0, 0, true, 0},
		{"smallest", 160, 90, 0, 1, 0, false, 0},
		{"above all: the largest", 1920, 1080, 0, 2, 0, true, 0},
		{"one down", 1920, 1080, 1, 0, 1, true, 1},
		{"two down", 1920, 1080, 2, 1, 2, false, 2},
		{"not below the smallest", 1920, 1080, 5, 1, 2, false, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := &Server{cfg: Config{MaxWidth: c.maxW, MaxHeight: c.maxH}, clk: clock.NewFake(time.Now()), log: slog.New(slog.DiscardHandler)}
			st := &stream{s: srv, id: "s"} // no peer: no PLIs
			sim := &simulcast{st: st, codec: CodecVP8, dec: &pipeline{st: st}}
			for i, sz := range sizes {
				sim.layers = append(sim.layers, &layer{rid: fmt.Sprint(i), w: sz[0], h: sz[1], p: &pipeline{st: st}})
			}
			chosen := func() *layer {
				sim.mu.Lock()
				defer sim.mu.Unlock()
				if sim.target != nil {
					return sim.target
				}
				return sim.active
			}
			sim.mu.Lock()
			sim.active = sim.layers[0]
			sim.chooseLocked(srv.clk.Now())
			sim.mu.Unlock()
			moved := 0
			for range c.downs {
				if sim.step(-1, "test") {
					moved++
				}
			}
			if got := chosen(); got != sim.layers[c.want] || moved != c.stepped {
				t.Errorf("chose %dx%d after %d of %d steps down, want %dx%d after %d", got.w, got.h, moved, c.downs,
					sizes[c.want][0], sizes[c.want][1], c.stepped)
			}
			if sim.canDown.Load() != c.canDown || int(sim.stepped.Load()) != c.stepped {
				t.Errorf("can step down %v, stepped %d; want %v, %d", sim.canDown.Load(), sim.stepped.Load(), c.canDown, c.stepped)
			}
			ups := 0
			for sim.step(+1, "test") {
				ups++
			}
			if ups != c.upsToFits || sim.stepped.Load() != 0 {
				t.Errorf("%d steps up, want %d", ups, c.upsToFits)
			}
		})
	}
}

// TestKeyFrameSize reads VP8 key frames' sizes and refuses what is not
// one; H.264 key frames are switch points only with their parameter sets.
func TestKeyFrameSize(t *testing.T) {
	key := []byte{0x10, 0x02, 0x00, 0x9d, 0x01, 0x2a, 0x80, 0x02, 0xe0, 0x01, 0x00}
	for _, c := range []struct {
		name string
		b    []byte
		w, h int
		ok   bool
	}{
		{"640x480", key, 640, 480, true},
		{"scale bits ignored", []byte{0x10, 0x02, 0x00, 0x9d, 0x01, 0x2a, 0x80, 0x42, 0xe0, 0xc1}, 640, 480, true},
		{"inter frame", append([]byte{0x11}, key[1:]...), 0, 0, false},
		{"no start code", []byte{0x10, 0x02, 0x00, 0x9d, 0x01, 0x2b, 0x80, 0x02, 0xe0, 0x01}, 0, 0, false},
		{"short", key[:9], 0, 0, false},
		{"zero size", []byte{0x10, 0x02, 0x00, 0x9d, 0x01, 0x2a, 0, 0, 0xe0, 0x01}, 0, 0, false},
	} {
		w, h, ok := vp8KeySize(c.b)
		if w != c.w || h != c.h || ok != c.ok {
			t.Errorf("%s: %dx%d %v, want %dx%d %v", c.name, w, h, ok, c.w, c.h, c.ok)
		}
	}
	sps, pps, idr, p := []byte{0, 0, 0, 1, 0x67, 1}, []byte{0, 0, 1, 0x68, 1}, []byte{0, 0, 1, 0x65, 1}, []byte{0, 0, 1, 0x41, 1}
	cat := func(b ...[]byte) []byte { return bytes.Join(b, nil) }
	for _, c := range []struct {
		name string
		fr   codedFrame
		want bool
	}{
		{"idr with sps and pps", codedFrame{Key: true, Data: cat(sps, pps, idr)}, true},
		{"idr alone (parameter sets lost)", codedFrame{Key: true, Data: idr}, false},
		{"sps without pps", codedFrame{Key: true, Data: cat(sps, idr)}, false},
		{"not a key frame", codedFrame{Data: cat(sps, pps, p)}, false},
	} {
		if got := switchable(CodecH264, c.fr); got != c.want {
			t.Errorf("h264 %s: %v, want %v", c.name, got, c.want)
		}
	}
	if !switchable(CodecVP8, codedFrame{Key: true, Data: key}) || switchable(CodecVP8, codedFrame{Data: key}) {
		t.Error("vp8: a key frame is a switch point, an inter frame is not")
	}
}

// FuzzVP8KeySize: any bytes, never a crash, a size only within 14 bits.
func FuzzVP8KeySize(f *testing.F) {
	f.Add([]byte{0x10, 0x02, 0x00, 0x9d, 0x01, 0x2a, 0x80, 0x02, 0xe0, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		w, h, ok := vp8KeySize(b)
		if ok && (w <= 0 || h <= 0 || w > 0x3fff || h > 0x3fff) {
			t.Fatalf("%dx%d", w, h)
		}
		_ = switchable(CodecH264, codedFrame{Key: true, Data: b})
	})
}

// TestSimulcastSteps: which simulcast streams step down or up at a load
// sample: a stream whose decoding is behind steps down by itself; over
// capacity the newest step down first, as many as shedding would end (the
// saturated app's only when the CPU fits); with room for stepUpAfter
// intervals the oldest stepped-down stream steps up, if its decoding can
// take four times the pixels; each waits two intervals after the last.
func TestSimulcastSteps(t *testing.T) {
	t0 := time.Now()
	now := t0.Add(time.Hour)
	type sim struct {
		app      dag.AppID
		load     float64
		canDown  bool
		stepped  int32
		lastStep time.Duration // before now; 0: never
	}
	cases := []struct {
		name      string
		sims      []sim // oldest first
		last      float64
		cost      float64
		saturated []dag.AppID
		lastShed  time.Duration // before now; 0: never
		roomFor   time.Duration // how long the load has been low; 0: not yet
		down, up  []int         // indices in sims
	}{
		{"behind", []sim{{"a", 0.9, true, 0, 0}}, 0.1, 0.1, nil, 0, 0, []int{0}, nil},
		{"behind at the smallest layer", []sim{{"a", 0.9, false, 1, 0}}, 0.1, 0.1, nil, 0, 0, nil, nil},
		{"behind, stepped a second ago", []sim{{"a", 0.9, true, 0, time.Second}}, 0.1, 0.1, nil, 0, 0, nil, nil},
		{"over: the newest, as many as the excess", []sim{{"a", 0.1, true, 0, 0}, {"a", 0.1, true, 0, 0}, {"a", 0.1, true, 0, 0}}, 0.9, 0.2, nil, 0, 0, []int{2, 1}, nil},
		{"over: those that can", []sim{{"a", 0.1, true, 0, 0}, {"a", 0.1, false, 1, 0}}, 0.6, 0.2, nil, 0, 0, []int{0}, nil},
		{"over, a step a second ago", []sim{{"a", 0.1, true, 0, 0}}, 0.9, 0.2, nil, time.Second, 0, nil, nil},
		{"saturated app only", []sim{{"a", 0.1, true, 0, 0}, {"b", 0.1, true, 0, 0}, {"a", 0.1, true, 0, 0}}, 0.1, 0.2, []dag.AppID{"a"}, 0, 0, []int{2}, nil},
		{"room: the oldest stepped up", []sim{{"a", 0.1, true, 0, 0}, {"a", 0.1, true, 1, 0}, {"a", 0.1, true, 1, 0}}, 0.1, 0.2, nil, 0, stepUpAfter * time.Second, nil, []int{1}},
		{"room, not long enough", []sim{{"a", 0.1, true, 1, 0}}, 0.1, 0.2, nil, 0, 2 * time.Second, nil, nil},
		{"room, its decoding too busy for the next layer", []sim{{"a", 0.3, true, 1, 0}}, 0.1, 0.2, nil, 0, stepUpAfter * time.Second, nil, nil},
		{"load above half the capacity: no step up", []sim{{"a", 0.1, true, 1, 0}}, 0.3, 0.2, nil, 0, stepUpAfter * time.Second, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{cfg: Config{LoadInterval: time.Second}, streams: map[string]*stream{}}
			if c.lastShed > 0 {
				s.lastShed = now.Add(-c.lastShed)
			}
			if c.roomFor > 0 {
				s.roomSince = now.Add(-c.roomFor)
			}
			var sts []*stream
			for i, x := range c.sims {
				st := &stream{s: s, id: fmt.Sprint(i), app: x.app}
				st.adm = admState{admitted: true, admittedAt: t0.Add(time.Duration(i) * time.Second), load: x.load, samples: 2}
				if x.lastStep > 0 {
					st.adm.lastStep = now.Add(-x.lastStep)
				}
				sm := &simulcast{st: st}
				sm.canDown.Store(x.canDown)
				sm.stepped.Store(x.stepped)
				st.sim.Store(sm)
				s.streams[st.id] = st
				sts = append(sts, st)
			}
			v := loadView{capacity: 0.5, cost: c.cost}
			downs, ups := s.simulcastStepsLocked(now, c.last, v, c.saturated)
			var gotDown, gotUp []int
			for _, d := range downs {
				gotDown = append(gotDown, slices.Index(sts, d.st))
			}
			for _, st := range ups {
				gotUp = append(gotUp, slices.Index(sts, st))
			}
			if !slices.Equal(gotDown, c.down) || !slices.Equal(gotUp, c.up) {
				t.Errorf("down %v, up %v; want %v, %v", gotDown, gotUp, c.down, c.up)
			}
		})
	}
}
