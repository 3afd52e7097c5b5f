// Package whip is mdag's live video ingest: a WHIP (RFC 9725) endpoint on
// pion/webrtc that turns each published WebRTC stream into a stream of an
// app's session.
//
// Path of a frame: RTP packets (VP8, RFC 7741) -> the frame assembler
// (pion's VP8 depacketizer, frames released on the marker bit) -> libvpx
// (ingest/vpx) -> sampling to the app's fps -> the resolution limit ->
// Sink.Ingest with the capture time, taken from the sender's RTCP sender
// reports (or the first frame's arrival until one comes). A key frame is
// requested (PLI) at start, after a lost frame and after a decode error;
// frames until the next key frame are skipped and counted, never fatal.
//
// An app with `media: audio` (Config.Media) takes an Opus track instead
// (audio.go): RTP (RFC 7587) -> libopus (ingest/opus, with loss
// concealment for gaps) -> PCM chunks of 1/fps of the app ->
// AudioSink.IngestAudio, with capture times from the RTP timestamps and
// sender reports as for video; an offer without the track its app takes
// is refused at offer time (400 with the reason).
//
// Results (Server.Publish, fed by the engine's OnFrame) go back per frame as
// JSON on the client's DataChannel and as Server-Sent Events on
// GET /v1/streams/{id}/results. Publisher is the Go WHIP client used by
// `mdag client` and the tests; static/ holds the browser page served at
// /stream/{app}.
package whip
