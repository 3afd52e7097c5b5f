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

	"github.com/pion/ice/v2"
	"github.com/pion/interceptor"
	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/rtp/codecs"
	"github.com/pion/webrtc/v3"

	"github.com/mdag/mdag/ingest/vpx"
	"github.com/mdag/mdag/modules"
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
	// OnResult is called (from one goroutine, in order) with each result
	// the server sends on the DataChannel.
	OnResult func(Result)
	HTTP     *http.Client
}

// Publisher streams frames to an mdag server over WHIP: VP8 encoded with
// libvpx, RTP timestamps from each frame's capture time (so the server's
// capture times, taken from RTCP sender reports, are the camera's).
type Publisher struct {
	cfg      ClientConfig
	pc       *webrtc.PeerConnection
	track    *webrtc.TrackLocalStaticRTP
	enc      *vpx.Encoder
	pack     rtp.Packetizer
	resource string
	Stream   string // the server's stream ID
	Results  string // the server's SSE results URL

	keyReq atomic.Bool
	mu     sync.Mutex
	t0     time.Time
	ts0    uint32
	pts    int64
	sent   atomic.Uint64
	wg     sync.WaitGroup
	closed atomic.Bool
}

// Publish connects to the server and returns once ICE is connected (or
// ctx ends). Errors from the server carry its status and reason.
func Publish(ctx context.Context, cfg ClientConfig) (*Publisher, error) {
	if cfg.FPS <= 0 {
		cfg.FPS = 30
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 15 * time.Second}
	}
	enc, err := vpx.NewEncoder(vpx.EncoderConfig{Width: cfg.Width, Height: cfg.Height, FPS: cfg.FPS, BitrateKbps: cfg.BitrateKbps})
	if err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, enc: enc}
	if err := p.connect(ctx); err != nil {
		enc.Close()
		if p.pc != nil {
			_ = p.pc.Close()
		}
		p.wg.Wait()
		return nil, err
	}
	return p, nil
}

func clientAPI() (*webrtc.API, error) { return newAPI(nil) }

// newAPI is the WebRTC stack of both ends: VP8 only, NACK and RTCP
// reports, IPv4 UDP host candidates including loopback, no mDNS; tune
// adjusts the settings (ports, NAT) and may refuse them.
func newAPI(tune func(*webrtc.SettingEngine) error) (*webrtc.API, error) {
	m := &webrtc.MediaEngine{}
	if err := m.RegisterCodec(webrtc.RTPCodecParameters{
		RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeVP8, ClockRate: vp8ClockRate,
			RTCPFeedback: []webrtc.RTCPFeedback{{Type: "nack"}, {Type: "nack", Parameter: "pli"}, {Type: "ccm", Parameter: "fir"}}},
		PayloadType: 96,
	}, webrtc.RTPCodecTypeVideo); err != nil {
		return nil, err
	}
	ir := &interceptor.Registry{}
	if err := webrtc.ConfigureNack(m, ir); err != nil {
		return nil, err
	}
	if err := webrtc.ConfigureRTCPReports(ir); err != nil {
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
	api, err := clientAPI()
	if err != nil {
		return err
	}
	pc, err := api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return err
	}
	p.pc = pc
	track, err := webrtc.NewTrackLocalStaticRTP(webrtc.RTPCodecCapability{MimeType: webrtc.MimeTypeVP8, ClockRate: vp8ClockRate}, "video", "mdag")
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
	if p.cfg.OnResult != nil {
		dc.OnMessage(func(m webrtc.DataChannelMessage) {
			var r Result
			if json.Unmarshal(m.Data, &r) == nil {
				p.cfg.OnResult(r)
			}
		})
	}
	connected := make(chan struct{})
	var once sync.Once
	pc.OnConnectionStateChange(func(s webrtc.PeerConnectionState) {
		if s == webrtc.PeerConnectionStateConnected {
			once.Do(func() { close(connected) })
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
	select {
	case <-connected:
	case <-ctx.Done():
		p.deleteResource()
		return fmt.Errorf("ICE did not connect: %w", ctx.Err())
	case <-time.After(10 * time.Second):
		p.deleteResource()
		return errors.New("ICE did not connect in 10 s")
	}
	p.pack = rtp.NewPacketizer(1200, 96, 0, &codecs.VP8Payloader{EnablePictureID: true}, rtp.NewRandomSequencer(), vp8ClockRate)
	p.ts0 = rand.Uint32()
	return nil
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
func (p *Publisher) WriteFrame(f *modules.Frame, capture time.Time) error {
	if p.closed.Load() {
		return errors.New("publisher closed")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.t0.IsZero() {
		p.t0 = capture
	}
	ts := p.ts0 + uint32(capture.Sub(p.t0)*vp8ClockRate/time.Second)
	pkts, err := p.enc.Encode(f, p.pts, p.keyReq.Swap(false) || p.pts == 0)
	p.pts++
	if err != nil {
		return err
	}
	for _, e := range pkts {
		for _, pkt := range p.pack.Packetize(e.Data, 0) {
			pkt.Timestamp = ts
			if err := p.track.WriteRTP(pkt); err != nil {
				return err
			}
		}
	}
	p.sent.Add(1)
	return nil
}

// Sent is the number of frames written.
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
	if p.closed.Swap(true) {
		return nil
	}
	p.mu.Lock()
	p.deleteResource()
	p.mu.Unlock()
	err := p.pc.Close()
	p.wg.Wait()
	p.mu.Lock()
	p.enc.Close()
	p.mu.Unlock()
	return err
}
