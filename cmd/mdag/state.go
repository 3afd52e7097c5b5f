package main

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/coordinator/store"
)

const stateHelp = "directory of the coordinator's state (`DIR`/" + store.FileName + ", bbolt): apps' sessions and their counters, " +
	"streams, workers, learned factors and re-plan counts survive a restart (even kill -9); empty: in memory only, a restart loses every session"

func addStateFlag(fs *flag.FlagSet) *string { return fs.String("state", "", stateHelp) }

// openState opens the state store in dir and puts it in cfg; it returns
// what closes it (after the engine). With no dir there is none (call
// warnNoState once the engine runs).
func openState(dir string, cfg *coordinator.Config, log *slog.Logger) (func(), error) {
	if dir == "" {
		return func() {}, nil
	}
	b, err := store.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("--state: %w", err)
	}
	// read it now: a state that cannot be restored stops the start here
	// (exit 1), with the path and how to move it aside
	if _, err := b.Load(); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("--state: %w", err)
	}
	cfg.Store = b
	log.Info("coordinator state", "path", b.Path(), "save_every", "200ms")
	return func() { _ = b.Close() }, nil
}

// warnNoState says loudly, once the coordinator runs, that without
// --state a restart loses everything.
func warnNoState(dir string, log *slog.Logger) {
	if dir == "" {
		log.Warn("no --state: the coordinator's state is in memory only; a restart loses every session and its counters")
	}
}
