package whip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/ice/v4"
	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/ingest/avc"
	"github.com/mdag/mdag/ingest/opus"
	"github.com/mdag/mdag/ingest/vpx"
	"github.com/mdag/mdag/media"
)

// ClientConfig configures a Publisher.
type ClientConfig struct {
	Server      string // base URL, e.g. http://127.0.0.1:8080
	App         string
	Token       string
	Width       int // frame size (every frame must have it)
	Height      int
	FPS         int // the encoder's time base; default 30
	BitrateKbps int // default 1000
	// Codec is what the client offers and sends: CodecVP8 (default, libvpx)
	// or CodecH264 (constrained baseline, x264 through libavcodec).
	Codec string
	// Audio makes the Publisher send one Opus audio track instead of
	// video (for apps with `media: audio`): WriteAudio takes 48 kHz PCM of
	// AudioChannels channels (1 default, or 2), encoded at AudioBitrate
	// bits per second (default 32000 per channel) in 20 ms packets;
	// Width, Height, Codec and the video writes do not apply.
	Audio         bool
	AudioChannels int
	AudioBitrate  int
	// OnResult is called (from one goroutine, in order) with each result
	// the server sends on the DataChannel.
	OnResult func(Result)
	HTTP     *http.Client
}

// Publisher streams frames to an mdag server over WHIP: VP8 encoded with
// libvpx or H.264 with x264 (ClientConfig.Codec), RTP timestamps from each frame's capture time (so the server's
// capture times, taken from RTCP sender reports, are the camera's).
//
// It notices a stream the server ended (a DELETE by someone else, the idle
// timeout, the server shutting down, a stream refused mid-way): Done is
// closed and Err (and every later WriteFrame) says why, an *EndedError. The
// reason comes from the server's last DataChannel message; when the
// DataChannel closes without one, from the server's stream list; when the
// server cannot be reached or ICE fails, from that.
type Publisher struct {
	cfg      ClientConfig
	pc       *webrtc.PeerConnection
	track    *webrtc.TrackLocalStaticRTP
	enc      encoder       // nil for audio
	aenc     *opus.Encoder // audio: nil for video
	apend    []int16       // audio: samples waiting for a whole 20 ms packet
	asamples uint32        // audio: samples per channel sent (the RTP clock)
	pack     rtp.Packetizer
	resource string
	// resourceURL is the stream's WHIP resource (kept after DELETE).
	resourceURL string
	Stream      string // the server's stream ID
	Results     string // the server's SSE results URL

	keyReq atomic.Bool
	mu     sync.Mutex
	t0     time.Time
	ts0    uint32
	pts    int64
	sent   atomic.Uint64
	wg     sync.WaitGroup
	closed atomic.Bool

	done    chan struct{}
	endOnce sync.Once
	endErr  error
	goMu    sync.Mutex // orders spawn's wg.Add before Close's wg.Wait
}

