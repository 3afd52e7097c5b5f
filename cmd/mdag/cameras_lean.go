//go:build lean

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/client"
)

// The lean build has no RTSP cameras: they feed the WHIP ingest server,
// which it does not have. --camera and --cameras are refused by name.

var errNoCameras = errors.New("RTSP cameras are not in the lean build (they need the WHIP ingest server); " + fullBuild)

// cameraFlags records whether a camera flag was given; start refuses
// then (a flag's Set error would make the flag package print the value,
// which may hold a password).
type cameraFlags struct{ given *bool }

func addCameraFlags(fs *flag.FlagSet) *cameraFlags {
	cf := &cameraFlags{given: new(bool)}
	fs.Var(refusedCameraFlag{cf.given}, "camera", errNoCameras.Error())
	fs.Var(refusedCameraFlag{cf.given}, "cameras", errNoCameras.Error())
	return cf
}

type refusedCameraFlag struct{ given *bool }

func (refusedCameraFlag) String() string { return "" }
func (f refusedCameraFlag) Set(string) error {
	*f.given = true
	return nil
}

// cameraRun is no cameras.
type cameraRun struct{}

func (cf *cameraFlags) start(_ *dag.App, _ *observed, _ *slog.Logger) (*cameraRun, error) {
	if *cf.given {
		return nil, fmt.Errorf("%w", errNoCameras)
	}
	return nil, nil
}

func (*cameraRun) Stop() {}

// place refuses cameras on the coordinator.
func (cf *cameraFlags) place(_ *dag.App, _ *observed, _ *remote.Server, _ bool, _ time.Duration, _ *slog.Logger) (*cameraRun, error) {
	return cf.start(nil, nil, nil)
}

// workerCameras is none: a lean worker reads no cameras (it says so when
// it registers, and the coordinator assigns them elsewhere).
func workerCameras(*slog.Logger) client.CameraReader { return nil }

// workerWhipFor is none: a lean worker takes no WHIP streams.
func workerWhipFor(*client.IngestServer, whipNet, *slog.Logger) client.WhipIngest { return nil }

// workerTakesWhip: a lean worker takes no WHIP streams.
const workerTakesWhip = false

func writeCameraTable(io.Writer, []struct{}) {}

func (*cameraRun) Status() []struct{} { return nil }

func checkCamerasFile(string, []string) (string, error) { return "", errNoCameras }

// runSource refuses cameras in `mdag source`.
func (cf *cameraFlags) runSource(context.Context, string, float64, *grpc.ClientConn, func(string) (*grpc.ClientConn, error), string, io.Writer, io.Writer) (bool, error) {
	if !*cf.given {
		return false, nil
	}
	return true, invalid(errNoCameras)
}
