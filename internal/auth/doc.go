// Package auth is the HTTP side's credentials and limits: bearer tokens
// read from a tokens file (YAML, each token stored as its SHA-256 hash, with
// a role, the apps it may stream into and per-token caps), their
// constant-time check, and token-bucket rate limits on an injected clock.
//
// It knows nothing of WHIP or the coordinator: ingest/whip asks it whether a
// request's token may stream into an app, cmd/mdag whether it may read the
// API. See docs/security.md.
package auth
