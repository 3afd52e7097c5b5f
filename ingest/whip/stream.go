package whip

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// Result is one frame's outcome as clients receive it (DataChannel
// messages and SSE events carry it as JSON).
type Result struct {
	Stream    string         `json:"stream"`
	Frame     uint64         `json:"frame"`   // the stream's frame number as handed to the session (1, 2, ...)
	Outcome   string         `json:"outcome"` // finished (within the SLO), late, dropped
	LatencyMS float64        `json:"latency_ms"`
	Module    string         `json:"module,omitempty"` // for drops: where
	Reason    string         `json:"reason,omitempty"` // for drops: why
	Width     int            `json:"width,omitempty"`  // the frame the boxes refer to
	Height    int            `json:"height,omitempty"`
	Boxes     []Box          `json:"boxes,omitempty"`
	Labels    []string       `json:"labels,omitempty"`
	Counts    map[string]int `json:"counts,omitempty"`
	Tracks    []Track        `json:"tracks,omitempty"` // a tracker's tracks (stable ids)
	Events    []Event        `json:"events,omitempty"` // what activity rules saw
}

// Track is a tracked object: its id (stable across the stream's frames),
// its box (predicted while Missed > 0) and how many frames it lived.
type Track struct {
	ID     uint64 `json:"id"`
	Box    Box    `json:"box"`
	Age    int    `json:"age"`
	Missed int    `json:"missed,omitempty"`
}

// Event is what an activity rule saw about a track.
type Event struct {
	Kind   string `json:"kind"`
	Rule   string `json:"rule"`
	Track  uint64 `json:"track"`
	Detail string `json:"detail,omitempty"`
}

// Box is a detection in frame coordinates.
type Box struct {
	X     int     `json:"x"`
	Y     int     `json:"y"`
	W     int     `json:"w"`
	H     int     `json:"h"`
	Class string  `json:"class,omitempty"`
	Score float32 `json:"score,omitempty"`
}

// StreamInfo is a stream's state and counters (GET /v1/streams).
type StreamInfo struct {
	ID      string    `json:"id"`
	App     string    `json:"app"`
	Started time.Time `json:"started"`
	// State is pending (no frame decoded yet), admitted (joined the app's
	// session) or ended; Ended says why and EndKind its kind (EndClient,
	// EndOverload, ...).
	State   string `json:"state"`
	Ended   string `json:"ended,omitempty"`
	EndKind string `json:"end_kind,omitempty"`
	// Worker is the ingest worker a delegated stream's media goes to
	// (state on-worker while it lives; Config.Delegate).
	Worker string `json:"worker,omitempty"`
	// Codec is the video codec (vp8, h264, h265); Source where the stream
	// comes from: "whip", or a camera's URL (without its password).
	Codec  string `json:"codec,omitempty"`
	Source string `json:"source,omitempty"`
	// Token is the name of the token the stream was started with (never
	// the secret); "" on an open server.
	Token string `json:"token,omitempty"`
	// Waiting says why a camera's stream has no frames now ("camera
	// lost: ...; reconnecting"); CameraLost counts the times its camera
	// went away and GapMS the time without frames since (all gaps).
	Waiting    string  `json:"waiting,omitempty"`
	CameraLost uint64  `json:"camera_lost,omitempty"`
	GapMS      float64 `json:"gap_ms,omitempty"`
	Load       float64 `json:"media_load"` // the share of wall time its media goroutine spends on frames (decode, convert, resize, motion), in cores
	Width      int     `json:"width,omitempty"`
	Height     int     `json:"height,omitempty"`
	// Packets received; frames assembled, decoded, handed to the session;
	// frames skipped to sample the app's rate; frames lost (incomplete),
	// frames that failed to decode, frames skipped waiting for a key frame;
	// PLIs sent; results delivered and results dropped (a slow client, or no client
	// listening: no DataChannel or SSE reader at the time);
	// packets discarded (not VP8, duplicates, late packets of frames
	// already released or given up, a new timeline's first stale frames);
	// times the sender's RTP timestamps jumped back (a new timeline: the
	// capture clock is re-anchored).
	Packets        uint64 `json:"packets"`
	Frames         uint64 `json:"frames"`
	Ingested       uint64 `json:"ingested"`
	Sampled        uint64 `json:"sampled_out"`
	Lost           uint64 `json:"lost"`
	DecodeErrors   uint64 `json:"decode_errors"`
	WaitingKey     uint64 `json:"waiting_key"`
	PLIs           uint64 `json:"plis"`
	ResultsSent    uint64 `json:"results_sent"`
	ResultsDropped uint64 `json:"results_dropped"`
	// ResultsAfterEnd counts results of frames still in flight when the
	// stream ended (the engine accounts the frames; the client is gone).
	ResultsAfterEnd uint64 `json:"results_after_end"`
	Discarded       uint64 `json:"discarded_packets"`
	// Padding counts padding-only packets (a sender's bandwidth probes):
	// they carry nothing, and are neither discarded nor a loss.
	Padding uint64 `json:"padding_packets"`
	// Refused counts frames decoded and handed to the session that it
	// refused (the stream is not in it, the coordinator is unreachable;
	// 10 in a row end the stream); NoPicture frames the decoder gave no
	// picture for yet (a stream with B-frames: the picture comes out with
	// a later frame).
	Refused   uint64 `json:"refused_frames,omitempty"`
	NoPicture uint64 `json:"no_picture,omitempty"`
	// Concealed counts, for an audio stream (Codec opus), the Opus frames
	// made up by loss concealment for packets lost (Lost counts the
	// packets; at most 5 are concealed a gap); its Frames are the Opus
	// packets decoded, Ingested the PCM chunks handed to the session.
	Concealed uint64 `json:"concealed,omitempty"`
	// PartialMS is, for an audio stream, the audio left in an unfinished
	// chunk when the stream ended (shorter than a chunk: never handed to
	// the session), in milliseconds.
	PartialMS float64 `json:"partial_ms,omitempty"`
	Restarts  uint64  `json:"timeline_restarts"`
	LastError string  `json:"last_error,omitempty"`
	// Simulcast (simulcast.go): the layer decoded ("h 640x360": its rid
	// and size), the layers offered, the times the decoded layer changed,
	// and the steps taken below the layer that fits the app because
	// decoding fell behind or the server was overloaded. Packets, lost,
	// discarded, padding and timeline restarts count every layer's (a
	// loss on a layer not decoded is still a loss on the path); frames,
	// waiting_key and decode errors the decoded layer's (each layer's own
	// packets and frames are in layers).
	Layer         string      `json:"layer,omitempty"`
	Layers        []LayerInfo `json:"layers,omitempty"`
	LayerSwitches uint64      `json:"layer_switches,omitempty"`
	LayerDown     int         `json:"layer_down,omitempty"`
}

