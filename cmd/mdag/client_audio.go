//go:build !lean

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/mdag/mdag/ingest/audiofile"
	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/clock"
)

// audioClip is what `mdag client --audio` sends: 48 kHz PCM to encode (a
// WAV) or Opus packets as they are (an Ogg Opus file).
type audioClip struct {
	channels int
	pcm      []int16  // WAV: interleaved, 48 kHz
	packets  [][]byte // Ogg Opus
	samples  []int    // each packet's samples per channel
}

// frames is the clip's packets to send: 20 ms of PCM each (a WAV; the
// last one padded with silence) or the file's packets.
func (c *audioClip) frames() int {
	if c.packets != nil {
		return len(c.packets)
	}
	per := 960 * c.channels
	return (len(c.pcm) + per - 1) / per
}

// loadAudio reads a WAV or an Ogg Opus file by its first bytes.
func loadAudio(path string) (*audioClip, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	switch string(magic[:]) {
	case "RIFF":
		a, err := audiofile.ReadWAV(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if a, err = audiofile.Resample(a, 48000); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &audioClip{channels: a.Channels, pcm: a.PCM}, nil
	case "OggS":
		o, err := audiofile.ReadOggOpus(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		c := &audioClip{channels: o.Channels, packets: o.Packets}
		for _, p := range o.Packets {
			n, _ := audiofile.PacketSamples(p) // checked by ReadOggOpus
			c.samples = append(c.samples, n)
		}
		return c, nil
	}
	return nil, fmt.Errorf("%s: neither a WAV (RIFF) nor an Ogg Opus (OggS) file", path)
}

// audioStream prepares `mdag client --audio FILE`: each stream sends the
// file, paced in real time, with the video client's summary (sent: Opus
// packets; ingested: the chunks the server handed to the session).
func (c *clientCmd) audioStream() (streamFunc, error) {
	clip, err := loadAudio(c.audio)
	if err != nil {
		return nil, invalidf("--audio: %v", err)
	}
	o := clientOpts{server: c.server, app: c.app, token: c.token}
	return func(ctx context.Context, _ int, each func(whip.Result)) clientSummary {
		return runOneAudioClient(ctx, clip, c.audioRate*1000*clip.channels, c.loop, o, each)
	}, nil
}

func runOneAudioClient(ctx context.Context, clip *audioClip, bitrate int, loop bool, o clientOpts, each func(whip.Result)) clientSummary {
	var sum clientSummary
	var mu sync.Mutex
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	p, err := whip.Publish(cctx, whip.ClientConfig{Server: o.server, App: o.app, Token: o.token, Audio: true,
		AudioChannels: clip.channels, AudioBitrate: bitrate, OnResult: countResult(&sum, &mu, o.clock(), each)})
	cancel()
	if err != nil {
		sum.Errors++
		sum.Error, sum.err = err.Error(), err
		return sum
	}
	sum.Stream = p.Stream
	start := time.Now()
	var sent time.Duration // audio sent so far: the next packet's time
	per := 960 * clip.channels
	n := clip.frames()
	for i := 0; ; i++ {
		if i == n {
			if !loop {
				break
			}
			i = 0
		}
		select {
		case <-ctx.Done():
		case <-p.Done():
		case <-time.After(time.Until(start.Add(sent))):
		}
		if ctx.Err() != nil || p.Err() != nil {
			break
		}
		if clip.packets != nil {
			err = p.WriteOpus(clip.packets[i], clip.samples[i])
			sent += time.Duration(clip.samples[i]) * time.Second / 48000
		} else {
			frame := clip.pcm[i*per : min(len(clip.pcm), (i+1)*per)]
			if len(frame) < per {
				frame = append(frame[:len(frame):len(frame)], make([]int16, per-len(frame))...)
			}
			err = p.WriteAudio(frame, start.Add(sent))
			sent += 20 * time.Millisecond
		}
		if err != nil {
			if p.Err() == nil {
				sum.Errors++
				sum.Error = err.Error()
			}
			break
		}
	}
	return finishClient(p, o, &sum, &mu)
}

// clientReport prints the clients' summary (table or JSON); the error
// ends the command: exit 1 when no stream sent anything (the table says
// why), exitEnded naming the streams the server ended.
func clientReport(sums []clientSummary, out string, stdout io.Writer) error {
	total := sumClients(sums)
	if out == "json" {
		writeJSON(stdout, map[string]any{"clients": sums, "total": total}, true)
	} else {
		writeClientTable(stdout, sums, total)
	}
	var ended []error
	for _, s := range sums {
		if s.Ended != "" {
			ended = append(ended, fmt.Errorf("stream %s: %s", s.Stream, s.Ended))
		}
	}
	switch {
	case total.Errors > 0 && total.Sent == 0:
		return exitWith(exitFailure, errors.Join(ended...))
	case len(ended) > 0:
		return exitWith(exitEnded, errors.Join(ended...))
	}
	return nil
}

// countResult counts each result into sum (under mu), notes its frame
// number and when it came (on clk), and hands it on.
func countResult(sum *clientSummary, mu *sync.Mutex, clk clock.Clock, each func(whip.Result)) func(whip.Result) {
	return func(r whip.Result) {
		now := clk.Now()
		mu.Lock()
		if sum.Results == 0 {
			sum.firstAt = now
		}
		sum.lastAt = now
		sum.top = max(sum.top, r.Frame)
		sum.Results++
		switch r.Outcome {
		case "finished":
			sum.Finished++
		case "late":
			sum.Late++
		default:
			sum.Dropped++
		}
		if r.Outcome != "dropped" {
			sum.latencies = append(sum.latencies, r.LatencyMS)
		}
		mu.Unlock()
		each(r)
	}
}

// finishClient notes why the stream ended (if the server ended it), waits
// (at most finishWait) for the results of what the server ingested (those
// of the last frames are still on their way), closes the publisher and
// completes the summary.
//
// Without a token the server's stream list says how many frames it
// ingested (as before); with one the client's own results do
// (clientOpts.listsStreams): no request its token may not make.
func finishClient(p *whip.Publisher, o clientOpts, sum *clientSummary, mu *sync.Mutex) clientSummary {
	var ended *whip.EndedError
	if errors.As(p.Err(), &ended) {
		sum.Errors++
		sum.Error, sum.Ended = ended.Error(), ended.Reason
	}
	clk := o.clock()
	if ended == nil {
		if o.listsStreams() {
			waitListed(clk, func() uint64 { return serverIngested(o, p.Stream) }, sum, mu)
		} else {
			waitOwn(clk, sum, mu)
		}
	}
	sum.Sent = p.Sent()
	_ = p.Close()
	if o.listsStreams() {
		sum.Ingested = serverIngested(o, p.Stream)
	}
	mu.Lock()
	defer mu.Unlock()
	if !o.listsStreams() {
		sum.Ingested = sum.top
	}
	sum.summarise()
	return *sum
}

// finishWait bounds finishClient's wait for the last results; finishPoll
// is how often it looks.
const (
	finishWait = 2 * time.Second
	finishPoll = 50 * time.Millisecond
)

// waitListed waits until the server's count of ingested frames (ingested,
// from its stream list) is settled and every one answered: the count the
// same as one poll ago (the last frames sent may still be on their way to
// the session when the answers for the others are all in).
func waitListed(clk clock.Clock, ingested func() uint64, sum *clientSummary, mu *sync.Mutex) {
	deadline := clk.Now().Add(finishWait)
	last := uint64(0)
	for clk.Now().Before(deadline) {
		in := ingested()
		mu.Lock()
		done := in > 0 && uint64(sum.Results) >= in && in == last
		mu.Unlock()
		if done {
			return
		}
		last = in
		<-clk.After(finishPoll) // polling a remote server
	}
}

// waitOwn waits until the stream's own results are settled (sum.settled).
func waitOwn(clk clock.Clock, sum *clientSummary, mu *sync.Mutex) {
	deadline := clk.Now().Add(finishWait)
	for {
		now := clk.Now()
		mu.Lock()
		done := sum.settled(now)
		mu.Unlock()
		if done || !now.Before(deadline) {
			return
		}
		<-clk.After(finishPoll)
	}
}

// Bounds of the quiet after the last result that says a stream's results
// are all in (settled).
const (
	minResultQuiet = 250 * time.Millisecond
	maxResultQuiet = time.Second
)

// settled says whether the results received by now are all the stream
// will get: every frame up to the highest numbered one answered, and no
// result for three times the mean gap between them (within
// minResultQuiet..maxResultQuiet): while the session still works on the
// last frames sent, their results keep coming at the app's rate.
func (s *clientSummary) settled(now time.Time) bool {
	if s.Results == 0 || uint64(s.Results) < s.top {
		return false
	}
	quiet := minResultQuiet
	if s.Results > 1 {
		gap := s.lastAt.Sub(s.firstAt) / time.Duration(s.Results-1)
		quiet = min(maxResultQuiet, max(minResultQuiet, 3*gap))
	}
	return now.Sub(s.lastAt) >= quiet
}
