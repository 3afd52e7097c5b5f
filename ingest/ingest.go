// Package ingest holds what the ingest servers (ingest/whip) report to the
// rest of mdag, so that observers (metrics, the dashboard) read it without
// linking WebRTC: per-app Totals and the server's Admission state. It is
// pure Go and imports nothing of mdag's. The servers and sources live
// below it: ingest/whip (WebRTC), ingest/vpx (VP8 decoding), ingest/synth
// (the synthetic pattern).
package ingest

import "time"

// Totals are one app's ingest counters since the process started
// (streams that ended included, so the counters never go down).
type Totals struct {
	App          string
	Streams      int // live ingest connections
	Pending      int // of those, not yet admitted (no frame decoded yet)
	Packets      uint64
	Frames       uint64 // assembled from packets
	Ingested     uint64 // decoded and handed to the session
	Lost         uint64 // incomplete, never decoded
	DecodeErrors uint64
	PLIs         uint64
	Discarded    uint64 // RTP packets discarded (not VP8, duplicates, late)
	Restarts     uint64 // senders' RTP timelines that jumped back
	// CameraLost counts the times a camera's connection was lost (its
	// stream waits and the camera is reconnected); Codecs the live
	// streams by codec (vp8, h264, h265).
	CameraLost uint64
	Codecs     map[string]int
	// FramesRefused counts frames decoded but refused by the app's
	// session (a stream not in it, the coordinator unreachable).
	FramesRefused uint64
	// Refused counts POSTs refused, by reason (stream-limit,
	// pending-limit, capacity, session, recvonly, shutdown); Ended
	// streams that ended, by kind (client, idle, connect-timeout,
	// ice-failed, join-failed, stream-limit, capacity, overload,
	// error, setup-failed, shutdown). Both are bounded sets.
	Refused map[string]uint64
	Ended   map[string]uint64
}

// Admission is the server's admission state (GET /v1/ingest, the
// dashboard, /metrics, `mdag status`).
type Admission struct {
	// Streams admitted (joined their session) and pending (waiting for
	// their first frame); the limits on each.
	Admitted   int `json:"admitted"`
	Pending    int `json:"pending"`
	MaxStreams int `json:"max_streams"`
	MaxPending int `json:"max_pending"`
	// The CPU load: measured (the process's CPU time per second,
	// smoothed), predicted (plus the predicted cost of streams the
	// measurement does not reflect yet), the capacity admission fills, and
	// the predicted cost of a new stream (all in cores).
	LoadCores      float64 `json:"load_cores"`
	PredictedCores float64 `json:"predicted_cores"`
	CapacityCores  float64 `json:"capacity_cores"`
	StreamCost     float64 `json:"stream_cost_cores"`
	// OverloadedFor is how long the load has been above capacity (0: it
	// is not); at ShedAfter the newest stream is shed.
	OverloadedFor time.Duration `json:"overloaded_for_ns"`
	// Refused counts POSTs refused by reason; Ended streams that ended, by
	// kind, since the server started (all apps).
	Refused map[string]uint64 `json:"refused"`
	Ended   map[string]uint64 `json:"ended"`
	// Streams are the live streams, WHIP and cameras, by ID; Cameras the
	// configured RTSP cameras, connected or not (a camera that cannot be
	// reached or refuses the password has no stream, only this).
	Streams []Stream `json:"streams,omitempty"`
	Cameras []Camera `json:"cameras,omitempty"`
}

// Camera is a configured camera as status and the dashboard show it.
type Camera struct {
	Name   string `json:"name"`
	App    string `json:"app"`
	Source string `json:"source"` // its URL without the password
	Codec  string `json:"codec,omitempty"`
	// State is connecting, streaming, reconnecting, failed or stopped.
	State      string `json:"state"`
	Reconnects uint64 `json:"reconnects"`
	CameraLost uint64 `json:"camera_lost"`
	LastError  string `json:"last_error,omitempty"`
	// Down is how long it has been without frames (0 while streaming).
	Down time.Duration `json:"down_ns,omitempty"`
	// ReadBy is who reads a coordinator's camera: an ingest worker's
	// ID, "coordinator", or "-" while it waits for a reader; empty where
	// cameras are read where they are configured (mdag serve, source).
	ReadBy string `json:"read_by,omitempty"`
}