// Stream states (StreamInfo.State).
const (
	StatePending  = "pending"
	StateAdmitted = "admitted"
	StateEnded    = "ended"
)

type counters struct {
	packets, frames, ingested, sampled, lost, decodeErrors, waitingKey, plis, resultsSent, resultsDropped, discarded, restarts, cameraLost, padding, refused, noPicture, concealed, partialSamples atomic.Uint64
	busy                                                                                                                                                                                           atomic.Int64 // ns the media goroutine spent on frames (decode, convert, resize, objects)
	gap                                                                                                                                                                                            atomic.Int64 // ns a camera's stream went without frames after its camera was lost
}

// admState is a stream's admission state, guarded by the server's mu.
type admState struct {
	media      bool // a video track arrived (its decoding load is coming)
	admitted   bool // its first frame decoded and it was let in
	admittedAt time.Time
	shed       bool
	// The media path's load: cores of wall time, smoothed; samples taken
	// since admitted (the process's CPU load reflects it after two);
	// the busy counter at the last sample.
	load      float64
	samples   int
	lastBusy  int64
	sampledAt time.Time
	lastStep  time.Time // its simulcast layer last stepped down for its own decoding
}

type stream struct {
	s   *Server
	id  string
	app dag.AppID
	fps float64
	// maxW x maxH bound its frames (0: the server's limit; a token's cap
	// when smaller, see limit). token is its token's name ("": none), set under s.mu
	// once it is in s.streams.
	maxW, maxH int
	token      string
	pc         *webrtc.PeerConnection // nil for a Feed (a camera) or a delegated stream
	worker     string                 // a delegated stream's ingest worker (under mu)
	codec      string                 // negotiated (vp8, h264) or the camera's (h264, h265)
	source     string                 // "whip" or the camera's URL, redacted
	started    time.Time
	c          counters
	adm        admState // guarded by s.mu

	mu    sync.Mutex
	subs  map[chan Result]struct{}
	nsubs [2]int // subscribers by kind (subDataChannel, subEvents)
	// early holds the results published before the stream's first
	// subscriber (its DataChannel opening, an SSE reader) arrived: the
	// first results of a fast pipeline can beat the channel's opening.
	// The first subscriber gets them; after it, results with no one to
	// take them are dropped (counted).
	early      []Result
	subscribed bool
	ended      string
	endKind    string
	inSession  bool // joined the sink: leaves it at the end
	lastErr    string
	waiting    string // a camera's stream waiting for its camera
	w, h       int
	lastMedia  time.Time
	idle       clock.Timer
	connect    clock.Timer
	video      bool                      // a video track (an audio app: an Opus track) is being read (one per stream)
	audio      bool                      // the app takes audio (Config.Media)
	audioFmtp  string                    // the offer's Opus fmtp (stereo=1: decoded to stereo), set before the track starts
	sim        atomic.Pointer[simulcast] // a simulcast offer's layers (nil: one video track); set under mu

	done  chan struct{}
	once  sync.Once
	onEnd func()         // a Feed's: frees its decoder
	dcs   sync.WaitGroup // DataChannel senders; end waits for their goodbyes (bounded)
}

func newStream(s *Server, id string, app dag.AppID, fps float64, pc *webrtc.PeerConnection) *stream {
	st := &stream{s: s, id: id, app: app, fps: fps, pc: pc, source: "whip", started: s.clk.Now(), subs: map[chan Result]struct{}{},
		lastMedia: s.clk.Now(), done: make(chan struct{}), audio: s.mediaOf(app) == dag.Audio}
	if pc == nil {
		return st
	}
	pc.OnTrack(st.onTrack)
	pc.OnDataChannel(st.onDataChannel)
	pc.OnConnectionStateChange(func(cs webrtc.PeerConnectionState) {
		switch cs {
		case webrtc.PeerConnectionStateFailed:
			go st.endAs(EndICEFailed, "ICE connection failed")
		case webrtc.PeerConnectionStateClosed:
			go st.endAs(EndClient, "peer connection closed")
		}
	})
	return st
}

