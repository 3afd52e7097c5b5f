//go:build lean

package main

import (
	"errors"
	"flag"
	"log/slog"
	"slices"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/remote"
)

// The lean build has no WebRTC (WHIP) ingest: pion and libvpx are edges of
// the full build (whip.go). serve and coordinator still know the WHIP
// flags, so a command line written for the full build is refused by the
// flag's name rather than misread; their help names them on one line.

// errNoWhip is what every WHIP flag answers.
var errNoWhip = errors.New("WHIP ingest is not in the lean build (sources: mdag source, serve --synthetic); " + fullBuild)

// whipFlags holds nothing: every WHIP flag refuses its value.
type whipFlags struct{}

func addWhipFlags(fs *flag.FlagSet) *whipFlags {
	for _, name := range whipFlagNames {
		fs.Var(refusedFlag{isBool: slices.Contains(whipBoolFlags, name)}, name, errNoWhip.Error())
	}
	return &whipFlags{}
}

// attach adds no WHIP server (obs.ws stays nil); it logs why.
func (*whipFlags) attach(_ string, app *dag.App, _ *observed, log *slog.Logger) (func(), error) {
	log.Info("no WebRTC ingest: this is the lean build", "app", app.Name, "sources", "mdag source (gRPC), serve --synthetic")
	return func() {}, nil
}

// refusedFlag is a WHIP flag in the lean build: any value is an error.
type refusedFlag struct{ isBool bool }

func (refusedFlag) String() string     { return "" }
func (refusedFlag) Set(string) error   { return errNoWhip }
func (f refusedFlag) IsBoolFlag() bool { return f.isBool }
func (refusedFlag) notInBuild() string {
	return "WHIP ingest is not in the lean build (" + fullBuild + "); refused flags"
}

// whepPlayerJS is never served here (o.whep is nil).
var whepPlayerJS []byte

// noWhepWhy says why GET /whep/player.js is a stub.
const noWhepWhy = "this is the lean build"

// check finds nothing: every WHIP flag refused its value when parsed.
func (*whipFlags) check() []error { return nil }

// motion is false: the lean build has no ingest server to estimate motion.
func (*whipFlags) motion() bool { return false }

// delegating is nothing: the lean build has no WHIP server.
func (*whipFlags) delegating() func(*remote.Server, *observed) {
	return func(*remote.Server, *observed) {}
}
