package whip

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/pion/rtp"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/ingest/opus"
	"github.com/mdag/mdag/internal/browsertest"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// chunk is an audio chunk the fake sink received.
type chunk struct {
	seq     uint64
	capture time.Time
	a       *media.Audio
}

// IngestAudio makes fakeSink an AudioSink: it records each chunk and
// answers it with a result, as the engine's OnFrame does.
func (f *fakeSink) IngestAudio(id string, seq uint64, capture time.Time, a *media.Audio) error {
	if err := a.Valid(); err != nil {
		return err
	}
	f.mu.Lock()
	if f.ingestErr != nil {
		defer f.mu.Unlock()
		return f.ingestErr
	}
	if f.audio == nil {
		f.audio = map[string][]chunk{}
	}
	f.audio[id] = append(f.audio[id], chunk{seq, capture, a})
	srv := f.srv
	f.mu.Unlock()
	if srv != nil {
		srv.Publish(Result{Stream: id, Frame: seq, Outcome: "finished", LatencyMS: 1})
	}
	return nil
}

func (f *fakeSink) chunks(id string) []chunk {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]chunk(nil), f.audio[id]...)
}

// toneAt is sample i of the test tone: 440 Hz, amplitude 8000, on the
// left channel; half that on the right.
func toneAt(i, ch int) int16 {
	v := 8000 * math.Sin(2*math.Pi*440*float64(i)/opus.SampleRate)
	if ch == 1 {
		v /= 2
	}
	return int16(v)
}

func toneSamples(start, n, channels int) []int16 {
	out := make([]int16, n*channels)
	for i := range n {
		for c := range channels {
			out[i*channels+c] = toneAt(start+i, c)
		}
	}
	return out
}

func rmsOf(pcm []int16, channels, ch int) float64 {
	var s float64
	n := 0
	for i := ch; i < len(pcm); i += channels {
		s += float64(pcm[i]) * float64(pcm[i])
		n++
	}
	return math.Sqrt(s / float64(max(n, 1)))
}

// powerAt is the Goertzel power of channel ch of pcm at freq Hz.
func powerAt(pcm []int16, channels, ch int, freq float64) float64 {
	c := 2 * math.Cos(2*math.Pi*freq/opus.SampleRate)
	var s1, s2 float64
	for i := ch; i < len(pcm); i += channels {
		s1, s2 = float64(pcm[i])+c*s1-s2, s1
	}
	return s1*s1 + s2*s2 - c*s1*s2
}

// TestAudioLoopback: a Go publisher (pion) sends an Opus track of a tone
// into an audio app over real WebRTC; the session receives the decoded
// PCM in 40 ms chunks (the app's 25 chunks a second), numbered from 1,
// with capture times 40 ms apart, as long and as loud as what was sent,
// and the tone's frequency; results come back on the DataChannel.
func TestAudioLoopback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		channels int
		encoded  bool // packets encoded beforehand, sent with WriteOpus (an Ogg Opus file)
	}{{"mono", 1, false}, {"stereo", 2, false}, {"mono pre-encoded", 1, true}} {
		t.Run(tc.name, func(t *testing.T) { testAudioLoopback(t, tc.channels, tc.encoded) })
	}
}