// spawn runs f on a goroutine Close waits for; none once closed.
func (p *Publisher) spawn(f func()) {
	p.goMu.Lock()
	defer p.goMu.Unlock()
	if p.closed.Load() {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
}

// EndedError says that and why a stream ended other than by Close.
type EndedError struct {
	Stream string
	Reason string
	Kind   string // the server's kind of end (EndOverload, EndIdle, ...) when it said one
}

func (e *EndedError) Error() string {
	return fmt.Sprintf("stream %s ended: %s", e.Stream, e.Reason)
}

// Done is closed when the stream is over: ended by the server or the
// connection (Err says why), or by Close.
func (p *Publisher) Done() <-chan struct{} { return p.done }

// Err is why the stream ended (an *EndedError), nil while it runs or after
// Close.
func (p *Publisher) Err() error {
	select {
	case <-p.done:
		return p.endErr
	default:
		return nil
	}
}

// finish ends the publisher once: err nil for Close.
func (p *Publisher) finish(err error) {
	p.endOnce.Do(func() {
		p.endErr = err
		close(p.done)
	})
}

// ended is the server or the connection ending the stream; reason "" asks
// the server why.
func (p *Publisher) ended(reason string) { p.endedAs("", reason) }

// endedAs is ended with the server's kind of end; reason "" asks the server
// why (and its kind).

func (p *Publisher) endedAs(kind, reason string) {
	if p.closed.Load() || p.Err() != nil {
		return
	}
	if reason == "" {
		kind, reason = p.askWhy()
	}
	if !p.closed.Load() {
		p.finish(&EndedError{Stream: p.Stream, Reason: reason, Kind: kind})
	}
}

// askWhy looks the stream up in the server's list (GET /v1/streams), for
// up to a second: the server may close the connection a moment before it
// records why.
func (p *Publisher) askWhy() (kind, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for range 10 {
		var listed bool
		if kind, why, listed = p.lookupEnd(ctx); listed {
			return kind, why
		}
		select {
		case <-ctx.Done():
			return kind, why
		case <-time.After(100 * time.Millisecond): // polling a remote server
		}
	}
	return kind, why
}

// lookupEnd asks the server once; listed: the answer is final (the stream
// is listed as ended, or the server cannot tell).
func (p *Publisher) lookupEnd(ctx context.Context) (kind, why string, listed bool) {
	const closed = "the server closed the connection"
	u, err := url.Parse(p.resourceURL)
	if err != nil {
		return "", closed, true
	}
	u.Path, u.RawQuery = "/v1/streams", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", closed, true
	}
	if p.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+p.cfg.Token)
	}
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return "", fmt.Sprintf("%s and cannot be reached (%v)", closed, err), true
	}
	defer resp.Body.Close()
	var list []StreamInfo
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&list) != nil {
		return "", fmt.Sprintf("%s (its stream list answered %s)", closed, resp.Status), true
	}
	for _, s := range list {
		if s.ID == p.Stream && s.Ended != "" {
			return s.EndKind, "ended by the server: " + s.Ended, true
		}
	}
	return "", closed + " (the stream is not listed as ended)", false
}

// Publish connects to the server and returns once ICE is connected and
// the results DataChannel is open (or ctx ends). Errors from the server carry its status and reason.
func Publish(ctx context.Context, cfg ClientConfig) (*Publisher, error) {
	if cfg.FPS <= 0 {
		cfg.FPS = 30
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 15 * time.Second}
	}
	if cfg.Codec == "" {
		cfg.Codec = CodecVP8
	}
	p := &Publisher{cfg: cfg, done: make(chan struct{})}
	if cfg.Audio {
		if cfg.AudioChannels == 0 {
			cfg.AudioChannels = 1
		}
		aenc, err := opus.NewEncoder(opus.EncoderConfig{Channels: cfg.AudioChannels, Bitrate: cfg.AudioBitrate})
		if err != nil {
			return nil, err
		}
		p.cfg, p.aenc = cfg, aenc
	} else {
		enc, err := newEncoder(cfg)
		if err != nil {
			return nil, err
		}
		p.enc = enc
	}
	if err := p.connect(ctx); err != nil {
		p.closeEncoder()
		if p.pc != nil {
			_ = p.pc.Close()
		}
		p.wg.Wait()
		return nil, err
	}
	return p, nil
}

// ICE timeouts of the client: a server that vanishes without closing (a
// crash, a network cut) ends the stream iceFailed after it was last heard
// (it answers the client's keepalives every second).
const (
	iceDisconnected = 4 * time.Second
	iceFailed       = 8 * time.Second
)

// clientAPI is the client's WebRTC stack.
func clientAPI(codecs []string) (*webrtc.API, error) {
	return clientAPIOpus(codecs, opusFmtp)
}

// clientAPIOpus is clientAPI offering Opus with fmtp (a stereo sender
// says so: opusStereoFmtp).
func clientAPIOpus(codecs []string, fmtp string) (*webrtc.API, error) {
	return newAPIOpus(codecs, fmtp, func(se *webrtc.SettingEngine) error {
		se.SetICETimeouts(iceDisconnected, iceFailed, time.Second)
		return nil
	})
}

