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
}
