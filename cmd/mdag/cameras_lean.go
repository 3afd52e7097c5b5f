//go:build lean

package main

import (
	"errors"
	"flag"
	"io"
	"log/slog"

	"github.com/mdag/mdag/dag"
)

// The lean build has no RTSP cameras: they feed the WHIP ingest server,
// which it does not have. --camera and --cameras are refused by name.

var errNoCameras = errors.New("RTSP cameras are not in the lean build (they need the WHIP ingest server); " + fullBuild)

type cameraFlags struct{}

func addCameraFlags(fs *flag.FlagSet) *cameraFlags {
	fs.Var(refusedCameraFlag{}, "camera", errNoCameras.Error())
	fs.Var(refusedCameraFlag{}, "cameras", errNoCameras.Error())
	return &cameraFlags{}
}

type refusedCameraFlag struct{}

func (refusedCameraFlag) String() string   { return "" }
func (refusedCameraFlag) Set(string) error { return errNoCameras }

// cameraRun is no cameras.
type cameraRun struct{}

func (*cameraFlags) start(string, *dag.App, *observed, *slog.Logger) (*cameraRun, error) { return nil, nil }

func (*cameraRun) Stop() {}

func writeCameraTable(io.Writer, []struct{}) {}

func (*cameraRun) Status() []struct{} { return nil }

func checkCamerasFile(string, []string) (string, error) { return "", errNoCameras }
