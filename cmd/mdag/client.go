//go:build !lean

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/ingest/whip"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
)

const clientSynopsis = "--app APP [--server URL] [--source pattern|FILE|camera:N | --audio FILE.wav|FILE.opus] [flags]"

func runClient(args []string, stdout, stderr io.Writer) int {
	return execute("client", clientSynopsis, new(clientCmd), args, stdout, stderr)
}

// clientCmd is mdag client's options.
type clientCmd struct {
	server, app, token, source, size string
	codec, audio, out                string
	fps                              float64
	objects, clients, bitrate        int
	replay, audioRate                int
	duration                         time.Duration
	loop, verbose                    bool
	open                             func() (frameSource, error) // --source, opened by validate
}

func (c *clientCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "http://127.0.0.1:8080", "the mdag server (serve or coordinator)")
	fs.StringVar(&c.app, "app", "", "the app to stream into (required)")
	fs.StringVar(&c.token, "token", "", "bearer token (default: $MDAG_TOKEN)")
	fs.StringVar(&c.source, "source", "pattern", "pattern (moving shapes), people (the synthetic people scene: upright people walking in lanes), a video FILE, or camera:N")
	fs.Float64Var(&c.fps, "fps", 15, "frames per second sent (the server samples to the app's fps)")
	fs.StringVar(&c.size, "size", "640x480", "frame size WxH for the pattern (files and cameras keep theirs)")
	fs.IntVar(&c.objects, "objects", 3, "objects per pattern frame")
	fs.IntVar(&c.clients, "clients", 1, "streams to run at once (load tests)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "stop after this long (0: until interrupted or the file ends)")
	fs.BoolVar(&c.loop, "loop", false, "restart a FILE source at its end")
	fs.IntVar(&c.bitrate, "bitrate", 1000, "video target bitrate, kbit/s")
	fs.IntVar(&c.replay, "encode-once", 0, "load tests: encode the source's first N frames once (a key frame every second) and send that clip in a loop on every stream, so encoding does not bound the clients (0: encode each stream's frames)")
	fs.StringVar(&c.codec, "codec", whip.CodecVP8, "video codec to send: vp8 (libvpx) or h264 (x264, constrained baseline)")
	fs.StringVar(&c.audio, "audio", "", "stream this audio FILE as an Opus track instead of video (for apps with media: audio): "+
		"a WAV of 16-bit PCM, mono or stereo, any rate (resampled to 48 kHz, encoded at --audio-bitrate), or an Ogg Opus file (.opus, .ogg: its packets sent as they are); --loop repeats it")
	fs.IntVar(&c.audioRate, "audio-bitrate", 32, "Opus bitrate for a WAV, kbit/s per channel")
	fs.BoolVar(&c.verbose, "v", false, "print every result")
	fs.StringVar(&c.out, "o", "table", "summary: table or json")
}

func (c *clientCmd) validate(*flag.FlagSet) []error {
	if c.token == "" {
		c.token = os.Getenv("MDAG_TOKEN")
	}
	var errs []error
	if c.app == "" {
		errs = append(errs, errors.New("--app is required"))
	}
	if c.fps <= 0 || c.fps > 120 {
		errs = append(errs, fmt.Errorf("--fps %g: want 0 < fps <= 120", c.fps))
	}
	if c.clients < 1 {
		errs = append(errs, fmt.Errorf("--clients %d: want >= 1", c.clients))
	}
	if c.out != "table" && c.out != "json" {
		errs = append(errs, fmt.Errorf("-o %q: want table or json", c.out))
	}
	if !slices.Contains(clientCodecs, c.codec) {
		errs = append(errs, fmt.Errorf("--codec %q: want %s", c.codec, strings.Join(clientCodecs, " or ")))
	}
	if c.replay < 0 {
		errs = append(errs, fmt.Errorf("--encode-once %d: want >= 0", c.replay))
	}
	if c.audio != "" && (c.audioRate < 6 || c.audioRate > 255) {
		errs = append(errs, fmt.Errorf("--audio-bitrate %d: want 6..255 kbit/s per channel", c.audioRate))
	}
	if c.audio == "" {
		var err error
		if c.open, err = sourceOpener(c.source, c.size, c.objects, c.loop); err != nil {
			errs = append(errs, fmt.Errorf("--source: %w", err))
		}
	}
	return errs
}

func (c *clientCmd) run(env *cmdEnv) error {
	build := c.video
	if c.audio != "" {
		build = c.audioStream
	}
	one, err := build()
	if err != nil {
		return err
	}
	ctx, cancel := runContext(c.duration)
	defer cancel()
	sums := c.runAll(ctx, env.stdout, one)
	return clientReport(sums, c.out, env.stdout)
}

// streamFunc runs client i's stream until ctx ends (or its source does),
// handing each result to each, and returns what it saw.
type streamFunc func(ctx context.Context, i int, each func(whip.Result)) clientSummary

