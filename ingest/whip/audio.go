package whip

import (
	"fmt"
	"time"

	"github.com/pion/rtp"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/ingest/opus"
	"github.com/mdag/mdag/media"
)

// The audio path (apps with `media: audio`): RTP packets of the stream's
// Opus track (RFC 7587) -> ingest/opus (loss concealment for gaps in the
// sequence numbers, late packets dropped) -> PCM at 48 kHz cut into chunks
// of 1/fps of the app (20 ms when it has no fps) -> AudioSink.IngestAudio
// with the capture time of each chunk's first sample, taken from the RTP
// timestamps and the sender's RTCP sender reports as for video. The
// stream is admitted when its first chunk is complete; every chunk is
// ingested or refused (counted, 10 refusals in a row end the stream) as
// video frames are. Its counters: packets received, frames (Opus packets
// decoded), lost (packets missing in the sequence), concealed (frames made
// up for them), discarded (late packets), padding (empty packets),
// decode errors, ingested and refused chunks, and the audio of an
// unfinished chunk left when the stream ended (partial_ms).

// onAudioTrack takes the first Opus track of an audio app's stream; any
// other track (video, a second audio track) is read and discarded.
func (st *stream) onAudioTrack(track *webrtc.TrackRemote, recv *webrtc.RTPReceiver, codec string) {
	if !st.claimMedia(track, track.Kind() == webrtc.RTPCodecTypeAudio && codec == CodecOpus, codec) {
		return
	}
	st.s.wg.Add(2)
	sync := &captureClock{rate: opusClockRate}
	go st.readSenderReports(recv, sync)
	go func() {
		defer st.s.wg.Done()
		st.readAudio(track, sync)
	}()
}

// audioChannels is the channel count a track's Opus is decoded to: stereo
// when the offer's fmtp says the sender is likely to send stereo
// (sprop-stereo=1, RFC 7587 7.1; "stereo" is what the offerer would
// rather receive), else mono.
func audioChannels(fmtp string) int {
	if fmtpParams(fmtp)["sprop-stereo"] == "1" {
		return 2
	}
	return 1
}

func (st *stream) readAudio(track *webrtc.TrackRemote, sync *captureClock) {
	// The offer's fmtp (pion's track reports the server's registered one).
	dec, err := opus.NewDecoder(audioChannels(st.audioFmtp))
	if err != nil {
		st.fail(err)
		st.endAs(EndError, "decoder: "+err.Error())
		return
	}
	defer dec.Close()
	a := newAudioPipeline(st, dec, sync)
	readRTP(track, a.packet)
	a.end()
}

// end counts what was left of an unfinished chunk when the stream ended:
// said (partial_ms), not lost silently.
func (a *audioPipeline) end() {
	a.st.c.partialSamples.Add(uint64(len(a.acc) / a.dec.Channels()))
	a.acc = a.acc[:0]
}

// opusRate is Opus's sample rate, as a float for the stats.
const opusRate = float64(opus.SampleRate)

// chunkSamples is the samples per channel of an audio chunk at fps chunks
// a second: 1/fps of audio, 20 ms for fps 0, between 2.5 ms and 10 s.
func chunkSamples(fps float64) int {
	if fps <= 0 {
		return opus.SampleRate / 50
	}
	n := int(float64(opus.SampleRate)/fps + 0.5)
	return min(max(n, opus.SampleRate/400), 10*opus.SampleRate)
}

// audioPipeline is an audio stream's RTP -> Opus -> chunk -> session path;
// one goroutine drives it.
type audioPipeline struct {
	st    *stream
	dec   *opus.Decoder
	sync  *captureClock
	sink  AudioSink
	chunk int // samples per channel of a chunk

	acc   []int16   // the chunk being filled
	accAt time.Time // the capture time of its first sample

	seq        uint64
	joined     bool
	refusedRun int
	counted    opus.Stats // the decoder's counts already added to the stream's
}