// armIdle ends the stream after IdleTimeout without media.
func (st *stream) armIdle() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended != "" {
		return
	}
	wait := st.lastMedia.Add(st.s.cfg.IdleTimeout).Sub(st.s.clk.Now())
	st.idle = st.s.clk.AfterFunc(max(wait, time.Millisecond), func() {
		st.mu.Lock()
		quiet := st.s.clk.Now().Sub(st.lastMedia)
		st.mu.Unlock()
		if quiet >= st.s.cfg.IdleTimeout {
			st.endAs(EndIdle, fmt.Sprintf("no media for %v", st.s.cfg.IdleTimeout))
			return
		}
		st.armIdle()
	})
}

// armConnect ends the stream if its first frame has not decoded
// ConnectTimeout after the offer (an offer that never connects, or never
// sends video, must not hold a slot).
func (st *stream) armConnect() { st.armConnectAfter(st.s.cfg.ConnectTimeout) }

func (st *stream) armConnectAfter(d time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended != "" {
		return
	}
	st.connect = st.s.clk.AfterFunc(d, func() {
		st.s.mu.Lock()
		admitted := st.adm.admitted
		st.s.mu.Unlock()
		if !admitted {
			what, unit := "the offer", "video frame"
			if st.pc == nil {
				what = "the camera's stream opening"
			}
			if st.audio {
				unit = "audio chunk"
			}
			st.endAs(EndConnectTimeout, fmt.Sprintf("no %s decoded within %v of %s (connect timeout)", unit, d, what))
		}
	})
}

// endAs tells the client why (the Ended message after the results still
// queued on each DataChannel, the SSE end event), leaves the session (if
// the stream joined it),
// closes the connection and the result subscriptions; the first reason
// wins. kind is one of the End* kinds (the ended-streams counter's label).
func (st *stream) endAs(kind, why string) {
	st.once.Do(func() {
		st.mu.Lock()
		st.ended, st.endKind = why, kind
		// Results held for a first subscriber that never came: dropped,
		// counted; later ones are dropped as they come.
		st.c.resultsDropped.Add(uint64(len(st.early)))
		st.early, st.subscribed = nil, true
		inSession := st.inSession
		if st.idle != nil {
			st.idle.Stop()
		}
		if st.connect != nil {
			st.connect.Stop()
		}
		st.mu.Unlock()
		close(st.done)
		st.waitGoodbyes() // results still queued, then why (Ended), on every DataChannel
		if inSession {
			if err := st.s.sink.Leave(st.id); err != nil {
				st.s.log.Warn(st.what()+" leave", "stream", st.id, "err", err)
			}
		}
		if st.pc != nil {
			_ = st.pc.Close()
		}
		if st.onEnd != nil {
			st.onEnd()
		}
		st.s.removed(st, st.info())
		if f := st.s.cfg.OnEnded; f != nil {
			f(st.id, kind, why)
		}
		lvl := slog.LevelInfo
		if kind != EndClient && kind != EndShutdown && kind != EndIdle {
			lvl = slog.LevelWarn
		}
		st.s.log.Log(context.Background(), lvl, st.what()+" ended", "app", st.app, "stream", st.id, "kind", kind, "why", why,
			"ingested", st.c.ingested.Load(), "lost", st.c.lost.Load(), "decode_errors", st.c.decodeErrors.Load())
	})
}

// what names the stream in logs: a WHIP stream, or a camera's (an RTSP
// feed through the same ingest).
func (st *stream) what() string {
	if st.source != "whip" {
		return "camera stream"
	}
	return "whip stream"
}

func (st *stream) info() StreamInfo {
	st.s.mu.Lock()
	state, load, token := StatePending, st.adm.load, st.token
	if st.adm.admitted {
		state = StateAdmitted
	}
	st.s.mu.Unlock()
	var layers StreamInfo
	if sim := st.sim.Load(); sim != nil {
		sim.info(&layers)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.worker != "" {
		state = StateOnWorker
	}
	if st.ended != "" {
		state = StateEnded
	}
	return StreamInfo{Token: token, Worker: st.worker, Layer: layers.Layer, Layers: layers.Layers, LayerSwitches: layers.LayerSwitches, LayerDown: layers.LayerDown,
		ID: st.id, App: string(st.app), Started: st.started, State: state, Ended: st.ended, EndKind: st.endKind, Load: load,
		Codec: st.codec, Source: st.source, Waiting: st.waiting, CameraLost: st.c.cameraLost.Load(), GapMS: float64(st.c.gap.Load()) / 1e6,
		Width: st.w, Height: st.h,
		Packets: st.c.packets.Load(), Frames: st.c.frames.Load(), Ingested: st.c.ingested.Load(), Sampled: st.c.sampled.Load(),
		Lost: st.c.lost.Load(), DecodeErrors: st.c.decodeErrors.Load(), WaitingKey: st.c.waitingKey.Load(), PLIs: st.c.plis.Load(),
		ResultsSent: st.c.resultsSent.Load(), ResultsDropped: st.c.resultsDropped.Load(),
		Discarded: st.c.discarded.Load(), Padding: st.c.padding.Load(), Refused: st.c.refused.Load(), NoPicture: st.c.noPicture.Load(), Concealed: st.c.concealed.Load(), PartialMS: float64(st.c.partialSamples.Load()) * 1000 / opusRate, Restarts: st.c.restarts.Load(), LastError: st.lastErr}
}

// ---- results ----

const subBuffer = 256

// MaxSubscribers bounds a stream's result subscribers of each kind (its
// DataChannels, its results event streams): each holds a goroutine and a
// subBuffer queue, so a client cannot open them without end; the kinds
// are bounded apart so that readers of the event stream cannot keep the
// sender's own DataChannel from its results.
const MaxSubscribers = 8

// Subscriber kinds.
const (
	subDataChannel = iota
	subEvents
)

// subscribe adds a result subscriber of kind; ok is false (nothing added)
// when the stream has MaxSubscribers of that kind already.
func (st *stream) subscribe(kind int) (_ chan Result, _ func(), ok bool) {
	ch := make(chan Result, subBuffer)
	st.mu.Lock()
	if st.nsubs[kind] >= MaxSubscribers {
		st.mu.Unlock()
		return nil, nil, false
	}
	st.nsubs[kind]++
	st.subs[ch] = struct{}{}
	if !st.subscribed {
		st.subscribed = true
		for _, r := range st.early { // len(early) <= subBuffer: they fit
			ch <- r
		}
		st.early = nil
	}
	st.mu.Unlock()
	return ch, func() {
		st.mu.Lock()
		if _, ok := st.subs[ch]; ok {
			delete(st.subs, ch)
			st.nsubs[kind]--
		}
		st.mu.Unlock()
		// Results still queued for a subscriber that went away (its
		// DataChannel or SSE connection closed) are dropped: counted.
		for len(ch) > 0 {
			<-ch
			st.c.resultsDropped.Add(1)
		}
	}, true
}

func (st *stream) publish(r Result) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if r.Width == 0 {
		r.Width, r.Height = st.w, st.h
	}
	if len(st.subs) == 0 {
		if !st.subscribed && len(st.early) < subBuffer {
			st.early = append(st.early, r) // for the first subscriber, not yet there
			return
		}
		// No one to deliver it to (a sender without a DataChannel or SSE
		// reader, or one whose channel just closed while its last frames
		// were still in the session): counted, so that a stream's results
		// add up.
		st.c.resultsDropped.Add(1)
		return
	}
	for ch := range st.subs {
		select {
		case ch <- r:
		default:
			st.c.resultsDropped.Add(1) // a slow client loses results, never the service
		}
	}
}

