// Package layering holds no code: its test checks mdag's layers with `go
// list`. The planners, the worker and the coordinator must never reach
// native code (OpenCV through gocv, lp_solve through golp, WebRTC through
// pion, libvpx through ingest/vpx), and every import between mdag's own
// packages must be an allowed edge: no arrow back up, no new room without a
// line in the table. docs/ARCHITECTURE.md draws the same layers.
package layering
