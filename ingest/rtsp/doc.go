// Package rtsp reads RTSP IP cameras into the ingest server: per camera one
// goroutine connects (DESCRIBE, the first H.264 or H.265 video, SETUP,
// PLAY) through github.com/bluenviron/gortsplib/v4, depacketizes RTP into
// access units, marks key frames (H.264 IDR, NAL type 5; H.265 IRAP, types
// 16..21), writes them as Annex-B and hands them to an ingest.Feed with
// their RTP timestamps; RTCP sender reports go to Feed.SenderReport and
// access units that never arrived whole to Feed.Lost. Decoding is the
// server's (ingest.Feeds; ingest/whip's Server).
//
// # The stream across reconnects
//
// A camera has one Feed, opened at its first connection (once its codec is
// known, just before PLAY) and kept: a lost connection is
// Feed.Disconnected (a camera-lost event, logged at WARN with the camera's
// name and counted), then reconnects with backoff: 1 s doubling to 30 s,
// each wait jittered down by up to a half, back to 1 s after a connection
// that delivered frames for 10 s; every time is on the injected clock
// (Options.Clock). Each connection starts at an access-unit boundary;
// access units before its first key frame are handed on as not key (the
// server skips them and counts them as waiting_key, as for WHIP, and
// CameraStatus.Frames counts them); key frames without their
// parameter sets in band get the latest ones (the SDP's
// sprop-parameter-sets, or seen in band) in front. Status shows the gap:
// the last frame before a camera-lost event to the first one after.
// A camera whose codec changes between connections gets a new Feed (the
// old one ends with kind "client"). When the Feed's Done closes, the
// camera reads Feed.Ended: kind "shutdown" (mdag is stopping) or "client"
// stops the camera; any other kind (capacity, stream-limit, join-failed,
// connect-timeout, overload, error: the server or its session would not
// take the stream now) is the camera's LastError, "the server ended the
// stream (KIND): WHY", logged at ERROR, and the camera reconnects with
// backoff and a new Feed: a new stream of the session. Close ends the
// feeds still open with kind "shutdown".
//
// # Errors: what is retried
//
// Every error names the camera and its URL without user information:
// "camera door: rtsp://10.0.0.5:554/stream1: 404 Not Found: no such stream
// path". Decisions:
//   - No H.264 or H.265 video in the description ("offers no H.264 or
//     H.265 video (it has: video M-JPEG, audio G711)"): permanent. The
//     camera is Failed, its feed (if open) ends with kind "error", and it
//     is not retried: the camera must be reconfigured, and mdag restarted.
//     So is H.264 with packetization-mode 2 (interleaved), which
//     gortsplib does not depacketize.
//   - 401 Unauthorized and 403 Forbidden: retried at the longest backoff
//     (30 s, jittered down by up to a half like every wait: 15 to 30 s),
//     logged at ERROR each time: a password fixed on the camera side is
//     picked up, and an operator sees every failure.
//   - 404 Not Found: retried with backoff, logged at WARN: cameras that
//     boot answer 404 until their encoder runs.
//   - No answer within Options.DialTimeout (5 s, for connect, DESCRIBE,
//     SETUP and PLAY together), a refused connection, a network error, a
//     lost connection, and no packet for Options.ReadTimeout (10 s) while
//     playing: retried with backoff.
//   - The server refusing the feed (capacity, stream limit, unknown app),
//     or ending it for any reason but shutdown: logged at ERROR, retried
//     with backoff.
//
// # Passwords
//
// A camera's URL holds its password; it is given to gortsplib and to
// nothing else. Status (CameraStatus.Source), FeedConfig.Source, logs and
// errors show the URL without user information (Redact), and every error
// text, library ones included, has the user information of every URL in
// it removed (RedactText) before it is logged or stored; nothing else of
// the text changes (the password's letters elsewhere in it are not
// replaced: that would rewrite the message and give the password away by
// contrast). A password holding '/', '?', '#' or '@' must be
// percent-encoded (RFC 3986); written raw, the user information is taken
// to run to the last '@' (when a ':' comes before it) for Redact, and
// ParseURL refuses the URL without showing it: a URL that does not parse,
// whose host url.Parse and Redact disagree on, or whose user information
// holds a raw '@' (url.Parse would take the last '@', a reader perhaps the
// first) is "rtsp:// URL (URL hidden: ...)" with what is wrong and the
// fix (%40).
//
// # Configuration
//
// Cameras come from --camera URL or NAME=URL (ParseFlag) or a strict YAML
// file (ParseCameras: yamlx, every problem with file:line and field path,
// ${VAR} expanded from the environment in URLs).
package rtsp