// Ended is the last message on a client's DataChannel when the server ends
// its stream (results are Result messages, which have no "ended").
type Ended struct {
	Stream string `json:"stream"`
	Ended  string `json:"ended"`          // why
	Kind   string `json:"kind,omitempty"` // the end's kind (EndOverload, EndIdle, ...)
}

// goodbyeWait bounds how long ending a stream waits for its DataChannels
// to deliver the results still queued and the Ended message (acknowledged
// by the client) before the connection is closed.
const goodbyeWait = time.Second

func (st *stream) onDataChannel(dc *webrtc.DataChannel) {
	dc.OnOpen(func() {
		st.mu.Lock()
		if st.ended != "" {
			st.mu.Unlock()
			return
		}
		st.dcs.Add(1) // under mu, before end sets ended and waits
		st.mu.Unlock()
		ch, unsub, ok := st.subscribe(subDataChannel)
		if !ok {
			st.dcs.Done()
			st.s.log.Warn("WHIP DataChannel refused: the stream has the most result subscribers", "stream", st.id, "label", dc.Label(), "max", MaxSubscribers)
			_ = dc.Close()
			return
		}
		st.s.wg.Add(1)
		closed := make(chan struct{})
		dc.OnClose(func() { close(closed) })
		go func() {
			defer st.s.wg.Done()
			defer st.dcs.Done()
			defer unsub()
			send := func(r Result) bool {
				b, _ := json.Marshal(r)
				if err := dc.SendText(string(b)); err != nil {
					st.c.resultsDropped.Add(1) // the channel closed under it
					return false
				}
				st.c.resultsSent.Add(1)
				return true
			}
			for {
				select {
				case r := <-ch:
					if !send(r) {
						return
					}
				case <-closed:
					return
				case <-st.done:
					for len(ch) > 0 { // results already published go first
						if !send(<-ch) {
							return
						}
					}
					st.goodbye(dc, closed)
					return
				}
			}
		}()
	})
}

// goodbye tells the client why its stream ended and waits (bounded) until
// the client has acknowledged everything sent.
func (st *stream) goodbye(dc *webrtc.DataChannel, closed <-chan struct{}) {
	st.mu.Lock()
	why, kind := st.ended, st.endKind
	st.mu.Unlock()
	flushed := make(chan struct{})
	var once sync.Once
	dc.SetBufferedAmountLowThreshold(0)
	dc.OnBufferedAmountLow(func() { once.Do(func() { close(flushed) }) })
	b, _ := json.Marshal(Ended{Stream: st.id, Ended: why, Kind: kind})
	if dc.SendText(string(b)) != nil || dc.BufferedAmount() == 0 {
		return
	}
	select {
	case <-flushed:
	case <-closed:
	case <-st.s.clk.After(goodbyeWait):
	}
}

// waitGoodbyes waits for the DataChannel senders to say goodbye (each
// bounds its own wait by goodbyeWait).
func (st *stream) waitGoodbyes() {
	st.dcs.Wait()
}

// ---- media ----

// claimMedia makes track the stream's media when it is of the kind the
// app takes (ok) and the stream has none yet: the stream counts in the
// predicted load until it is measured. Any other track (audio for a video
// app, a second track) is read and discarded, so the interceptors (RTCP)
// keep working; false then.
func (st *stream) claimMedia(track *webrtc.TrackRemote, ok bool, codec string) bool {
	st.mu.Lock()
	first := ok && !st.video
	st.video = st.video || first
	if first {
		st.codec = codec
	}
	st.mu.Unlock()
	if !first {
		discard(track)
		return false
	}
	st.s.mu.Lock()
	st.adm.media = true
	st.s.mu.Unlock()
	return true
}