func testAudioLoopback(t *testing.T, channels int, encoded bool) {
	srv, sink, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"speech": 25}, Media: map[dag.AppID]dag.Media{"speech": dag.Audio}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	results := make(chan Result, 256)
	p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: "speech", Audio: true, AudioChannels: channels, AudioBitrate: 32000 * channels,
		OnResult: func(r Result) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const packets = 75 // 1.5 s of 20 ms
	var pre [][]byte
	if encoded {
		pre = opusPackets(t, packets, channels)
	}
	start := time.Now()
	var sent []int16
	for i := range packets {
		at := start.Add(time.Duration(i) * 20 * time.Millisecond)
		time.Sleep(time.Until(at)) // pacing a real-time source, not waiting for logic
		if encoded {
			sent = append(sent, toneSamples(i*960, 960, channels)...)
			if err := p.WriteOpus(pre[i], 960); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// 10 ms at a time: WriteAudio makes the 20 ms packets.
		for half := range 2 {
			pcm := toneSamples(i*960+half*480, 480, channels)
			sent = append(sent, pcm...)
			if err := p.WriteAudio(pcm, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	// 75 packets of 960 samples are 36 chunks of 1920 (and a remainder);
	// over loopback a packet or two may still be lost.
	waitFor(t, "audio chunks at the session", 10*time.Second, func() bool { return len(sink.chunks(p.Stream)) >= 34 })
	got := sink.chunks(p.Stream)
	var pcm []int16
	off := 0 // capture gaps off 40 ms
	for i, c := range got {
		if c.seq != uint64(i+1) || c.a.Rate != opus.SampleRate || c.a.Channels != channels || len(c.a.PCM) != 1920*channels {
			t.Fatalf("chunk %d: seq %d, %d Hz, %d channels, %d samples; want seq %d, 48000 Hz, %d channels, %d samples",
				i, c.seq, c.a.Rate, c.a.Channels, len(c.a.PCM), i+1, channels, 1920*channels)
		}
		if lat := time.Since(c.capture); lat < 0 || lat > 10*time.Second {
			t.Errorf("chunk %d: capture time %v ago", i, lat)
		}
		if i > 0 {
			// 40 ms apart; once, when the first sender report replaces
			// the first packet's arrival as the clock (later by the
			// packet's delay on a loaded machine), a gap may be off.
			if gap := c.capture.Sub(got[i-1].capture); gap < 35*time.Millisecond || gap > 45*time.Millisecond {
				off++
				if off > 2 || gap < 0 || gap > 100*time.Millisecond {
					t.Errorf("chunk %d: capture gap %v, want 40 ms", i, gap)
				}
			}
		}
		pcm = append(pcm, c.a.PCM...)
	}
	// Energy and pitch: skip the first 100 ms (the codec's start).
	skip := 4800 * channels
	for ch := range channels {
		in, out := rmsOf(sent[skip:], channels, ch), rmsOf(pcm[skip:], channels, ch)
		if r := out / in; r < 0.75 || r > 1.25 {
			t.Errorf("channel %d: received RMS %.0f, sent %.0f (ratio %.2f, want 0.75..1.25)", ch, out, in, r)
		}
		if at, off := powerAt(pcm[skip:], channels, ch, 440), powerAt(pcm[skip:], channels, ch, 1000); at < 100*off {
			t.Errorf("channel %d: power at 440 Hz %.3g, at 1 kHz %.3g: not the tone sent", ch, at, off)
		}
	}
	waitFor(t, "results on the DataChannel", 5*time.Second, func() bool { return len(results) >= 34 })
	info := srv.Streams()
	if len(info) != 1 || info[0].Codec != CodecOpus || info[0].State != StateAdmitted || info[0].DecodeErrors != 0 ||
		info[0].Frames+info[0].Lost < 70 || info[0].Ingested != uint64(len(sink.chunks(p.Stream))) || info[0].Refused != 0 {
		t.Errorf("stream info %+v", info)
	}
	if tot := srv.IngestTotals(); len(tot) != 1 || tot[0].Ingested != info[0].Ingested || tot[0].Codecs[CodecOpus] != 1 {
		t.Errorf("ingest totals %+v", tot)
	}
}

// TestAudioMediaMismatch: an offer without the track its app takes is
// refused at offer time with 400 and the reason, over real WebRTC offers.
func TestAudioMediaMismatch(t *testing.T) {
	_, _, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"speech": 25, "face": 10}, Media: map[dag.AppID]dag.Media{"speech": dag.Audio}})
	for _, tc := range []struct {
		name, app string
		audio     bool
		want      string
	}{
		{"video into an audio app", "speech", false, "app speech takes audio: the offer sends only video"},
		{"audio into a video app", "face", true, "app face takes video: the offer has no video media section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := Publish(ctx, ClientConfig{Server: hs.URL, App: tc.app, Audio: tc.audio, Width: 64, Height: 48})
			if err == nil {
				p.Close()
				t.Fatal("accepted")
			}
			var he *HTTPError
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest || !strings.Contains(he.Msg, tc.want) {
				t.Fatalf("error %v; want 400 saying %q", err, tc.want)
			}
		})
	}
}

// audioOffer is an SDP offer with the given media sections (each a full
// m= line and its attributes).
func audioOffer(sections ...string) string {
	return "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n" + strings.Join(sections, "")
}