// Stream is a live ingest stream as the dashboard lists it.
type Stream struct {
	ID     string `json:"id"`
	App    string `json:"app"`
	State  string `json:"state"`            // pending, admitted
	Codec  string `json:"codec,omitempty"`  // vp8, h264, h265
	Source string `json:"source,omitempty"` // whip, or a camera's URL without its password
	Width  int    `json:"width,omitempty"`
	Height int    `json:"height,omitempty"`
	// Layer is the simulcast layer decoded, its rid and size ("h
	// 640x360"), if the sender offered layers; Layers every layer offered
	// the same way (the rid alone until its size is known); LayerDown the
	// layers stepped below the one that fits the app (decoding fell
	// behind, the server overloaded).
	Layer     string   `json:"layer,omitempty"`
	Layers    []string `json:"layers,omitempty"`
	LayerDown int      `json:"layer_down,omitempty"`
	// Waiting says why a camera's stream has no frames now (camera lost,
	// reconnecting); CameraLost counts the times its camera went away.
	Waiting    string `json:"waiting,omitempty"`
	CameraLost uint64 `json:"camera_lost,omitempty"`
	// ReadBy is the ingest worker a WHIP stream's media goes to (state
	// on-worker: the coordinator delegated it); empty when read here.
	ReadBy string `json:"read_by,omitempty"`
}

// A Feed is a live stream that is not a WebRTC peer: an RTSP camera
// (ingest/rtsp) hands the ingest server (ingest/whip's Server implements
// Feeds) coded frames, and the server runs the same path as for a WHIP
// stream: decoding, the capture clock, sampling to the app's fps, the
// resolution limit, admission, the session, results, counters in status,
// metrics and on the dashboard. A Feed lives as long as its camera is
// configured: a camera that goes away and comes back is one stream with a
// gap (Disconnected, then frames again), not two. Methods are safe to call
// from one goroutine (the camera's); Done may be read from any.
type Feed interface {
	// ID is the stream's ID in status and results (the camera's name).
	ID() string
	// Frame hands over one access unit: Annex-B (start codes before each
	// NAL unit, parameter sets in band) for H.264/H.265, with its RTP
	// timestamp (90 kHz) and whether it is a key frame (IDR/IRAP).
	Frame(au []byte, rtpTS uint32, key bool)
	// SenderReport is an RTCP sender report of the camera: its wall clock
	// (64-bit NTP) at RTP time rtpTS; capture times follow it once it
	// agrees with arrivals (as for WHIP).
	SenderReport(ntp uint64, rtpTS uint32)
	// Lost counts frames the camera sent that never arrived whole (the
	// depacketizer gave them up); decoding waits for the next key frame.
	Lost(frames int)
	// Disconnected says the camera went away (why, with no password in
	// it): a camera-lost event; the stream stays, waiting, until frames
	// come again (a new timeline: decoder and capture clock start afresh)
	// or End.
	Disconnected(why string)
	// End ends the stream (kind: one of the server's end kinds, e.g.
	// "client" when the camera is removed, "error" for a camera that
	// cannot be served); the first End wins.
	End(kind, why string)
	// Done is closed when the stream has ended, by End or by the server
	// (shutdown, shed for overload, refused at its first frame, no frame
	// decoded within the connect timeout, frames the session refuses):
	// the camera stops reading.
	Done() <-chan struct{}
	// Ended is the kind of the end (the server's end kinds: "capacity",
	// "stream-limit", "join-failed", "connect-timeout", "overload",
	// "error", "shutdown", "client", ...) and why; empty before Done.
	Ended() (kind, why string)
}

// FeedConfig describes a Feed to open.
type FeedConfig struct {
	App   string // the deployed app the stream joins
	Name  string // the stream's ID: unique among live streams
	Codec string // "h264" or "h265"
	// Source is what status shows as the stream's origin, e.g.
	// "rtsp://cam1.local:554/stream" (never with a password).
	Source string
	// FPS is the rate frames are sampled at (0: the app's).
	FPS float64
}

// Feeds opens Feeds: the ingest server. OpenFeed refuses (an error that
// says why: unknown app, name in use, stream or pending limit, no CPU
// capacity, shutting down) or returns a pending stream, admitted at its
// first decoded frame like a WHIP stream.
type Feeds interface {
	OpenFeed(cfg FeedConfig) (Feed, error)
}