func (st *stream) onTrack(track *webrtc.TrackRemote, recv *webrtc.RTPReceiver) {
	codec := codecOf(track.Codec().MimeType)
	if st.audio {
		st.onAudioTrack(track, recv, codec)
		return
	}
	if track.Kind() == webrtc.RTPCodecTypeVideo && codec != "" && track.RID() != "" {
		st.onLayer(track, recv, codec) // a simulcast layer
		return
	}
	if !st.claimMedia(track, track.Kind() == webrtc.RTPCodecTypeVideo && codec != "", codec) {
		return
	}
	st.s.wg.Add(2)
	sync := &captureClock{}
	go st.readSenderReports(recv, sync)
	go func() {
		defer st.s.wg.Done()
		st.readVideo(track, codec, sync)
	}()
}

// discard reads a track the stream does not use (audio of a video app, a
// second track) and drops it, so the interceptors (RTCP) keep working.
func discard(track *webrtc.TrackRemote) {
	go func() {
		for {
			if _, _, err := track.ReadRTP(); err != nil {
				return
			}
		}
	}()
}

// readSenderReports feeds the RTCP sender reports of recv to sync until
// the receiver closes (st.s.wg counted by the caller).
func (st *stream) readSenderReports(recv *webrtc.RTPReceiver, sync *captureClock) {
	defer st.s.wg.Done()
	for {
		pkts, _, err := recv.ReadRTCP()
		if err != nil {
			return
		}
		for _, p := range pkts {
			if sr, ok := p.(*rtcp.SenderReport); ok {
				sync.senderReport(sr.NTPTime, sr.RTPTime, st.s.clk.Now())
			}
		}
	}
}

func (st *stream) readVideo(track *webrtc.TrackRemote, codec string, sync *captureClock) {
	dec, err := newDecoder(codec)
	if err != nil {
		st.fail(err)
		st.endAs(EndError, "decoder: "+err.Error())
		return
	}
	defer dec.Close()
	p := &pipeline{st: st, dec: dec, sync: sync, needKey: true, ssrc: uint32(track.SSRC()), asm: assembler{format: payloadFormatOf(codec)}}
	if st.s.cfg.Objects != nil {
		p.objects = st.s.cfg.Objects()
		defer p.objects.Close()
	}
	p.pli() // at start: a key frame now, not at the sender's next interval
	readRTP(track, p.packet)
}

// readRTP hands each RTP packet of track to each until the track ends or
// each says stop; packets that do not parse are skipped.
func readRTP(track *webrtc.TrackRemote, each func(*rtp.Packet) bool) {
	buf := make([]byte, maxRTPPacket)
	for {
		n, _, err := track.Read(buf)
		if err != nil {
			return
		}
		var pkt rtp.Packet
		if err := pkt.Unmarshal(buf[:n]); err != nil {
			continue
		}
		if !each(&pkt) {
			return
		}
	}
}

// pipeline is a stream's RTP -> frame -> decode -> sample -> session
// path; one goroutine drives it. A Feed (a camera) enters at frame.
type pipeline struct {
	st      *stream
	dec     decoder
	sync    *captureClock
	asm     assembler
	needKey bool
	ssrc    uint32
	lastPLI time.Time
	lost    int
	discard int // the assembler's discarded, padding and restarts counts already added to the stream's
	padding int
	// badRun counts the frames in a row that failed to decode.
	badRun int
	// refusedRun counts the frames in a row the session refused.
	refusedRun int
	// The access units' stamps and capture times, for pictures a decoder
	// releases out of order (stampedDecoder).
	stampN  int64
	stamps  []stampedCapture
	restart int
	next    time.Time // the next sampling slot
	seq     uint64
	sendPLI func() error // nil: RTCP to the peer
	objects Objects      // nil: frames go without ground truth
	joined  bool         // the first frame decoded and the stream was admitted
	// onFrame, when set, takes the assembled frames instead of frame (a
	// simulcast layer: simulcast.frame decides whether it is decoded).
	onFrame func(codedFrame, time.Time) bool
	// decW and decH are the size of the last decoded frame (before the
	// resolution limit).
	decW, decH int
}

// packet handles one RTP packet; false ends the stream's reading.
func (p *pipeline) packet(pkt *rtp.Packet) bool {
	st := p.st
	now := st.s.clk.Now()
	st.c.packets.Add(1)
	st.mu.Lock()
	st.lastMedia = now
	ended := st.ended != ""
	st.mu.Unlock()
	if ended {
		return false
	}
	frames := p.asm.push(pkt)
	if p.asm.discarded > p.discard {
		st.c.discarded.Add(uint64(p.asm.discarded - p.discard))
		p.discard = p.asm.discarded
	}
	if p.asm.padding > p.padding {
		st.c.padding.Add(uint64(p.asm.padding - p.padding))
		p.padding = p.asm.padding
	}
	if p.asm.restarts > p.restart {
		// The sender's RTP timestamps jumped back: a new timeline. Capture
		// times and the sampling grid start again from arrivals.
		st.c.restarts.Add(uint64(p.asm.restarts - p.restart))
		p.restart = p.asm.restarts
		p.sync.restart(now)
		p.next = time.Time{}
		st.s.log.Warn("whip sender's RTP timestamps jumped back: new timeline, capture clock re-anchored",
			"app", st.app, "stream", st.id, "timestamp", pkt.Timestamp, "restarts", p.restart)
	}
	if p.asm.lost > p.lost {
		st.c.lost.Add(uint64(p.asm.lost - p.lost))
		p.lost = p.asm.lost
		p.needKey = true
		p.pli()
	}
	for _, fr := range frames {
		take := p.frame
		if p.onFrame != nil {
			take = p.onFrame
		}
		if !take(fr, now) {
			return false
		}
	}
	return true
}

