package whip

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"github.com/bluenviron/mediacommon/pkg/codecs/h264"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/rtcp"
	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"
)

// Simulcast.
//
// A sender may offer its video in several layers (RFC 8853 a=simulcast,
// RFC 8851 a=rid): the same pictures at different sizes, each layer its
// own RTP stream (own SSRC) told apart by the rtp-stream-id header
// extension. pion fires OnTrack once per rid. Every layer's RTP is read
// (the interceptors need it: NACKs, receiver reports) and assembled into
// frames, so each layer's key frames and size are known; only one layer,
// the active one, is decoded. Its size comes from its decoded frames; the
// other layers' from their key frames (VP8: the key frame's header; H.264:
// one key frame decoded by a throwaway decoder, at most once per
// probeEvery per layer).
//
// The active layer is the smallest whose size covers what the app needs
// (the server's MaxWidth x MaxHeight, --max-resolution), else the largest,
// less the steps down taken because decoding fell behind. A change of
// layer asks the new layer for a key frame (PLI) and happens at that key
// frame: the decoder goes on from it, the capture clock and PLIs switch to
// the new layer's SSRC, frame numbers and the sampling grid go on.
//
// Stepping down and up is admission's (admission.go): when the process's
// CPU load is above capacity, or the app is saturated, or a stream's
// decoding path is busy most of the wall time, simulcast streams step a
// layer down before any stream is shed; when the load has stayed well
// below capacity for stepUpAfter, one stream steps back up (hysteresis).

// probeEvery bounds how often a layer that is not decoded has a key frame
// decoded to learn its size (H.264).
const probeEvery = time.Second

// sizePLIEvery is how often a layer whose size is not known yet is asked
// for a key frame.
const sizePLIEvery = 500 * time.Millisecond

// layer is one simulcast layer (one rid) of a stream.
type layer struct {
	rid  string
	ssrc uint32
	p    *pipeline // its packet side: assembler, capture clock, loss
	// wanted: active or target (its losses ask for key frames).
	wanted atomic.Bool
	// Guarded by simulcast.mu.
	w, h      int
	lastProbe time.Time
	startPLI  time.Time // a PLI asking for a first key frame to start from
	// Counters: packets, frames assembled, key frames among them, frames
	// handed to the decoder (decoded or skipped to sample the app's rate),
	// key frames decoded only to learn the layer's size.
	packets, frames, keys, decoded, probes atomic.Uint64
}

// LayerInfo is one simulcast layer as StreamInfo lists it.
type LayerInfo struct {
	RID    string `json:"rid"`
	Width  int    `json:"width,omitempty"` // 0: not known yet (no key frame)
	Height int    `json:"height,omitempty"`
	Active bool   `json:"active,omitempty"` // the layer decoded now
	Target bool   `json:"target,omitempty"` // the layer switched to at its next key frame
	// Packets and frames received, key frames among them, frames handed
	// to the decoder (only the active layer's), key frames decoded to
	// learn its size.
	Packets   uint64 `json:"packets"`
	Frames    uint64 `json:"frames"`
	KeyFrames uint64 `json:"key_frames"`
	Decoded   uint64 `json:"decoded"`
	Probes    uint64 `json:"probes,omitempty"`
}

// simulcast is a simulcast stream's layers and its one decode path.
type simulcast struct {
	st    *stream
	codec string

	mu     sync.Mutex // the decode path (dec) and the choice
	dec    *pipeline  // decode, sample, session: driven by the active layer's goroutine
	layers []*layer   // in arrival order
	active *layer     // decoded now (nil until a layer's first key frame)
	target *layer     // switched to at its next key frame (nil: none)
	down   int        // steps below the fitting layer (decoding fell behind)
	closed bool
	// The target's last PLI (sim-wide: the target changes rarely).
	targetPLI time.Time

	switches atomic.Uint64
	// canDown and stepped mirror the choice for admission, which must
	// not take mu (mu is taken before the server's: a first frame
	// admits the stream under it).
	canDown atomic.Bool
	stepped atomic.Int32
}