// newAPI is the WebRTC stack of both ends: the codecs given, NACK and RTCP
// reports, IPv4 UDP host candidates including loopback, no mDNS; tune
// adjusts the settings (ports, NAT) and may refuse them.
func newAPI(codecs []string, tune func(*webrtc.SettingEngine) error) (*webrtc.API, error) {
	return newAPIOpus(codecs, opusFmtp, tune)
}

// newAPIOpus is newAPI with Opus's fmtp.
func newAPIOpus(codecs []string, fmtp string, tune func(*webrtc.SettingEngine) error) (*webrtc.API, error) {
	m := &webrtc.MediaEngine{}
	if err := registerCodecs(m, codecs); err != nil {
		return nil, err
	}
	if err := registerOpus(m, fmtp); err != nil {
		return nil, err
	}
	// Simulcast: the mid and rid header extensions tell the layers apart
	// (OnTrack fires once per rid).
	if err := webrtc.ConfigureSimulcastExtensionHeaders(m); err != nil {
		return nil, err
	}
	ir := &interceptor.Registry{}
	if err := webrtc.ConfigureNack(m, ir); err != nil {
		return nil, err
	}
	if err := webrtc.ConfigureRTCPReports(ir); err != nil {
		return nil, err
	}
	// Transport-wide congestion control feedback: a browser's bandwidth
	// estimate grows with it, and with it the simulcast layers it sends
	// (without feedback Chromium stays near its start rate and leaves the
	// top layer off).
	if err := webrtc.ConfigureTWCCSender(m, ir); err != nil {
		return nil, err
	}
	se := webrtc.SettingEngine{}
	se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
	se.SetIncludeLoopbackCandidate(true)
	se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
	if tune != nil {
		if err := tune(&se); err != nil {
			return nil, err
		}
	}
	return webrtc.NewAPI(webrtc.WithMediaEngine(m), webrtc.WithInterceptorRegistry(ir), webrtc.WithSettingEngine(se)), nil
}