func TestCheckAudioOffer(t *testing.T) {
	const opusSec = "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\na=sendonly\r\na=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10\r\n"
	for _, tc := range []struct {
		name  string
		offer string
		code  int // 0: accepted
		want  string
	}{
		{"opus", audioOffer(opusSec), 0, ""},
		{"opus after pcmu", audioOffer("m=audio 9 UDP/TLS/RTP/SAVPF 0 111\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:111 OPUS/48000/2\r\n"), 0, ""},
		{"opus and video", audioOffer("m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n", opusSec), 0, ""},
		{"only video", audioOffer("m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n"), http.StatusBadRequest, "the offer sends only video"},
		{"nothing", audioOffer(), http.StatusBadRequest, "no audio media section"},
		{"no opus", audioOffer("m=audio 9 UDP/TLS/RTP/SAVPF 0 9\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:9 G722/8000\r\n"), http.StatusBadRequest, "no Opus in the offer (offered: PCMU, G722)"},
		{"opus mono rtpmap", audioOffer("m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000\r\n"), http.StatusBadRequest, "no Opus"},
		{"no rtpmap", audioOffer("m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"), http.StatusBadRequest, "lists no codecs"},
		{"recvonly", audioOffer(strings.Replace(opusSec, "sendonly", "recvonly", 1)), statusRecvonly, "audio section is recvonly"},
		{"malformed", "v=0\r\nm=", http.StatusBadRequest, "malformed SDP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pick, code, msg := checkAudioOffer([]byte(tc.offer), "speech")
			if code != tc.code || !strings.Contains(msg, tc.want) {
				t.Fatalf("checkAudioOffer = %d %q; want %d containing %q", code, msg, tc.code, tc.want)
			}
			if code == 0 && (pick.ours() != CodecOpus || pick.pt != 111) {
				t.Errorf("pick %+v: want opus, payload type 111", pick)
			}
		})
	}
}

func TestAudioConfig(t *testing.T) {
	type videoOnly struct{ Sink }
	for _, tc := range []struct {
		name string
		cfg  Config
		sink Sink
		want string
	}{
		{"sink without IngestAudio", Config{Apps: map[dag.AppID]float64{"a": 25}, Media: map[dag.AppID]dag.Media{"a": dag.Audio}}, videoOnly{newSink()}, "has no IngestAudio"},
		{"unknown app", Config{Apps: map[dag.AppID]float64{"a": 25}, Media: map[dag.AppID]dag.Media{"b": dag.Audio}}, newSink(), "not in Config.Apps"},
		{"bad media", Config{Apps: map[dag.AppID]float64{"a": 25}, Media: map[dag.AppID]dag.Media{"a": "smell"}}, newSink(), `"smell": want video or audio`},
		{"video sink for video", Config{Apps: map[dag.AppID]float64{"a": 25}, Media: map[dag.AppID]dag.Media{"a": dag.Video}}, videoOnly{newSink()}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := New(tc.cfg, tc.sink)
			if err == nil {
				srv.Close()
			}
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("New: %v; want %q", err, tc.want)
			}
		})
	}
	// A camera (video) cannot feed an audio app.
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": 25}, Media: map[dag.AppID]dag.Media{"a": dag.Audio}}, newSink())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := srv.OpenFeed(ingest.FeedConfig{App: "a", Name: "cam", Codec: CodecH264}); err == nil || !strings.Contains(err.Error(), "takes audio") {
		t.Errorf("OpenFeed into an audio app: %v", err)
	}
}

// testAudioPipeline is an audio stream's media path without a peer
// connection, on a fake clock, fps chunks a second.
func testAudioPipeline(t testing.TB, sink Sink, fps float64, channels int) (*audioPipeline, *stream, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1e9, 0))
	srv, err := New(Config{Apps: map[dag.AppID]float64{"a": fps}, Media: map[dag.AppID]dag.Media{"a": dag.Audio}, Clock: clk,
		CPUTime: func() time.Duration { return 0 }}, sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	st := &stream{s: srv, id: "s", app: "a", fps: fps, audio: true, codec: CodecOpus, subs: map[chan Result]struct{}{}, done: make(chan struct{})}
	dec, err := opus.NewDecoder(channels)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dec.Close)
	return newAudioPipeline(st, dec, &captureClock{rate: opusClockRate}), st, clk
}