// frame decodes one assembled frame, samples it to the app's rate and
// hands it to the session; false ends the stream's reading.
func (p *pipeline) frame(fr codedFrame, now time.Time) bool {
	st := p.st
	st.c.frames.Add(1)
	if p.needKey && !fr.Key {
		st.c.waitingKey.Add(1)
		p.pli()
		return true
	}
	if err := p.declared(fr); err != nil {
		// Refused before the decoder sees it: libvpx allocates what a key
		// frame declares (a 41-byte one declaring 16383x16383 held ~870 MB
		// and 0.5-1.2 s of CPU a frame, per stream).
		st.c.decodeErrors.Add(1)
		st.fail(err)
		go st.endAs(EndError, err.Error())
		return false
	}
	capture := p.sync.capture(fr.TS, now)
	take := p.sample(capture)
	var img *media.Frame
	var err error
	work := time.Now() // the decoding load is real CPU time, whatever the injected clock says
	if take {
		img, capture, err = p.decode(fr.Data, capture)
	} else {
		err = p.skip(fr.Data, capture)
		st.c.sampled.Add(1)
	}
	if err != nil {
		st.c.busy.Add(int64(time.Since(work)))
		st.c.decodeErrors.Add(1)
		st.fail(err)
		// after an error only key frames are decoded (the rest wait): a
		// run of them that all fail is a stream that costs decoding and
		// yields nothing, so it ends
		if p.badRun++; p.badRun >= MaxDecodeErrors {
			err = fmt.Errorf("%d frames in a row failed to decode (last: %v)", p.badRun, err)
			st.fail(err)
			go st.endAs(EndError, err.Error())
			return false
		}
		p.needKey = true
		p.pli()
		return true
	}
	p.needKey, p.badRun = false, 0
	if !take || img == nil {
		st.c.busy.Add(int64(time.Since(work)))
		if take {
			// The decoder holds the picture back (a stream with B-frames:
			// pictures come out in display order, one or two frames
			// later, with a later frame): counted, not lost.
			st.c.noPicture.Add(1)
		}
		return true
	}
	p.decW, p.decH = img.W, img.H
	if img, err = st.fit(img); err != nil {
		st.fail(err)
		go st.endAs(EndError, err.Error())
		return false
	}
	var truth []media.Box
	if p.objects != nil {
		truth = p.objects.Boxes(img)
	}
	st.c.busy.Add(int64(time.Since(work)))
	if !p.joined {
		// The first decoded frame: the stream is admitted (or ended)
		// now, so offers that never send media never reach the session.
		if kind, why := st.admitFirst(); kind != "" {
			go st.endAs(kind, why)
			return false
		}
		p.joined = true
	}
	p.seq++
	return st.handed(st.s.sink.Ingest(st.id, p.seq, capture, img, truth), &p.refusedRun, "frames")
}

// handed counts what the session said to one frame or chunk (what: its
// kind, plural) and says whether the stream goes on. A refusal (the stream
// is not in the session, the coordinator is unreachable) is counted;
// maxRefusedRun in a row (run) end the stream, so it is not decoded for
// nothing (a camera then opens a new stream).
func (st *stream) handed(err error, run *int, what string) bool {
	if err != nil {
		st.c.refused.Add(1)
		st.fail(err)
		if *run++; *run >= maxRefusedRun {
			go st.endAs(EndError, fmt.Sprintf("the session refused %d %s in a row: %v", *run, what, err))
			return false
		}
		return true
	}
	*run = 0
	st.c.ingested.Add(1)
	return true
}

// maxRefusedRun is how many frames in a row the session may refuse before
// the stream is ended.
const maxRefusedRun = 10

// stampedDecoder is a decoder whose pictures may come out of order (H.264
// and H.265 with B-frames: ingest/avc): each access unit goes in with a
// stamp and each picture comes out with the stamp of the unit it was coded
// in.
type stampedDecoder interface {
	DecodeAt(data []byte, stamp int64) (*media.Frame, int64, error)
	SkipAt(data []byte, stamp int64) error
}

// stampedCapture is the capture time of the access unit stamped n.
type stampedCapture struct {
	n       int64
	capture time.Time
}

// maxStamps bounds the capture times kept for pictures still in the
// decoder (H.264 reorders at most 16 frames).
const maxStamps = 17

// decode decodes one frame captured at capture; it returns the picture
// with its own capture time: with B-frames the picture is an earlier
// frame's, released by this one.
func (p *pipeline) decode(data []byte, capture time.Time) (*media.Frame, time.Time, error) {
	sd, ok := p.dec.(stampedDecoder)
	if !ok {
		img, err := p.dec.Decode(data)
		return img, capture, err
	}
	img, stamp, err := sd.DecodeAt(data, p.stampNext(capture))
	if img != nil {
		capture = p.stampedCapture(stamp, capture)
	}
	return img, capture, err
}

func (p *pipeline) skip(data []byte, capture time.Time) error {
	if sd, ok := p.dec.(stampedDecoder); ok {
		return sd.SkipAt(data, p.stampNext(capture))
	}
	return p.dec.Skip(data)
}