// onLayer takes a track of a simulcast offer (one rid). The first creates
// the stream's simulcast state and its decoder.
func (st *stream) onLayer(track *webrtc.TrackRemote, recv *webrtc.RTPReceiver, codec string) {
	st.mu.Lock()
	sim := st.sim.Load()
	if sim == nil && st.video {
		// A plain video track came first: this one is not read as media.
		st.mu.Unlock()
		discardTrack(st, track)
		return
	}
	created := sim == nil
	if created {
		// Built whole before it is published: pion runs OnTrack handlers
		// concurrently, and another layer's goroutine may use sim (its
		// decode path) as soon as it can load it.
		dec, err := newDecoder(codec)
		if err != nil {
			st.mu.Unlock()
			st.fail(err)
			go st.endAs(EndError, "decoder: "+err.Error())
			discardTrack(st, track)
			return
		}
		sim = &simulcast{st: st, codec: codec, dec: &pipeline{st: st, dec: dec, needKey: true, sync: &captureClock{}}}
		if st.s.cfg.Objects != nil {
			sim.dec.objects = st.s.cfg.Objects()
		}
		st.sim.Store(sim)
		st.video, st.codec = true, codec
	}
	st.mu.Unlock()
	if created {
		st.s.mu.Lock()
		st.adm.media = true
		st.s.mu.Unlock()
		st.s.wg.Add(1)
		go func() { // the decoder goes with the stream
			defer st.s.wg.Done()
			<-st.done
			sim.mu.Lock()
			defer sim.mu.Unlock()
			sim.closed = true
			sim.dec.dec.Close()
			if sim.dec.objects != nil {
				sim.dec.objects.Close()
			}
		}()
	}
	if codecOf(track.Codec().MimeType) != sim.codec {
		discardTrack(st, track) // a layer in another codec: not ours to switch to
		return
	}
	l := &layer{rid: track.RID(), ssrc: uint32(track.SSRC())}
	l.p = &pipeline{st: st, sync: &captureClock{}, ssrc: l.ssrc, asm: assembler{format: payloadFormatOf(codec)}}
	l.p.onFrame = func(fr codedFrame, now time.Time) bool { return sim.frame(l, fr, now) }
	l.p.sendPLI = func() error {
		if !l.wanted.Load() {
			return errNotWanted // a layer not decoded needs no key frame
		}
		return st.pc.WriteRTCP([]rtcp.Packet{&rtcp.PictureLossIndication{MediaSSRC: l.ssrc}})
	}
	sim.mu.Lock()
	sim.layers = append(sim.layers, l)
	sim.mu.Unlock()
	st.s.log.Info("whip simulcast layer", "app", st.app, "stream", st.id, "rid", l.rid, "ssrc", l.ssrc, "codec", codec)
	// The layer's RTCP: its sender reports set its capture clock.
	st.s.wg.Add(1)
	go func() {
		defer st.s.wg.Done()
		for {
			pkts, _, err := recv.ReadSimulcastRTCP(l.rid)
			if err != nil {
				return
			}
			for _, p := range pkts {
				if sr, ok := p.(*rtcp.SenderReport); ok {
					l.p.sync.senderReport(sr.NTPTime, sr.RTPTime, st.s.clk.Now())
				}
			}
		}
	}()
	st.s.wg.Add(1)
	go func() {
		defer st.s.wg.Done()
		readRTP(track, func(pkt *rtp.Packet) bool {
			l.packets.Add(1)
			return l.p.packet(pkt)
		})
	}()
}

var errNotWanted = fmt.Errorf("layer not decoded")

// discardTrack reads a track and drops its packets, so the interceptors
// (RTCP) keep working.
func discardTrack(st *stream, track *webrtc.TrackRemote) {
	st.s.wg.Add(1)
	go func() {
		defer st.s.wg.Done()
		for {
			if _, _, err := track.ReadRTP(); err != nil {
				return
			}
		}
	}()
}