func (p *Publisher) connect(ctx context.Context) error {
	fmtp := opusFmtp
	if p.cfg.Audio && p.cfg.AudioChannels == 2 {
		fmtp = opusStereoFmtp
	}
	api, err := clientAPIOpus([]string{p.cfg.Codec}, fmtp)
	if err != nil {
		return err
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	p.pc = pc
	capability := webrtc.RTPCodecCapability{MimeType: codecMime(p.cfg.Codec), ClockRate: videoClockRate}
	if p.cfg.Codec == CodecH264 {
		capability.SDPFmtpLine = "level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f"
	}
	kind := "video"
	if p.cfg.Audio {
		kind = "audio"
		capability = webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeOpus, ClockRate: opusClockRate, Channels: 2, SDPFmtpLine: fmtp}
	}
	track, err := webrtc.NewTrackLocalStaticRTP(capability, kind, "mdag")
	if err != nil {
		return err
	}
	p.track = track
	sender, err := pc.AddTransceiverFromTrack(track, webrtc.RTPTransceiverInit{Direction: webrtc.RTPTransceiverDirectionSendonly})
	if err != nil {
		return err
	}
	p.wg.Add(1)
	go func() { // PLI / FIR from the server: the next frame is a key frame
		defer p.wg.Done()
		for {
			pkts, _, err := sender.Sender().ReadRTCP()
			if err != nil {
				return
			}
			for _, k := range pkts {
				switch k.(type) {
				case *rtcp.PictureLossIndication, *rtcp.FullIntraRequest:
					p.keyReq.Store(true)
				}
			}
		}
	}()
	dc, err := pc.CreateDataChannel("results", nil)
	if err != nil {
		return err
	}
	dc.OnMessage(func(m webrtc.DataChannelMessage) {
		var r struct {
			Result
			Ended   *string `json:"ended"`
			EndKind string  `json:"kind"`
		}
		if json.Unmarshal(m.Data, &r) != nil {
			return
		}
		if r.Ended != nil {
			p.endedAs(r.EndKind, "ended by the server: "+*r.Ended)
			return
		}
		if p.cfg.OnResult != nil {
			p.cfg.OnResult(r.Result)
		}
	})
	connected, opened := make(chan struct{}), make(chan struct{})
	up := atomic.Bool{}
	var once sync.Once
	dc.OnOpen(func() { close(opened) })
	dc.OnClose(func() {
		if up.Load() {
			p.spawn(func() { p.ended("") }) // askWhy makes a request: not on pion's goroutine
		}
	})
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		switch s {
		case webrtc.PeerConnectionStateConnected:
			up.Store(true)
			once.Do(func() { close(connected) })
		case webrtc.PeerConnectionStateFailed:
			if up.Load() {
				p.spawn(func() {
					p.ended(fmt.Sprintf("the connection to the server failed (ICE: nothing received for %v)", iceFailed))
				})
			}
		}
	})
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		return err
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		return err
	}
	select {
	case <-gathered:
	case <-ctx.Done():
		return ctx.Err()
	}
	endpoint := strings.TrimRight(p.cfg.Server, "/") + "/whip/" + url.PathEscape(p.cfg.App)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(pc.LocalDescription().SDP))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/sdp")
	if p.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+p.cfg.Token)
	}
	resp, err := p.cfg.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("WHIP POST %s: %w", endpoint, err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxOffer))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return &HTTPError{Status: resp.StatusCode, Msg: strings.TrimSpace(string(body)), RetryAfter: resp.Header.Get("Retry-After")}
	}
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	if err != nil || resp.Header.Get("Location") == "" {
		return fmt.Errorf("WHIP POST %s: 201 without a usable Location", endpoint)
	}
	p.resource = loc.String()
	p.resourceURL = p.resource
	p.Stream = resp.Header.Get("Mdag-Stream")
	if r := resp.Header.Get("Mdag-Results"); r != "" {
		if u, err := resp.Request.URL.Parse(r); err == nil {
			p.Results = u.String()
		}
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeAnswer, SDP: string(body)}); err != nil {
		p.deleteResource()
		return fmt.Errorf("the server's answer: %w", err)
	}
	timeout := time.After(10 * time.Second)
	for _, w := range []struct {
		ch   chan struct{}
		what string
	}{{connected, "ICE did not connect"}, {opened, "the results DataChannel did not open"}} {
		select {
		case <-w.ch:
		case <-ctx.Done():
			p.deleteResource()
			return fmt.Errorf("%s: %w", w.what, ctx.Err())
		case <-timeout:
			p.deleteResource()
			return errors.New(w.what + " in 10 s")
		}
	}
	var payloader rtp.Payloader = &codecs.VP8Payloader{EnablePictureID: true}
	if p.cfg.Codec == CodecH264 {
		payloader = &codecs.H264Payloader{}
	}
	// The payload type is rewritten by the track to the negotiated one.
	p.pack = rtp.NewPacketizer(1200, 96, 0, payloader, rtp.NewRandomSequencer(), videoClockRate)
	if p.cfg.Audio {
		p.pack = rtp.NewPacketizer(1200, 111, 0, &codecs.OpusPayloader{}, rtp.NewRandomSequencer(), opusClockRate)
	}
	p.ts0 = rand.Uint32()
	return nil
}

// closeEncoder frees the encoder (video or audio).
func (p *Publisher) closeEncoder() {
	if p.enc != nil {
		p.enc.Close()
	}
	if p.aenc != nil {
		p.aenc.Close()
	}
}

// audioFrame is the samples per channel of one audio packet: 20 ms.
const audioFrame = opusClockRate / 50

// WriteAudio encodes interleaved 48 kHz PCM of the Publisher's
// AudioChannels and sends it in 20 ms Opus packets; a remainder shorter
// than 20 ms waits for the next call. RTP timestamps count samples from
// the first (the capture time of the first call anchors the stream); the
// caller paces the calls in real time, as a microphone would.
func (p *Publisher) WriteAudio(pcm []int16, capture time.Time) error {
	if p.aenc == nil {
		return errors.New("WriteAudio: the publisher sends video (ClientConfig.Audio is off)")
	}
	ch := p.cfg.AudioChannels
	if len(pcm)%ch != 0 {
		return fmt.Errorf("WriteAudio: %d samples do not divide into %d channels", len(pcm), ch)
	}
	if p.closed.Load() {
		return errors.New("publisher closed")
	}
	if err := p.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t0.IsZero() {
		p.t0 = capture
	}
	p.apend = append(p.apend, pcm...)
	for len(p.apend) >= audioFrame*ch {
		pkt, err := p.aenc.Encode(p.apend[:audioFrame*ch])
		if err != nil {
			return err
		}
		p.apend = p.apend[audioFrame*ch:]
		if err := p.sendOpusLocked(pkt, audioFrame); err != nil {
			return err
		}
	}
	p.apend = append([]int16(nil), p.apend...) // do not keep the caller's array
	return nil
}