// opusPackets encodes n 20 ms packets of the tone.
func opusPackets(t testing.TB, n, channels int) [][]byte {
	t.Helper()
	enc, err := opus.NewEncoder(opus.EncoderConfig{Channels: channels})
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	var out [][]byte
	for i := range n {
		p, err := enc.Encode(toneSamples(i*960, 960, channels))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestAudioPipeline: packets in, chunks out, on a fake clock: chunks of
// 1/fps, numbered, capture times from the RTP timestamps back to back
// (concealed audio fills a lost packet's time), and every packet counted:
// decoded, lost and concealed, late, padding, corrupt.
func TestAudioPipeline(t *testing.T) {
	pkts := opusPackets(t, 12, 1)
	for _, tc := range []struct {
		name      string
		fps       float64
		send      []int // packet indexes in arrival order; -1: an empty (padding) packet; -2: a corrupt one
		chunks    int   // complete chunks out
		samples   int   // samples per chunk
		frames    uint64
		lost      uint64
		concealed uint64
		late      uint64
		padding   uint64
		decodeErr uint64
	}{
		{"in order 40 ms", 25, []int{0, 1, 2, 3, 4, 5, 6, 7}, 4, 1920, 8, 0, 0, 0, 0, 0},
		{"in order 20 ms", 0, []int{0, 1, 2}, 3, 960, 3, 0, 0, 0, 0, 0},
		{"in order 30 ms", 100.0 / 3, []int{0, 1, 2, 3, 4, 5}, 4, 1440, 6, 0, 0, 0, 0, 0},
		{"one lost", 25, []int{0, 1, 3, 4, 5, 6, 7}, 4, 1920, 7, 1, 1, 0, 0, 0},
		{"late and padding", 25, []int{0, 2, 1, 3, -1}, 2, 1920, 3, 1, 1, 1, 1, 0}, // a padding packet takes its own seq (RFC 3550)
		{"corrupt", 25, []int{0, 1, -2, 3, 4}, 2, 1920, 4, 0, 1, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newSink()
			p, st, clk := testAudioPipeline(t, sink, tc.fps, 1)
			const ts0 = 4000000000 // wraps during the run
			start := clk.Now()
			for i, k := range tc.send {
				// Each packet arrives 5 ms after its time (late ones later).
				if at := start.Add(time.Duration(max(k, i)*20+5) * time.Millisecond); at.After(clk.Now()) {
					clk.Advance(at.Sub(clk.Now()))
				}
				pkt := &rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111}}
				switch k {
				case -1:
					pkt.SequenceNumber, pkt.Timestamp = uint16(65530+i), ts0
				case -2:
					pkt.SequenceNumber, pkt.Timestamp, pkt.Payload = uint16(65530+2), ts0+2*960, []byte{0x03, 0x00}
				default:
					pkt.SequenceNumber, pkt.Timestamp, pkt.Payload = uint16(65530+k), uint32(ts0+k*960), pkts[k]
				}
				if !p.packet(pkt) {
					t.Fatalf("packet %d ended the stream", i)
				}
			}
			got := sink.chunks("s")
			if len(got) != tc.chunks {
				t.Fatalf("%d chunks, want %d", len(got), tc.chunks)
			}
			for i, c := range got {
				if c.seq != uint64(i+1) || len(c.a.PCM) != tc.samples {
					t.Errorf("chunk %d: seq %d, %d samples; want %d, %d", i, c.seq, len(c.a.PCM), i+1, tc.samples)
				}
				want := time.Duration(tc.samples) * time.Second / opus.SampleRate
				if i > 0 {
					if gap := c.capture.Sub(got[i-1].capture); gap != want {
						t.Errorf("chunk %d: capture %v after the previous, want %v (back to back)", i, gap, want)
					}
				}
			}
			c := &st.c
			if c.frames.Load() != tc.frames || c.lost.Load() != tc.lost || c.concealed.Load() != tc.concealed || c.discarded.Load() != tc.late ||
				c.padding.Load() != tc.padding || c.decodeErrors.Load() != tc.decodeErr || c.ingested.Load() != uint64(tc.chunks) {
				t.Errorf("counters: frames %d lost %d concealed %d discarded %d padding %d decode errors %d ingested %d; want %d %d %d %d %d %d %d",
					c.frames.Load(), c.lost.Load(), c.concealed.Load(), c.discarded.Load(), c.padding.Load(), c.decodeErrors.Load(), c.ingested.Load(),
					tc.frames, tc.lost, tc.concealed, tc.late, tc.padding, tc.decodeErr, tc.chunks)
			}
		})
	}
}

