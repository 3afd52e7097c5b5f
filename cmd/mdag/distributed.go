package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mdag/mdag/ingest/synth"
)

// What the distributed mode's commands share: mdag coordinator
// (coordinator.go), mdag worker (worker.go) and mdag source (source.go),
// besides their gRPC security (tls.go).

// runContext ends on SIGINT/SIGTERM or after d (0: never).
func runContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if d <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); stop() }
}

// sceneHelp is the --scene flag's help.
const sceneHelp = "synthetic scene: shapes (cars, people, trucks and buses circling; their paths cross) or people (people only, drawn upright, walking back and forth in their own lanes: stable tracks for track, window and activity)"

// newPattern is the synthetic source of --size WxH, --objects and --scene.
func newPattern(size string, objects int, scene string) (*synth.Pattern, error) {
	w, h, err := parseSize(size)
	if err != nil {
		return nil, fmt.Errorf("--size: %w", err)
	}
	p, err := synth.NewPattern(w, h, objects)
	if err != nil {
		return nil, err
	}
	switch scene {
	case "shapes":
	case "people":
		p.Classes, p.Motion, p.Upright = []string{"person"}, synth.Lanes, true
	default:
		return nil, fmt.Errorf("--scene %q: want shapes or people", scene)
	}
	return p, nil
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// teardown is what a long-running command's build started, stopped in the
// reverse order when its run returns, however far the build got.
type teardown []func()

// add stops f last of what is there now.
func (t *teardown) add(f func()) { *t = append(*t, f) }

// run stops everything added, the last added first.
func (t *teardown) run() {
	for i := len(*t) - 1; i >= 0; i-- {
		(*t)[i]()
	}
	*t = nil
}