// video prepares the video streams: --source, and with --encode-once the
// clip every stream sends.
func (c *clientCmd) video() (streamFunc, error) {
	o := clientOpts{server: c.server, app: c.app, token: c.token, fps: c.fps, bitrate: c.bitrate, codec: c.codec}
	if c.replay > 0 {
		var err error
		if o.clip, err = encodeOnce(c.open, c.replay, whip.ClientConfig{Codec: c.codec, FPS: int(c.fps + 0.5), BitrateKbps: c.bitrate}); err != nil {
			return nil, invalidf("--encode-once: %v", err)
		}
	}
	return func(ctx context.Context, i int, each func(whip.Result)) clientSummary {
		return runOneClient(ctx, i, c.open, o, each)
	}, nil
}

// runAll runs --clients streams at once and returns their summaries;
// with -v it prints every result as it comes.
func (c *clientCmd) runAll(ctx context.Context, stdout io.Writer, one streamFunc) []clientSummary {
	sums := make([]clientSummary, c.clients)
	var printMu sync.Mutex
	each := func(r whip.Result) {
		if c.verbose {
			printMu.Lock()
			writeJSON(stdout, r, false)
			printMu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for i := range c.clients {
		wg.Go(func() { sums[i] = one(ctx, i, each) })
	}
	wg.Wait()
	return sums
}

// clientCodecs are the video codecs mdag client encodes (--codec).
var clientCodecs = []string{whip.CodecVP8, whip.CodecH264}

// exitEnded: a stream was ended by the server (DELETE by someone else, its
// idle timeout, shutdown, a refusal mid-stream) or the connection to it was
// lost, before the client was done.
const exitEnded = 4

type clientOpts struct {
	server, app, token string
	fps                float64
	bitrate            int
	codec              string
	clip               *encodedClip // non-nil: send this clip (--encode-once)
	maxWidth           int          // frames wider are scaled down (aspect kept) before encoding; 0: as they come
	clk                clock.Clock  // the results' arrival times and finishClient's waits (nil: the wall clock)
}

func (o clientOpts) clock() clock.Clock {
	if o.clk == nil {
		return clock.Real{}
	}
	return o.clk
}

// listsStreams says whether the client may read the server's stream list
// (GET /v1/streams) for its Ingested count: only without a token. A
// token may be an ingest token of a --tokens file, which may not list
// streams (every try would be a 401, counted and logged by the server as
// a refused request); with one the client counts from its own stream's
// results instead: each carries its frame's number as handed to the
// session, so the highest is the frames ingested up to it.
func (o clientOpts) listsStreams() bool { return o.token == "" }

// clientSummary is what one stream saw.
type clientSummary struct {
	Stream     string  `json:"stream,omitempty"`
	Sent       uint64  `json:"frames_sent"`
	Ingested   uint64  `json:"frames_ingested"` // by the server (sampled to the app's fps)
	Results    int     `json:"results"`
	Finished   int     `json:"finished"`
	Late       int     `json:"late"`
	Dropped    int     `json:"dropped"`
	FinishRate float64 `json:"finish_rate"` // finished / results
	P50MS      float64 `json:"p50_ms"`
	P99MS      float64 `json:"p99_ms"`
	Errors     int     `json:"errors"`
	Error      string  `json:"error,omitempty"`
	Ended      string  `json:"ended,omitempty"` // why the server's side ended the stream early
	err        error   // the error behind Error (a *whip.HTTPError for a refusal)
	latencies  []float64
	// top is the highest frame number of the results received (the
	// frames the server handed to the session up to that one); firstAt
	// and lastAt when the first and the last result came.
	top             uint64
	firstAt, lastAt time.Time
}

func runOneClient(ctx context.Context, idx int, open func() (frameSource, error), o clientOpts, each func(whip.Result)) clientSummary {
	var sum clientSummary
	fail := func(err error) clientSummary {
		sum.Errors++
		sum.Error, sum.err = err.Error(), err
		return sum
	}
	src, err := open()
	if err != nil {
		return fail(err)
	}
	defer src.Close()
	first, err := src.Next(idx, 0)
	if err != nil {
		return fail(fmt.Errorf("first frame: %w", err))
	}
	if o.clip != nil {
		first = media.NewFrame(o.clip.w, o.clip.h) // the size the clip was encoded at
	}
	if o.maxWidth > 0 && first.W > o.maxWidth {
		if first, err = cv.Resize(first, o.maxWidth, max(2, first.H*o.maxWidth/first.W)&^1, gocv.InterpolationArea); err != nil {
			return fail(err)
		}
	}
	var mu sync.Mutex
	onResult := countResult(&sum, &mu, o.clock(), each)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	p, err := whip.Publish(cctx, whip.ClientConfig{Server: o.server, App: o.app, Token: o.token, Width: first.W, Height: first.H,
		FPS: int(o.fps + 0.5), BitrateKbps: o.bitrate, Codec: o.codec, OnResult: onResult})
	cancel()
	if err != nil {
		return fail(err)
	}
	sum.Stream = p.Stream
	period := time.Duration(float64(time.Second) / o.fps)
	start := time.Now()
	f := first
	for seq := uint64(0); ; seq++ {
		at := start.Add(time.Duration(seq) * period)
		select {
		case <-ctx.Done():
		case <-p.Done():
		case <-time.After(time.Until(at)):
		}
		if ctx.Err() != nil || p.Err() != nil {
			break
		}
		if o.clip != nil {
			if err := p.WriteEncoded(o.clip.frames[seq%uint64(len(o.clip.frames))], time.Now()); err != nil {
				if p.Err() == nil {
					sum.Errors++
					sum.Error = err.Error()
				}
				break
			}
			continue
		}
		if seq > 0 {
			if f, err = src.Next(idx, seq); err != nil {
				if !errors.Is(err, io.EOF) {
					sum.Errors++
					sum.Error = err.Error()
				}
				break
			}
		}
		if f.W != first.W || f.H != first.H {
			if f, err = cv.Resize(f, first.W, first.H, gocv.InterpolationLinear); err != nil {
				sum.Errors++
				sum.Error = err.Error()
				break
			}
		}
		if err := p.WriteFrame(f, time.Now()); err != nil {
			if p.Err() == nil {
				sum.Errors++
				sum.Error = err.Error()
			}
			break
		}
	}
	// Results of the last frames are still on their way: finishClient
	// waits for the server to answer for everything it ingested.
	return finishClient(p, o, &sum, &mu)
}

// encodedClip is a clip encoded once for every stream (--encode-once).
type encodedClip struct {
	w, h   int
	frames [][]byte
}

// encodeOnce encodes the source's first n frames (n rounded up to whole
// seconds, so the loop restarts at a key frame) with a key frame every
// second.
func encodeOnce(open func() (frameSource, error), n int, cfg whip.ClientConfig) (*encodedClip, error) {
	src, err := open()
	if err != nil {
		return nil, err
	}
	defer src.Close()
	key := max(1, cfg.FPS)
	n = (n + key - 1) / key * key
	var frames []*media.Frame
	for i := range n {
		f, err := src.Next(0, uint64(i))
		if err != nil {
			return nil, fmt.Errorf("frame %d: %w", i, err)
		}
		if len(frames) > 0 && (f.W != frames[0].W || f.H != frames[0].H) {
			return nil, fmt.Errorf("frame %d is %dx%d, the first %dx%d", i, f.W, f.H, frames[0].W, frames[0].H)
		}
		frames = append(frames, f)
	}
	cfg.Width, cfg.Height = frames[0].W, frames[0].H
	enc, err := whip.EncodeClip(cfg, frames, key)
	if err != nil {
		return nil, err
	}
	return &encodedClip{w: cfg.Width, h: cfg.Height, frames: enc}, nil
}

func (s *clientSummary) summarise() {
	if s.Results > 0 {
		s.FinishRate = float64(s.Finished) / float64(s.Results)
	}
	if n := len(s.latencies); n > 0 {
		slices.Sort(s.latencies)
		s.P50MS = s.latencies[n/2]
		s.P99MS = s.latencies[min(n-1, n*99/100)]
	}
}

// serverIngested asks the server how many frames of the stream it handed
// to the session (0 when it cannot tell), from its stream list: only for
// a client without a token (clientOpts.listsStreams).
func serverIngested(o clientOpts, id string) uint64 {
	req, err := http.NewRequest(http.MethodGet, strings.TrimRight(o.server, "/")+"/v1/streams", nil)
	if err != nil {
		return 0
	}
	if o.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var list []whip.StreamInfo
	if json.NewDecoder(resp.Body).Decode(&list) != nil {
		return 0
	}
	for _, s := range list {
		if s.ID == id {
			return s.Ingested
		}
	}
	return 0
}

func sumClients(sums []clientSummary) clientSummary {
	var t clientSummary
	for _, s := range sums {
		t.Sent += s.Sent
		t.Ingested += s.Ingested
		t.Results += s.Results
		t.Finished += s.Finished
		t.Late += s.Late
		t.Dropped += s.Dropped
		t.Errors += s.Errors
		t.latencies = append(t.latencies, s.latencies...)
	}
	t.summarise()
	return t
}

func writeClientTable(w io.Writer, sums []clientSummary, total clientSummary) {
	fmt.Fprintf(w, "%-18s %7s %8s %7s %8s %5s %7s %8s %8s %8s\n", "STREAM", "SENT", "INGESTED", "RESULTS", "FINISHED", "LATE", "DROPPED", "FINISH%", "P50 MS", "P99 MS")
	row := func(name string, s clientSummary) {
		fmt.Fprintf(w, "%-18s %7d %8d %7d %8d %5d %7d %7.2f%% %8.1f %8.1f\n", name, s.Sent, s.Ingested, s.Results, s.Finished, s.Late, s.Dropped, 100*s.FinishRate, s.P50MS, s.P99MS)
	}
	for i, s := range sums {
		name := s.Stream
		if name == "" {
			name = "client-" + strconv.Itoa(i)
		}
		row(name, s)
		if s.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", s.Error)
		}
		if s.Ended != "" {
			fmt.Fprintf(w, "  ended by the server: %s\n", s.Ended)
		}
	}
	if len(sums) > 1 {
		row("total", total)
	}
}