// stampNext stamps the next access unit and keeps its capture time.
func (p *pipeline) stampNext(capture time.Time) int64 {
	p.stampN++
	p.stamps = append(p.stamps, stampedCapture{p.stampN, capture})
	if len(p.stamps) > maxStamps {
		p.stamps = p.stamps[len(p.stamps)-maxStamps:]
	}
	return p.stampN
}

// stampedCapture is the capture time of the unit stamped n (or, if it is
// no longer kept, def).
func (p *pipeline) stampedCapture(n int64, def time.Time) time.Time {
	for _, s := range p.stamps {
		if s.n == n {
			return s.capture
		}
	}
	return def
}

// sample keeps frames at the app's rate: a frame is taken when its capture
// time reaches the next slot, less a quarter period; slots advance by 1/fps
// from the first frame. Without the quarter period a source at a multiple
// of the app's rate puts every frame exactly on a slot, and capture-time
// jitter of a fraction of a millisecond decides between two source frames
// (30 fps into 10: gaps of 67 and 133 ms instead of 100).
func (p *pipeline) sample(capture time.Time) bool {
	if p.st.fps <= 0 {
		return true
	}
	period := time.Duration(float64(time.Second) / p.st.fps)
	if !p.next.IsZero() && capture.Before(p.next.Add(-period/4)) {
		return false
	}
	if p.next.IsZero() || capture.Sub(p.next) > period {
		p.next = capture.Add(period) // first frame, or after a gap: restart the grid
	} else {
		p.next = p.next.Add(period)
	}
	return true
}

// pli asks the sender for a key frame, at most every 200 ms.
func (p *pipeline) pli() {
	now := p.st.s.clk.Now()
	if !p.lastPLI.IsZero() && now.Sub(p.lastPLI) < 200*time.Millisecond {
		return
	}
	p.lastPLI = now
	send := p.sendPLI
	if send == nil && p.st.pc == nil {
		return // a camera: RTSP has no way to ask for a key frame; the next one comes at the camera's interval
	}
	if send == nil {
		send = func() error {
			return p.st.pc.WriteRTCP([]rtcp.Packet{&rtcp.PictureLossIndication{MediaSSRC: p.ssrc}})
		}
	}
	if err := send(); err == nil {
		p.st.c.plis.Add(1)
	}
}

func (st *stream) fail(err error) {
	st.mu.Lock()
	st.lastErr = err.Error()
	st.mu.Unlock()
}

// fit applies the resolution limit: frames above it are scaled down to fit
// (aspect kept) or refused, as configured.
func (st *stream) fit(f *media.Frame) (*media.Frame, error) {
	mw, mh := st.limit()
	if f.W <= mw && f.H <= mh {
		st.setSize(f.W, f.H)
		return f, nil
	}
	if st.s.cfg.Oversize == Reject {
		return nil, fmt.Errorf("resolution %dx%d above the limit %dx%d", f.W, f.H, mw, mh)
	}
	scale := min(float64(mw)/float64(f.W), float64(mh)/float64(f.H))
	w, h := max(1, int(float64(f.W)*scale)), max(1, int(float64(f.H)*scale))
	out, err := st.s.cfg.Scale(f, w, h)
	if err != nil {
		return nil, err
	}
	st.setSize(w, h)
	return out, nil
}

// MaxDecodeErrors ends a stream whose frames fail to decode this many
// times in a row (after a failure only key frames are tried, so these are
// key frames the decoder refuses: a broken or hostile sender).
const MaxDecodeErrors = 10

// MaxDecode bounds the frame size a stream may declare before it is
// decoded (each dimension): with Downscale, frames up to it are decoded and
// scaled to the limit; above it (or, with Reject, above the limit) the
// stream is ended unread. A 4096-wide DCI 4K camera fits.
const MaxDecode = 4096

// declared checks the size a VP8 key frame (RFC 6386 9.1) or an H.264
// SPS declares against what the stream may decode, before the decoder
// allocates for it.
func (p *pipeline) declared(fr codedFrame) error {
	var w, h, dw, dh int // coded (what the decoder allocates) and shown
	var ok bool
	what := "VP8 key frame"
	switch p.st.codec {
	case CodecVP8:
		if !fr.Key {
			return nil // only key frames declare a size
		}
		w, h, ok = vp8KeySize(fr.Data)
		dw, dh = w, h
	case CodecH264:
		// any access unit may carry an SPS, a key frame or not; its coded
		// size is what the decoder allocates, whatever the cropping shows
		var err error
		if w, h, dw, dh, ok, err = h264SPSSize(fr.Data); err != nil {
			return fmt.Errorf("%v: refused before decoding", err)
		}
		what = "H.264 SPS"
	}
	if !ok {
		return nil // no size header: the decoder says what is wrong
	}
	mw, mh := p.st.limit()
	if p.st.s.cfg.Oversize == Reject {
		if dw > mw || dh > mh {
			return fmt.Errorf("resolution %dx%d above the limit %dx%d (the %s's header; refused before decoding)", dw, dh, mw, mh, what)
		}
	}
	if mw, mh = max(mw, MaxDecode), max(mh, MaxDecode); w > mw || h > mh {
		return fmt.Errorf("%s declares %dx%d, above the %dx%d this stream may decode: refused before decoding", what, w, h, mw, mh)
	}
	return nil
}

