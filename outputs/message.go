// Package outputs sends what an app produces to where its users need it:
// MQTT brokers, NATS servers and webhooks (the transports in outputs/mqtt,
// outputs/nats and outputs/webhook), declared under the app's `outputs:`
// (dag.Output).
//
// Each frame's result (Result, from the engine's results) becomes the
// messages each output asks for (Kinds): an event per activity or
// sequence rule event, the stream's counts when they change, every
// frame's result, or each stream's state on an interval. Every message is
// a JSON document of schema mdag.output/v1 (docs/outputs.schema.json)
// with an id that stays the same however often it is sent.
//
// Delivery is at-least-once and in order per output: a message is first
// appended to the output's on-disk spool (outputs/spool), then sent by the
// output's runner, and leaves the spool only when the destination has
// acknowledged it. While the destination is down, messages wait in the
// spool (bounded in bytes and age, with a stated policy when full) and
// drain in order when it is back; what is dropped is counted by reason and
// said in the log, the status and the metrics. Time comes from an
// injected clock.
package outputs

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mdag/mdag/media"
)

// Schema is the version of the messages' JSON; a change that is not an
// addition gets a new version.
const Schema = "mdag.output/v1"

// Message kinds.
const (
	KindEvent  = "event"
	KindCounts = "counts"
	KindFrame  = "frame"
	KindState  = "state"
)

// Kinds are the kinds of message, in the order documented.
var Kinds = []string{KindEvent, KindCounts, KindFrame, KindState}

// Result is one frame's result as the engine reports it.
type Result struct {
	App, Stream string
	Seq         uint64
	Outcome     string // finished, late, dropped
	Latency     time.Duration
	Module      string // a drop's module and reason
	Reason      string
	Boxes       []media.Box
	Labels      []string
	Counts      map[string]int
	Tracks      []media.Track
	Events      []media.Event
	Finished    time.Time
}

// Body is a message's JSON (schema mdag.output/v1).
type Body struct {
	Schema  string    `json:"schema"`
	ID      string    `json:"id"`
	App     string    `json:"app"`
	Stream  string    `json:"stream"`
	Kind    string    `json:"kind"`
	Seq     uint64    `json:"seq"`     // the frame's number in its stream (state: the latest frame's)
	Capture time.Time `json:"capture"` // when the frame was captured
	Time    time.Time `json:"time"`    // when the message was made
	// one of these, by kind
	Event  *Event         `json:"event,omitempty"`
	Counts map[string]int `json:"counts,omitzero"` // counts and state (an empty object: nothing counted)
	Frame  *Frame         `json:"frame,omitempty"`
}

// Event is an activity or sequence rule's event.
type Event struct {
	Kind   string `json:"kind"`
	Rule   string `json:"rule"`
	Track  uint64 `json:"track,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// Frame is a frame's whole result.
type Frame struct {
	Outcome   string         `json:"outcome"` // finished, late, dropped
	LatencyMS float64        `json:"latency_ms"`
	Module    string         `json:"module,omitempty"` // a drop's
	Reason    string         `json:"reason,omitempty"`
	Boxes     []Box          `json:"boxes"`
	Labels    []string       `json:"labels,omitempty"`
	Counts    map[string]int `json:"counts,omitempty"`
	Tracks    []Track        `json:"tracks,omitempty"`
	Events    []Event        `json:"events,omitempty"`
}

// Box is a detection in frame pixels.
type Box struct {
	X     int     `json:"x"`
	Y     int     `json:"y"`
	W     int     `json:"w"`
	H     int     `json:"h"`
	Class string  `json:"class"`
	Score float32 `json:"score"`
}

// Track is a tracked object.
type Track struct {
	ID    uint64 `json:"id"`
	Class string `json:"class,omitempty"`
	Box   Box    `json:"box"`
}

// newID is a message id: the time it was made and 64 random bits, so ids
// sort by time and never repeat across restarts.
func newID(now time.Time) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("outputs: crypto/rand: %v", err))
	}
	return fmt.Sprintf("%016x-%s", uint64(now.UnixNano()), hex.EncodeToString(b[:]))
}

func events(es []media.Event) []Event {
	var out []Event
	for _, e := range es {
		out = append(out, Event{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail})
	}
	return out
}

func boxOf(b media.Box) Box {
	return Box{X: b.X, Y: b.Y, W: b.W, H: b.H, Class: b.Class, Score: b.Score}
}

func frameOf(r Result) *Frame {
	f := &Frame{Outcome: r.Outcome, LatencyMS: float64(r.Latency) / float64(time.Millisecond), Module: r.Module, Reason: r.Reason,
		Boxes: []Box{}, Labels: r.Labels, Counts: r.Counts, Events: events(r.Events)}
	for _, b := range r.Boxes {
		f.Boxes = append(f.Boxes, boxOf(b))
	}
	for _, t := range r.Tracks {
		f.Tracks = append(f.Tracks, Track{ID: t.ID, Class: t.Box.Class, Box: boxOf(t.Box)})
	}
	return f
}

// header is what a runner reads back from a spooled message.
type header struct {
	ID     string `json:"id"`
	Stream string `json:"stream"`
	Kind   string `json:"kind"`
	App    string `json:"app"`
}

// message is a spooled body as a Message.
func message(b []byte) (Message, error) {
	var h header
	if err := json.Unmarshal(b, &h); err != nil {
		return Message{}, fmt.Errorf("a spooled message is not JSON: %w", err)
	}
	return Message{ID: h.ID, App: h.App, Stream: h.Stream, Kind: h.Kind, Retain: h.Kind == KindState || h.Kind == KindCounts, Body: b}, nil
}