// TestAudioRefused: chunks the session refuses are counted; ten in a row
// end the stream with the reason.
func TestAudioRefused(t *testing.T) {
	sink := newSink()
	sink.ingestErr = errors.New("session gone")
	p, st, _ := testAudioPipeline(t, sink, 0, 1)
	pkts := opusPackets(t, maxRefusedRun, 1)
	for i, pk := range pkts {
		ok := p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: uint16(i), Timestamp: uint32(i * 960)}, Payload: pk})
		if ok != (i < maxRefusedRun-1) {
			t.Fatalf("packet %d: reading goes on %v", i, ok)
		}
	}
	<-st.done
	if st.c.refused.Load() != maxRefusedRun || st.c.ingested.Load() != 0 || !strings.Contains(st.info().Ended, "refused 10 audio chunks in a row: session gone") {
		t.Errorf("refused %d, ingested %d, ended %q", st.c.refused.Load(), st.c.ingested.Load(), st.info().Ended)
	}
}

// FuzzAudioRTP feeds arbitrary bytes as RTP packets, and as Opus payloads
// with made-up sequence numbers, through the audio path: every chunk that
// comes out is well formed, nothing crashes.
func FuzzAudioRTP(f *testing.F) {
	for _, p := range opusPackets(f, 2, 2) {
		b, err := (&rtp.Packet{Header: rtp.Header{Version: 2, PayloadType: 111, SequenceNumber: 7, Timestamp: 960}, Payload: p}).Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x80, 111, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0x03, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		sink := newSink()
		p, _, _ := testAudioPipeline(t, sink, 25, 2)
		var pk rtp.Packet
		if pk.Unmarshal(data) == nil {
			p.packet(&pk)
		}
		for i := 0; i*32 < len(data); i++ {
			part := data[i*32 : min(len(data), (i+1)*32)]
			seq := uint16(i * int(1+data[0]%3)) // gaps, sometimes
			p.packet(&rtp.Packet{Header: rtp.Header{Version: 2, SequenceNumber: seq, Timestamp: uint32(i * 960)}, Payload: part})
		}
		for _, c := range sink.chunks("s") {
			if err := c.a.Valid(); err != nil || len(c.a.PCM) != 1920*2 {
				t.Fatalf("chunk %d: %d samples: %v", c.seq, len(c.a.PCM), err)
			}
		}
	})
}

// TestChromiumAudio: a real browser (headless Chromium, its fake
// microphone: a beep) opens /stream/{app} of an audio app, which asks for
// the microphone, not the camera, and streams it over WHIP as Opus; the
// session receives 40 ms PCM chunks and the page the results.
func TestChromiumAudio(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ctx := browsertest.New(t, 60*time.Second,
		chromedp.Flag("use-fake-device-for-media-stream", true),
		chromedp.Flag("use-fake-ui-for-media-stream", true))
	srv, sink, hs := newTestServer(t, Config{Apps: map[dag.AppID]float64{"speech": 25}, Media: map[dag.AppID]dag.Media{"speech": dag.Audio}})
	if _, err := chromedp.Run(ctx, chromedp.Navigate(hs.URL+"/stream/speech?autostart")); err != nil {
		t.Fatal(err)
	}
	var id string
	waitFor(t, "the browser's audio chunks at the session", 30*time.Second, func() bool {
		if s := srv.Streams(); len(s) == 1 && len(sink.chunks(s[0].ID)) >= 25 {
			id = s[0].ID
			return true
		}
		return false
	})
	waitFor(t, "results on the page", 10*time.Second, func() bool {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[chromiumPage](`window.mdagStats`))
		return err == nil && s.Results >= 10
	})
	stats, err := chromedp.Run(ctx, chromedp.Evaluate[chromiumPage](`window.mdagStats`))
	if err != nil {
		t.Fatal(err)
	}
	st := srv.Streams()[0]
	t.Logf("browser: %+v; server: %+v", stats, st)
	if stats.Error != "" || stats.Codec != "opus" || st.Codec != CodecOpus || st.DecodeErrors != 0 {
		t.Errorf("page codec %q, error %q; server codec %q, %d decode errors: want Opus, none", stats.Codec, stats.Error, st.Codec, st.DecodeErrors)
	}
	for i, c := range sink.chunks(id) {
		if c.seq != uint64(i+1) || len(c.a.PCM) != 1920*c.a.Channels {
			t.Fatalf("chunk %d: seq %d, %d samples of %d channels: want 40 ms", i, c.seq, len(c.a.PCM), c.a.Channels)
		}
	}
	// Chromium's fake microphone beeps: some chunk carries sound.
	loud := 0.0
	for _, c := range sink.chunks(id) {
		loud = max(loud, rmsOf(c.a.PCM, c.a.Channels, 0))
	}
	if loud < 100 {
		t.Errorf("the loudest chunk's RMS is %.0f: want the fake microphone's beep", loud)
	}
}