// WriteOpus sends one Opus packet encoded beforehand (an Ogg Opus file's),
// samples long per channel at 48 kHz: its RTP timestamp counts the samples
// sent before it. The caller paces the packets in real time.
func (p *Publisher) WriteOpus(pkt []byte, samples int) error {
	if p.aenc == nil {
		return errors.New("WriteOpus: the publisher sends video (ClientConfig.Audio is off)")
	}
	if len(pkt) == 0 || samples <= 0 || samples > 5760 {
		return fmt.Errorf("WriteOpus: a packet of %d bytes, %d samples: want a packet of 1..5760 samples (120 ms)", len(pkt), samples)
	}
	if p.closed.Load() {
		return errors.New("publisher closed")
	}
	if err := p.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sendOpusLocked(pkt, samples)
}

// sendOpusLocked sends one Opus packet at the RTP time of the samples sent
// so far (p.mu held).
func (p *Publisher) sendOpusLocked(pkt []byte, samples int) error {
	for _, rp := range p.pack.Packetize(pkt, uint32(samples)) {
		rp.Timestamp = p.ts0 + p.asamples
		if err := p.track.WriteRTP(rp); err != nil {
			return err
		}
	}
	p.asamples += uint32(samples)
	p.sent.Add(1)
	return nil
}

// encoder is the client's video encoder: vpx (VP8) or avc (H.264).
type encoder interface {
	Encode(f *media.Frame, pts int64, key bool) ([]encoded, error)
	Close()
}

type encoded struct{ Data []byte }

// codecEncoder adapts ingest/vpx's and ingest/avc's encoders to encoder.
type codecEncoder[T any] struct {
	enc interface {
		Encode(f *media.Frame, pts int64, key bool) ([]T, error)
		Close()
	}
	data func(T) []byte
}

func (e codecEncoder[T]) Encode(f *media.Frame, pts int64, key bool) ([]encoded, error) {
	out, err := e.enc.Encode(f, pts, key)
	enc := make([]encoded, len(out))
	for i, o := range out {
		enc[i] = encoded{e.data(o)}
	}
	return enc, err
}

func (e codecEncoder[T]) Close() { e.enc.Close() }

func newEncoder(cfg ClientConfig) (encoder, error) {
	switch cfg.Codec {
	case CodecVP8:
		e, err := vpx.NewEncoder(vpx.EncoderConfig{Width: cfg.Width, Height: cfg.Height, FPS: cfg.FPS, BitrateKbps: cfg.BitrateKbps})
		if err != nil {
			return nil, err
		}
		return codecEncoder[vpx.Encoded]{e, func(x vpx.Encoded) []byte { return x.Data }}, nil
	case CodecH264:
		e, err := avc.NewEncoder(avc.EncoderConfig{Width: cfg.Width, Height: cfg.Height, FPS: cfg.FPS, BitrateKbps: cfg.BitrateKbps})
		if err != nil {
			return nil, err
		}
		return codecEncoder[avc.Encoded]{e, func(x avc.Encoded) []byte { return x.Data }}, nil
	}
	return nil, fmt.Errorf("client codec %q: want vp8 or h264", cfg.Codec)
}

