// Package source is the camera side of mdag's gRPC transport: what sends
// frames into an app's session over the coordinator's Ingest stream.
// Stream sends a synthetic camera; StreamReconnecting and
// StreamAudioReconnecting keep one stream going across broken
// connections and coordinator restarts (resumed under its ID, with its
// sequence numbers, the gap counted); Forwarder carries live cameras that
// another process decoded (WHIP, RTSP) to a remote coordinator. Dial the
// connection with remote/client's Dial or DialTLS. It imports no worker,
// coordinator or planner code.
package source
