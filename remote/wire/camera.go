package wire

import (
	"strings"
	"time"

	"github.com/mdag/mdag/api"
)

// CameraReport is how a camera being read is doing: what an ingest worker
// reports of a camera the coordinator assigned it (CameraState), and what
// the coordinator shows of each of its cameras, wherever it is read.
type CameraReport struct {
	State, Codec, Transport string
	Frames, Lost            uint64
	Reconnects, CameraLost  uint64
	LastError               string // never with a password
	Down, LastGap           time.Duration
}

// CameraRefused is the state a worker reports of a camera it was assigned
// and does not read (it reads none, or has as many as it takes): the
// coordinator assigns it elsewhere.
const CameraRefused = "refused"

// MaxCameraText bounds each text of a CameraState the coordinator keeps
// (longer ones are cut).
const MaxCameraText = 512

// CameraStateToPB is r as a worker sends it of stream.
func CameraStateToPB(stream string, r CameraReport) *api.CameraState {
	return &api.CameraState{Stream: stream, State: r.State, Codec: r.Codec, Transport: r.Transport, Frames: r.Frames,
		Reconnects: r.Reconnects, CameraLost: r.CameraLost, LastError: r.LastError, DownNs: int64(r.Down),
		Lost: r.Lost, LastGapNs: int64(r.LastGap)}
}

// CameraStateFromPB is m's report, each text cut to MaxCameraText.
func CameraStateFromPB(m *api.CameraState) CameraReport {
	return CameraReport{State: cut(m.State), Codec: cut(m.Codec), Transport: cut(m.Transport), Frames: m.Frames,
		Reconnects: m.Reconnects, CameraLost: m.CameraLost, LastError: cut(m.LastError), Down: time.Duration(max(0, m.DownNs)),
		Lost: m.Lost, LastGap: time.Duration(max(0, m.LastGapNs))}
}

func cut(s string) string { return Cut(s, MaxCameraText) }

// Cut is s cut to at most n bytes, never inside a UTF-8 sequence: what a
// peer sent, kept or quoted within a bound.
func Cut(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "")
	}
	return s
}