// limit is the stream's resolution limit: its own (a token's cap) when
// set, else the server's.
func (st *stream) limit() (w, h int) {
	if st.maxW > 0 && st.maxH > 0 {
		return st.maxW, st.maxH
	}
	return st.s.cfg.MaxWidth, st.s.cfg.MaxHeight
}

func (st *stream) setSize(w, h int) {
	st.mu.Lock()
	st.w, st.h = w, h
	st.mu.Unlock()
}

// captureClock maps RTP timestamps to capture times: from the sender's
// RTCP Sender Reports (its wall clock at a given RTP time) once one has
// arrived and agrees with arrival times, before that from the first
// frame's arrival. A report's wall clock is read when the report is sent,
// so its mapping carries the sender's delay after capture (encoding, a
// busy machine); of the reports of the last srWindow the one implying the
// earliest capture is used, which keeps capture times steady (one frame
// interval apart) while the sender's delays vary. A frame cannot arrive
// before it was captured: when one does by a mapping, the mapping is late
// by at least that much and is moved earlier (carried over to a new mapping
// that is earlier, dropped for one that is later), so capture times stay
// steady and never after arrival.
type captureClock struct {
	rate      int64 // the RTP clock (0: video's 90 kHz; Opus: 48 kHz)
	mu        sync.Mutex
	base      bool
	bRTP      uint32
	bAt       time.Time
	srs       []srSample // newest last, within srWindow
	late      time.Duration
	lateFor   srSample  // the mapping late applies to
	restarted time.Time // when the sender's timeline last jumped back
}

// srGrace is how long after a new timeline sender reports are not used: a
// report of the old timeline still in flight would map the new one's
// frames by the old one.
const srGrace = time.Second

// restart starts a new timeline (the sender's RTP timestamps jumped back)
// at now: the anchor and the sender reports of the old one no longer apply;
// capture times come from arrivals until the new timeline's reports do.
func (c *captureClock) restart(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.base, c.srs, c.late, c.lateFor = false, nil, 0, srSample{}
	c.restarted = now
}

type srSample struct {
	rtp  uint32
	at   time.Time // the sender's wall clock at rtp
	recv time.Time // when the report arrived
}

// maxSkew is how far a sender-report capture time may be from what
// arrivals imply before the sender's clock is distrusted; srWindow how long
// a report counts.
const (
	maxSkew  = 2 * time.Second
	srWindow = 10 * time.Second
)

// senderReport takes an RTCP Sender Report received at recv. One whose
// wall clock is far from the receiver's (beyond maxSkew, or ahead by more
// than 5 ms) is ignored: that sender's capture times come from arrivals.
func (c *captureClock) senderReport(ntp uint64, rtpTS uint32, recv time.Time) {
	at := ntpTime(ntp)
	if d := recv.Sub(at); d < -5*time.Millisecond || d > maxSkew {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.restarted.IsZero() && recv.Sub(c.restarted) < srGrace {
		return
	}
	c.srs = append(c.srs, srSample{rtp: rtpTS, at: at, recv: recv})
	i := 0
	for i < len(c.srs)-1 && recv.Sub(c.srs[i].recv) > srWindow {
		i++
	}
	c.srs = c.srs[i:]
}

func (c *captureClock) capture(ts uint32, arrival time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.base {
		c.base, c.bRTP, c.bAt = true, ts, arrival
	}
	at := c.bAt.Add(c.delta(ts, c.bRTP))
	if len(c.srs) > 0 {
		best := c.srs[0]
		sr := best.at.Add(c.delta(ts, best.rtp))
		for _, x := range c.srs[1:] {
			if t := x.at.Add(c.delta(ts, x.rtp)); t.Before(sr) {
				best, sr = x, t
			}
		}
		if best != c.lateFor {
			// A new earliest mapping. One earlier than the corrected one
			// replaces what is left of the correction (a report that maps
			// 1 ms earlier must not move capture times 29 ms later); one
			// later than the old mapping (the old report left the window:
			// the sender's delay really grew) starts afresh.
			if c.late > 0 && c.lateFor != (srSample{}) {
				if d := c.lateFor.at.Add(c.delta(ts, c.lateFor.rtp)).Sub(sr); d >= 0 {
					c.late = max(0, c.late-d)
				} else {
					c.late = 0
				}
			} else {
				c.late = 0
			}
			c.lateFor = best
		}
		sr = sr.Add(-c.late)
		if d := arrival.Sub(sr); d >= -maxSkew && d <= maxSkew {
			if d < 0 {
				c.late -= d // the frame arrived before the mapping's capture time
				return arrival
			}
			return sr
		}
		// The sender's timeline disagrees with arrivals: not used.
	}
	if at.After(arrival) {
		// The sender's timeline runs ahead of arrivals (it paused, or
		// the first frame was late): re-anchor.
		c.bRTP, c.bAt = ts, arrival
		return arrival
	}
	return at
}

// delta is the time from RTP timestamp ref to ts on the clock's rate.
func (c *captureClock) delta(ts, ref uint32) time.Duration {
	rate := c.rate
	if rate <= 0 {
		rate = videoClockRate
	}
	return time.Duration(int64(int32(ts-ref)) * int64(time.Second) / rate)
}

// ntpTime converts a 64-bit NTP timestamp (RFC 3550) to time.
func ntpTime(ntp uint64) time.Time {
	const ntpToUnix = 2208988800
	sec := int64(ntp>>32) - ntpToUnix
	frac := int64(ntp & 0xffffffff)
	return time.Unix(sec, frac*int64(time.Second)>>32)
}
