package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/ingest/synth"
	"github.com/mdag/mdag/internal/pki"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// `mdag source` streams into a coordinator's app over gRPC: synthetic
// cameras (frames, or audio with --audio), or RTSP cameras it reads and
// decodes on its own machine.

const sourceSynopsis = "--app NAME [flags]"

func runSource(args []string, stdout, stderr io.Writer) int {
	return execute("source", sourceSynopsis, new(sourceCmd), args, stdout, stderr)
}

// sourceCmd is mdag source's options.
type sourceCmd struct {
	coord, app, prefix string
	size, scene        string
	streams, objects   int
	fps                float64
	count              uint64
	audio              bool
	ingest             string // route or coordinator
	duration           time.Duration
	cameras            *cameraFlags
	tls                *tlsFlags
	pattern            *synth.Pattern // the synthetic frames, by validate
}

func (c *sourceCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.coord, "coordinator", "127.0.0.1:7070", "the coordinator's gRPC address: HOST:PORT, or unix:/PATH (the coordinator's Unix socket: it is talked to only when the coordinator runs as this uid or root)")
	fs.StringVar(&c.app, "app", "", "the deployed app to stream into (required)")
	fs.IntVar(&c.streams, "streams", 1, "synthetic cameras to run")
	fs.StringVar(&c.prefix, "prefix", "synthetic", "stream IDs are PREFIX-0, PREFIX-1, ... (with TLS: NAME/synthetic by default, NAME the certificate's: "+
		"a source certificate joins only streams NAME or NAME/...)")
	fs.Float64Var(&c.fps, "fps", 10, "frames per second per camera (synthetic; with --camera: the rate frames are sampled at)")
	fs.IntVar(&c.objects, "objects", 3, "objects per frame")
	fs.StringVar(&c.size, "size", "320x240", "frame size WxH")
	fs.StringVar(&c.scene, "scene", "shapes", sceneHelp)
	fs.Uint64Var(&c.count, "count", 0, "frames per camera (0: until --duration or interrupted)")
	fs.BoolVar(&c.audio, "audio", false, "send synthetic audio (chirps with silence between them, 48 kHz mono, chunks of 1/fps) instead of frames: for an app with media: audio")
	fs.StringVar(&c.ingest, "ingest", "route", "where the frames go: \"route\" asks the coordinator and sends them to the ingest worker it names (mdag worker --ingest-listen; "+
		"the coordinator then gets each frame's identity, never its pixels), or to the coordinator when it names none; \"coordinator\": always to the coordinator")
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long (0: run until interrupted or --count)")
	c.cameras = addCameraFlags(fs)
	c.tls = addTLSFlags(fs, true)
}

func (c *sourceCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.app == "" {
		errs = append(errs, errors.New("--app is required"))
	}
	if c.streams < 1 {
		errs = append(errs, fmt.Errorf("--streams %d: want >= 1", c.streams))
	}
	if c.fps <= 0 {
		errs = append(errs, fmt.Errorf("--fps %g: want > 0", c.fps))
	}
	var err error
	if c.pattern, err = newPattern(c.size, c.objects, c.scene); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.tls.mode("--coordinator", c.coord); err != nil {
		errs = append(errs, err)
	}
	if c.ingest != "route" && c.ingest != "coordinator" {
		errs = append(errs, fmt.Errorf("--ingest %q: want route or coordinator", c.ingest))
	}
	return errs
}

// reconnect is how each synthetic camera reconnects, and routes unless
// --ingest coordinator: to an ingest worker with the source's certificate
// (mat), or in plaintext.
func (c *sourceCmd) reconnect(mat *pki.Material, log *slog.Logger) source.Reconnect {
	rc := source.Reconnect{Log: log}
	switch {
	case c.ingest == "coordinator":
	case mat != nil:
		rc.DialIngest = func(addr string) (*grpc.ClientConn, error) { return client.DialIngestTLS(addr, mat) }
	default:
		rc.DialIngest = client.Dial
	}
	return rc
}

func (c *sourceCmd) run(env *cmdEnv) error {
	log := newLogger(env.stderr, false)
	cc, mat, err := c.tls.dial(pki.Source, c.coord, log)
	if err != nil {
		return invalid(err)
	}
	defer cc.Close()
	camPrefix := c.namePrefix(env.fs, mat)
	ctx, cancel := runContext(c.duration)
	defer cancel()
	rc := c.reconnect(mat, log)
	if ran, err := c.cameras.runSource(ctx, c.app, c.fps, cc, rc.DialIngest, camPrefix, env.stdout, env.stderr); ran {
		return err // RTSP cameras instead of synthetic streams
	}
	return c.stream(ctx, env.stdout, cc, rc)
}

// namePrefix is what a source certificate's streams are named under: with
// TLS a source certificate joins only streams NAME or NAME/..., so its
// cameras are sent as NAME/CAMERA and its synthetic streams as
// NAME/synthetic-N unless --prefix says otherwise. It is "" in plaintext.
func (c *sourceCmd) namePrefix(fs *flag.FlagSet, mat *pki.Material) string {
	if mat == nil {
		return ""
	}
	_, name, err := pki.RoleOf(mat.Certificate())
	if err != nil {
		return ""
	}
	if !flagGiven(fs, "prefix") {
		c.prefix = name + "/" + c.prefix
	}
	return name + "/"
}

// stream runs the synthetic cameras until ctx ends or --count, and writes
// a line for each; it returns what failed.
func (c *sourceCmd) stream(ctx context.Context, stdout io.Writer, cc *grpc.ClientConn, rc source.Reconnect) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range c.streams {
		wg.Go(func() {
			id := fmt.Sprintf("%s-%d", c.prefix, i)
			// rejoins under the same ID when the stream breaks (a
			// coordinator restart), numbering on
			var r *source.StreamResult
			var err error
			if c.audio {
				r, err = source.StreamAudioReconnecting(ctx, cc, c.app, id, synth.NewTone(), i, c.fps, c.count, rc)
			} else {
				r, err = source.StreamReconnecting(ctx, cc, c.app, id, c.pattern, i, c.fps, c.count, rc)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, c.tls.explain(err))
				return
			}
			fmt.Fprintf(stdout, "stream %s: %d frames accepted, %d rejected (produced %d, unconfirmed %d, skipped %d, connections %d)",
				id, r.Accepted, r.Rejected, r.Generated, r.Unconfirmed, r.Skipped, r.Connections)
			if r.LastError != "" {
				fmt.Fprintf(stdout, " (last: %s)", r.LastError)
			}
			fmt.Fprintln(stdout)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
