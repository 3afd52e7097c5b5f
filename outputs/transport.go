package outputs

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Message is one message to deliver: what an app produced for a stream,
// as the JSON of schema mdag.output/v1 (docs/outputs.schema.json).
type Message struct {
	// ID is the message's idempotency key: unique per message, the same
	// on every attempt to deliver it (a receiver drops a second copy by
	// it). MQTT 5 carries it as the user property "id", webhooks as the
	// Idempotency-Key header, NATS as the Nats-Msg-Id header (JetStream
	// drops duplicates by it); it is in Body too.
	ID     string
	App    string
	Stream string
	Kind   string // event, counts, frame, state (Kinds)
	// Retain asks an MQTT broker to keep the message as its topic's last
	// (the per-stream state a subscriber gets when it subscribes).
	Retain bool
	Body   []byte // JSON
}

// Transport delivers messages to one destination: an MQTT broker, a NATS
// server, a webhook receiver.
//
// Send delivers batch in order and returns when the destination has
// acknowledged the messages (MQTT QoS 1: PUBACK; QoS 0: written to the
// connection; JetStream: PubAck; core NATS: the server's PONG after them;
// HTTP: a 2xx). acked is how many of the batch, from the first, were
// acknowledged: on an error the caller sends batch[acked:] again later
// (a message may arrive twice, with the same ID; never out of order). A
// Transport connects on first use and again after a failure, within
// Send; it is used by one goroutine at a time. ctx bounds the whole call.
type Transport interface {
	Send(ctx context.Context, batch []Message) (acked int, err error)
	// Describe names the destination for logs and status, without secrets
	// (e.g. "mqtt://broker:1883 (MQTT 5, QoS 1)").
	Describe() string
	Close() error
}

// PermanentError is a failure that sending again cannot fix (a webhook's
// 4xx other than 408 and 429, a message over the broker's limit): the
// message is dropped, counted as rejected, and the next one goes.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return "rejected: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError.
func Permanent(format string, a ...any) error {
	return &PermanentError{Err: fmt.Errorf(format, a...)}
}

// IsPermanent reports whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// Closing is a context that is done when ch closes: what a transport's
// Send hands context.AfterFunc so that its Close ends a Send in progress.
func Closing(ch <-chan struct{}) context.Context { return closing{ch} }

type closing struct{ ch <-chan struct{} }

func (c closing) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c closing) Done() <-chan struct{}       { return c.ch }
func (c closing) Value(any) any               { return nil }
func (c closing) Err() error {
	select {
	case <-c.ch:
		return context.Canceled
	default:
		return nil
	}
}