func newAudioPipeline(st *stream, dec *opus.Decoder, sync *captureClock) *audioPipeline {
	a := &audioPipeline{st: st, dec: dec, sync: sync, chunk: chunkSamples(st.fps)}
	a.sink, _ = st.s.sink.(AudioSink) // New checked it for audio apps
	a.acc = make([]int16, 0, a.chunk*dec.Channels())
	return a
}

// packet handles one RTP packet; false ends the stream's reading.
func (a *audioPipeline) packet(pkt *rtp.Packet) bool {
	st := a.st
	now := st.s.clk.Now()
	st.c.packets.Add(1)
	st.mu.Lock()
	st.lastMedia = now
	ended := st.ended != ""
	st.mu.Unlock()
	if ended {
		return false
	}
	if len(pkt.Payload) == 0 {
		// padding only (its own sequence number, RFC 3550): nothing to
		// decode, not a loss
		a.dec.Skip(pkt.SequenceNumber)
		st.c.padding.Add(1)
		return true
	}
	work := time.Now() // decoding is real CPU time, whatever the injected clock says
	before := a.dec.Stats()
	chunks, err := a.dec.DecodeRTP(pkt.SequenceNumber, pkt.Payload)
	a.account()
	st.c.busy.Add(int64(time.Since(work)))
	after := a.dec.Stats()
	if after.Late > before.Late {
		return true // late or a duplicate: dropped, and its timestamp must not move the clock
	}
	if after.Restarts > before.Restarts {
		a.sync.restart(now) // a new sequence: its timestamps start a new timeline, as for video
	}
	capture := a.sync.capture(pkt.Timestamp, now)
	if err != nil {
		st.c.decodeErrors.Add(1)
		st.fail(fmt.Errorf("packet %d: %w", pkt.SequenceNumber, err))
	}
	// The packet's own chunk (decoded, or concealed in its place when it
	// did not decode) is the last and starts at its capture time;
	// concealed ones for lost packets come before it, back to back.
	end := capture
	if len(chunks) > 0 {
		end = capture.Add(chunks[len(chunks)-1].Duration())
	}
	for i, c := range chunks {
		var after time.Duration
		for _, later := range chunks[i:] {
			after += later.Duration()
		}
		if !a.add(c, end.Add(-after)) {
			return false
		}
	}
	return true
}

// account adds the decoder's new counts to the stream's.
func (a *audioPipeline) account() {
	s, c := a.dec.Stats(), &a.st.c
	c.frames.Add(s.Packets - a.counted.Packets)
	c.lost.Add(s.Lost - a.counted.Lost)
	c.concealed.Add(s.Concealed - a.counted.Concealed)
	c.discarded.Add(s.Late - a.counted.Late)
	c.restarts.Add(s.Restarts - a.counted.Restarts)
	a.counted = s
}

// add appends decoded PCM starting at capture to the chunks; each chunk
// complete goes to the session. False ends the stream's reading.
func (a *audioPipeline) add(c *media.Audio, capture time.Time) bool {
	ch := c.Channels
	full := a.chunk * ch
	for off := 0; off < len(c.PCM); {
		if len(a.acc) == 0 {
			a.accAt = capture.Add(time.Duration(off/ch) * time.Second / opus.SampleRate)
		}
		n := min(len(c.PCM)-off, full-len(a.acc))
		a.acc = append(a.acc, c.PCM[off:off+n]...)
		off += n
		if len(a.acc) == full {
			au := &media.Audio{Rate: opus.SampleRate, Channels: ch, PCM: a.acc}
			a.acc = make([]int16, 0, full)
			if !a.emit(au, a.accAt) {
				return false
			}
		}
	}
	return true
}

// emit hands one chunk to the session: the first admits the stream.
func (a *audioPipeline) emit(au *media.Audio, capture time.Time) bool {
	st := a.st
	if !a.joined {
		if kind, why := st.admitFirst(); kind != "" {
			go st.endAs(kind, why)
			return false
		}
		a.joined = true
	}
	a.seq++
	return st.handed(a.sink.IngestAudio(st.id, a.seq, capture, au), &a.refusedRun, "audio chunks")
}