// frame takes one assembled frame of layer l (from l's goroutine); false
// ends l's reading.
func (s *simulcast) frame(l *layer, fr codedFrame, now time.Time) bool {
	l.frames.Add(1)
	if fr.Key {
		l.keys.Add(1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	// A key frame a decoder can start from (H.264: with its parameter
	// sets; a layer's first packets, often the SPS and PPS before its
	// first IDR, may be lost).
	start := switchable(s.codec, fr)
	if start && l != s.active && (l.w == 0 || now.Sub(l.lastProbe) >= probeEvery) {
		if w, h, ok := s.size(l, fr.Data); ok && (w != l.w || h != l.h) {
			l.w, l.h = w, h
			s.chooseLocked(now)
		}
		l.lastProbe = now
	}
	if !start && l.w == 0 && (l.startPLI.IsZero() || now.Sub(l.startPLI) >= sizePLIEvery) {
		// A layer whose size is unknown (its first key frame lost) is
		// asked for a key frame: the choice needs its size, the start a
		// key frame.
		l.startPLI = now
		if s.st.pc.WriteRTCP([]rtcp.Packet{&rtcp.PictureLossIndication{MediaSSRC: l.ssrc}}) == nil {
			s.st.c.plis.Add(1)
		}
	}
	if s.active == nil {
		if !start {
			return true
		}
		s.switchLocked(l) // the first layer with a key frame starts the stream
		s.chooseLocked(now)
	}
	if l == s.target {
		if !start {
			s.pliTargetLocked(now)
			return true
		}
		s.switchLocked(l)
	}
	if l != s.active {
		return true
	}
	if l.p.needKey { // the layer lost packets: the decoder needs a key frame
		s.dec.needKey = true
		l.p.needKey = false
	}
	l.decoded.Add(1)
	s.dec.decW, s.dec.decH = 0, 0 // set when this frame is decoded to a picture (not when skipped)
	ok := s.dec.frame(fr, now)
	if s.dec.decW > 0 && (s.dec.decW != l.w || s.dec.decH != l.h) {
		l.w, l.h = s.dec.decW, s.dec.decH // the sender changed the layer's size
		s.chooseLocked(now)
	}
	return ok
}

// size is a layer's frame size from a key frame: VP8's header, or the key
// frame decoded by a throwaway decoder (H.264).
func (s *simulcast) size(l *layer, key []byte) (w, h int, ok bool) {
	if s.codec == CodecVP8 {
		return vp8KeySize(key)
	}
	// the SPS's coded size first: a layer declaring more than MaxDecode
	// is never decoded, not even to learn its size
	if cw, ch, _, _, found, err := h264SPSSize(key); err != nil || !found || cw > MaxDecode || ch > MaxDecode {
		return 0, 0, false
	}
	dec, err := newDecoder(s.codec)
	if err != nil {
		return 0, 0, false
	}
	defer dec.Close()
	l.probes.Add(1)
	work := time.Now()
	img, err := dec.Decode(key)
	s.st.c.busy.Add(int64(time.Since(work)))
	if err != nil || img == nil {
		return 0, 0, false
	}
	return img.W, img.H, true
}

// switchable says whether a decoder can start from fr: a VP8 key frame,
// an H.264 IDR access unit carrying its SPS and PPS.
func switchable(codec string, fr codedFrame) bool {
	if !fr.Key || codec != CodecH264 {
		return fr.Key
	}
	var sps, pps bool
	for i := 0; i+3 < len(fr.Data); i++ {
		if fr.Data[i] == 0 && fr.Data[i+1] == 0 && fr.Data[i+2] == 1 {
			switch fr.Data[i+3] & 0x1f {
			case 7:
				sps = true
			case 8:
				pps = true
			}
			i += 2
		}
	}
	return sps && pps
}

// vp8KeySize reads a VP8 key frame's size (RFC 6386 9.1: a 3-byte frame
// tag, the start code 9d 01 2a, then 14-bit width and height).
func vp8KeySize(b []byte) (w, h int, ok bool) {
	if len(b) < 10 || b[0]&1 != 0 || b[3] != 0x9d || b[4] != 0x01 || b[5] != 0x2a {
		return 0, 0, false
	}
	w, h = int(binary.LittleEndian.Uint16(b[6:])&0x3fff), int(binary.LittleEndian.Uint16(b[8:])&0x3fff)
	if w == 0 || h == 0 {
		return 0, 0, false
	}
	return w, h, true
}

// h264SPSSize reads the coded size (its macroblocks, before any cropping,
// what the decoder allocates) and the display size (after cropping) the
// SPS of an H.264 access unit (Annex B) declares, before the decoder
// allocates for it: found is false when the unit carries no SPS; an SPS
// that does not parse as far as its size is an error (the decoder might
// read it anyway). It scans without allocating: every access unit of a
// stream passes here.
func h264SPSSize(b []byte) (w, h, dispW, dispH int, found bool, err error) {
	for i := 0; i+3 < len(b); {
		k := bytes.Index(b[i:], startCode3)
		if k < 0 {
			break
		}
		start := i + k + 3
		if start >= len(b) {
			break
		}
		end := len(b)
		if n := bytes.Index(b[start:], startCode3); n >= 0 {
			end = start + n
		}
		i = end
		if h264.NALUType(b[start]&0x1f) != h264.NALUTypeSPS {
			continue
		}
		var sps h264.SPS
		perr := sps.Unmarshal(bytes.TrimRight(b[start:end], "\x00"))
		mbW, mapH := uint64(sps.PicWidthInMbsMinus1)+1, uint64(sps.PicHeightInMapUnitsMinus1)+1
		if perr != nil && sps.PicWidthInMbsMinus1 == 0 && sps.PicHeightInMapUnitsMinus1 == 0 {
			// the size was not reached (a genuine 16x16 SPS that fails
			// later is refused too: harmless)
			return 0, 0, 0, 0, true, fmt.Errorf("H.264 SPS does not parse as far as its picture size (%v)", perr)
		}
		if !sps.FrameMbsOnlyFlag {
			mapH *= 2 // field pictures: map units are pairs of macroblock rows
		}
		w, h = int(min(mbW*16, 1<<30)), int(min(mapH*16, 1<<30))
		dispW, dispH = w, h
		// after cropping; a crop larger than the picture (the reader's
		// unsigned arithmetic then wraps) leaves the coded size
		if sw, sh := sps.Width(), sps.Height(); perr == nil && sw > 0 && sh > 0 && sw <= w && sh <= h {
			dispW, dispH = sw, sh
		}
		return w, h, dispW, dispH, true, nil
	}
	return 0, 0, 0, 0, false, nil
}

var startCode3 = []byte{0, 0, 1}

// switchLocked makes l the decoded layer (at its key frame).
func (s *simulcast) switchLocked(l *layer) {
	if s.active != nil {
		s.active.wanted.Store(false)
		s.switches.Add(1)
		s.st.s.log.Info("whip simulcast layer switch", "app", s.st.app, "stream", s.st.id, "from", s.active.rid, "to", l.rid,
			"size", fmt.Sprintf("%dx%d", l.w, l.h), "down", s.down)
	}
	s.active, s.target = l, nil
	l.wanted.Store(true)
	s.dec.sync, s.dec.ssrc = l.p.sync, l.ssrc
	s.dec.lastPLI = time.Time{}
	l.p.needKey = false
	s.mirrorLocked()
}

// ranked are the layers whose size is known, smallest first.
func (s *simulcast) rankedLocked() []*layer {
	var out []*layer
	for _, l := range s.layers {
		if l.w > 0 {
			out = append(out, l)
		}
	}
	slices.SortStableFunc(out, func(a, b *layer) int { return a.w*a.h - b.w*b.h })
	return out
}

// fitLocked is the index in ranked of the layer that fits the app: the
// smallest covering the stream's limit (MaxWidth x MaxHeight, or its
// token's), else the largest.
func (s *simulcast) fitLocked(ranked []*layer) int {
	mw, mh := s.st.limit()
	for i, l := range ranked {
		if l.w >= mw && l.h >= mh {
			return i
		}
	}
	return len(ranked) - 1
}

// chooseLocked picks the layer to decode and, when it is not the active
// one, makes it the target (PLI: it switches at its next key frame).
func (s *simulcast) chooseLocked(now time.Time) {
	defer s.mirrorLocked()
	ranked := s.rankedLocked()
	if len(ranked) == 0 || s.active == nil {
		return
	}
	fit := s.fitLocked(ranked)
	s.down = min(s.down, fit)
	want := ranked[fit-s.down]
	if want == s.active {
		if s.target != nil {
			s.target.wanted.Store(false)
			s.target = nil
		}
		return
	}
	if want == s.target {
		return
	}
	if s.target != nil {
		s.target.wanted.Store(false)
	}
	s.target = want
	want.wanted.Store(true)
	s.targetPLI = time.Time{}
	s.pliTargetLocked(now)
}

// pliTargetLocked asks the target layer for a key frame, at most every
// 200 ms.
func (s *simulcast) pliTargetLocked(now time.Time) {
	if s.target == nil || s.st.pc == nil || !s.targetPLI.IsZero() && now.Sub(s.targetPLI) < 200*time.Millisecond {
		return
	}
	s.targetPLI = now
	if s.st.pc.WriteRTCP([]rtcp.Packet{&rtcp.PictureLossIndication{MediaSSRC: s.target.ssrc}}) == nil {
		s.st.c.plis.Add(1)
	}
}

// mirrorLocked publishes what admission reads without mu.
func (s *simulcast) mirrorLocked() {
	ranked := s.rankedLocked()
	can := false
	if len(ranked) > 0 && s.active != nil {
		can = s.fitLocked(ranked)-s.down > 0
	}
	s.canDown.Store(can)
	s.stepped.Store(int32(s.down))
}

// step moves the choice one layer down (delta -1) or up (+1); false when
// there is none. The switch itself happens at the new layer's key frame.
func (s *simulcast) step(delta int, why string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ranked := s.rankedLocked()
	if len(ranked) == 0 || s.active == nil {
		return false
	}
	fit := s.fitLocked(ranked)
	switch {
	case delta < 0 && fit-s.down > 0:
		s.down++
	case delta > 0 && s.down > 0:
		s.down--
	default:
		return false
	}
	s.st.s.log.Info("whip simulcast step", "app", s.st.app, "stream", s.st.id, "down", s.down, "why", why)
	s.chooseLocked(s.st.s.clk.Now())
	return true
}

// info fills a StreamInfo's layer fields.
func (s *simulcast) info(i *StreamInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.layers {
		li := LayerInfo{RID: l.rid, Width: l.w, Height: l.h, Active: l == s.active, Target: l == s.target,
			Packets: l.packets.Load(), Frames: l.frames.Load(), KeyFrames: l.keys.Load(), Decoded: l.decoded.Load(), Probes: l.probes.Load()}
		i.Layers = append(i.Layers, li)
		if li.Active {
			i.Layer = fmt.Sprintf("%s %dx%d", l.rid, l.w, l.h)
		}
	}
	i.LayerSwitches, i.LayerDown = s.switches.Load(), s.down
}