// EncodeClip encodes frames (all of cfg's Width x Height) once in cfg's
// codec with a key frame every keyEvery frames, for WriteEncoded: the
// frames loop back to a key frame when sent in a loop if len(frames) is a
// multiple of keyEvery.
func EncodeClip(cfg ClientConfig, frames []*media.Frame, keyEvery int) ([][]byte, error) {
	if cfg.Codec == "" {
		cfg.Codec = CodecVP8
	}
	if cfg.FPS <= 0 {
		cfg.FPS = 30
	}
	enc, err := newEncoder(cfg)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	var out [][]byte
	for i, f := range frames {
		es, err := enc.Encode(f, int64(i), keyEvery <= 0 || i%keyEvery == 0)
		if err != nil {
			return nil, fmt.Errorf("encoding frame %d: %w", i, err)
		}
		var data []byte
		for _, e := range es {
			data = append(data, e.Data...)
		}
		out = append(out, data)
	}
	return out, nil
}

// HTTPError is a WHIP request the server refused.
type HTTPError struct {
	Status     int
	Msg        string
	RetryAfter string
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("server answered %d %s: %s", e.Status, http.StatusText(e.Status), e.Msg)
	if e.RetryAfter != "" {
		s += " (retry after " + e.RetryAfter + " s)"
	}
	return s
}

// WriteFrame encodes f (captured at capture) and sends it.
func (p *Publisher) WriteFrame(f *media.Frame, capture time.Time) error {
	if p.enc == nil {
		return errors.New("WriteFrame: the publisher sends audio (use WriteAudio)")
	}
	return p.write(capture, func() ([]encoded, error) {
		pkts, err := p.enc.Encode(f, p.pts, p.keyReq.Swap(false) || p.pts == 0)
		p.pts++
		return pkts, err
	})
}

// WriteEncoded sends one frame encoded beforehand in the Publisher's codec
// (a VP8 frame, an H.264 access unit in Annex-B), captured at capture: for
// load tests that encode a clip once and send it on many streams. Key
// frame requests (PLI) are not answered: the clip's own key frames come
// at its interval.
func (p *Publisher) WriteEncoded(data []byte, capture time.Time) error {
	if p.enc == nil {
		return errors.New("WriteEncoded: the publisher sends audio (use WriteAudio)")
	}
	return p.write(capture, func() ([]encoded, error) {
		p.keyReq.Store(false)
		return []encoded{{data}}, nil
	})
}

// write sends the frames frame makes (under p.mu) for one capture.
func (p *Publisher) write(capture time.Time, frame func() ([]encoded, error)) error {
	if p.closed.Load() {
		return errors.New("publisher closed")
	}
	if err := p.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t0.IsZero() {
		p.t0 = capture
	}
	out, err := frame()
	if err != nil {
		return err
	}
	for _, e := range out {
		if err := p.sendLocked(e.Data, capture); err != nil {
			return err
		}
	}
	p.sent.Add(1)
	return nil
}

// sendLocked packetizes one encoded frame with the capture time's RTP
// timestamp and sends it (p.mu held).
func (p *Publisher) sendLocked(data []byte, capture time.Time) error {
	ts := p.ts0 + uint32(capture.Sub(p.t0)*videoClockRate/time.Second)
	for _, pkt := range p.pack.Packetize(data, 0) {
		pkt.Timestamp = ts
		if err := p.track.WriteRTP(pkt); err != nil {
			return err
		}
	}
	return nil
}

// Sent is the number of frames written (audio: 20 ms packets sent).
func (p *Publisher) Sent() uint64 { return p.sent.Load() }

func (p *Publisher) deleteResource() {
	if p.resource == "" {
		return
	}
	req, err := http.NewRequest(http.MethodDelete, p.resource, nil)
	if err != nil {
		return
	}
	if p.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+p.cfg.Token)
	}
	if resp, err := p.cfg.HTTP.Do(req); err == nil {
		resp.Body.Close()
	}
	p.resource = ""
}

// Close ends the stream (WHIP DELETE) and the connection.
func (p *Publisher) Close() error {
	p.goMu.Lock()
	was := p.closed.Swap(true)
	p.goMu.Unlock()
	if was {
		return nil
	}
	p.finish(nil)
	p.mu.Lock()
	p.deleteResource()
	p.mu.Unlock()
	err := p.pc.Close()
	p.wg.Wait()
	p.mu.Lock()
	p.closeEncoder()
	p.mu.Unlock()
	return err
}
