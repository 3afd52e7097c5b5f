// Package scheduler is the centralized GPU batch scheduler (Symphony Sections
// 4.2-4.5; Clockwork Sections 4.4-5.3; Nexus Section 6.3) as a deterministic
// state machine. Time is never read from a clock: every call carries `now`
// (a Time, nanoseconds since an epoch the caller chooses), so the same code
// runs in the live service and, in virtual time, in the simulator (package
// scheduler/sim).
//
// The caller feeds events — Arrive (a request), Finished (a GPU completed a
// batch, with its measured time), Rejected (a GPU could not start an action
// inside its window) and Tick (the wake-up time the scheduler asked for) —
// and collects what the scheduler decided with Take: actions (a batch for a
// GPU with the earliest and latest start times, Clockwork style) and drops
// (each with a reason). Next says when the scheduler wants to be ticked.
//
// Policies behind one interface: symphony (default; non-work-conserving:
// sched_at and the beta*lambda rule), clockwork (work-conserving: when a GPU
// frees, the largest batch that meets the earliest deadline), lazy (Clipper:
// work-conserving, drops only at dispatch), and nexus (static model-to-GPU
// assignment from squishy bin packing, per-GPU round-robin duty cycles,
// early drop with a sliding window).
//
// The package is pure Go: besides the standard library it imports only
// placement/squishy (the Nexus packing), never lp_solve, OpenCV or WebRTC.
package scheduler

import (
	"fmt"
	"math"
	"time"
)

// Time is a point in time: nanoseconds since the caller's epoch.
type Time = time.Duration

// Never is a Time later than any other.
const Never Time = math.MaxInt64

// ModelID names a model (with its SLO, a Nexus "session").
type ModelID string

// GPUID names a GPU.
type GPUID int

// Request is one inference request.
type Request struct {
	ID       uint64
	Model    ModelID
	Arrival  Time
	Deadline Time // arrival + SLO
}

// Model is a model the scheduler serves.
type Model struct {
	ID  ModelID
	SLO time.Duration
	// Latency is the batch execution time l(b) for b = 1..len(Latency).
	Latency []time.Duration
	// Beta is the fixed cost per batch (for the beta*lambda rule); 0 means
	// it is fitted from Latency.
	Beta time.Duration
	// GPUs are the GPUs that have the model loaded (a sub-cluster); empty
	// means every GPU.
	GPUs []GPUID
	// Rate is the expected request rate, used by the nexus policy's static
	// packing; the symphony policy estimates the rate online.
	Rate float64
	// Shares, when set (one per GPUs entry), are the parts of Rate each of
	// GPUs is sized for (placement's), for the nexus policy; nil: even.
	Shares []float64
}

// LinearLatency returns l(b) = alpha*b + beta for b = 1..maxBatch.
func LinearLatency(alpha, beta time.Duration, maxBatch int) []time.Duration {
	out := make([]time.Duration, maxBatch)
	for b := 1; b <= maxBatch; b++ {
		out[b-1] = alpha*time.Duration(b) + beta
	}
	return out
}

// Network is the fixed cost of getting a batch to a GPU: Control per action
// plus PerRequest per request in it (Symphony's delay(bs)).
type Network struct {
	Control    time.Duration
	PerRequest time.Duration
}

// Delay is the network delay of a batch of bs requests.
func (n Network) Delay(bs int) time.Duration { return n.Control + n.PerRequest*time.Duration(bs) }

// Action tells a GPU to run a batch, starting no earlier than Earliest and
// no later than Latest (Clockwork's action window); a GPU that cannot start
// in the window rejects it.
type Action struct {
	ID       uint64
	GPU      GPUID
	Model    ModelID
	Requests []Request
	Earliest Time
	Latest   Time
	Expected time.Duration // the scheduler's estimate of the execution time
}

// DropReason says why a request was dropped.
type DropReason string

const (
	DropExpired  DropReason = "cannot-finish"    // even alone, it could not finish by its deadline
	DropRejected DropReason = "action-rejected"  // its action could not start in its window
	DropNoGPU    DropReason = "no-gpu-for-model" // no GPU has the model loaded
	DropEarly    DropReason = "early-drop"       // nexus: dropped by the sliding window to save a batch
)

// Drop is a dropped request and why.
type Drop struct {
	Request Request
	Reason  DropReason
	At      Time
}

// Scheduler is the state machine every policy implements. It is not safe
// for concurrent use: one goroutine owns it (the runtime's scheduler loop
// or the simulator).
type Scheduler interface {
	// Arrive enqueues a request.
	Arrive(now Time, r Request)
	// Finished reports that a GPU completed an action after measured.
	Finished(now Time, a *Action, measured time.Duration)
	// Rejected reports that a GPU could not start an action in its window.
	Rejected(now Time, a *Action)
	// Hold takes GPU g out of service (held true) or gives it back (false;
	// holds nest): the runtime holds a slot while its model warms up after
	// a load, and while a batch dispatched by an earlier scheduler still
	// runs on it. A held GPU gets no batch; an unknown one is ignored.
	Hold(now Time, g GPUID, held bool)
	// Tick runs the scheduler at the time it asked for (or any time).
	Tick(now Time)
	// Next is when the scheduler wants Tick called (Never if not).
	Next() Time
	// Take returns and clears the actions and drops decided so far.
	Take() ([]*Action, []Drop)
	// Estimator exposes measured execution times and ballooning ratios.
	Estimator() *Estimator
}

// Config is what every policy is built from.
type Config struct {
	Models  []Model
	GPUs    []GPUID
	Network Network
	// NoLoadShed turns off the symphony policy's load-share early drop
	// (requests are then dropped only when they can no longer finish). The
	// runtime sets it: there the allocator has sized the GPUs for the load,
	// and the share estimate does not yet count GPUs running several
	// batches at once, so at the edge of a plan it would shed load that
	// fits.
	NoLoadShed bool
}

func (c Config) validate() error {
	if len(c.GPUs) == 0 {
		return fmt.Errorf("scheduler: no GPUs")
	}
	seen := map[ModelID]bool{}
	for _, m := range c.Models {
		if m.ID == "" || seen[m.ID] {
			return fmt.Errorf("scheduler: model IDs must be unique and non-empty (%q)", m.ID)
		}
		seen[m.ID] = true
		if m.SLO <= 0 || len(m.Latency) == 0 {
			return fmt.Errorf("scheduler: model %s needs an SLO and a latency profile", m.ID)
		}
		for i, l := range m.Latency {
			if l <= 0 || i > 0 && l < m.Latency[i-1] {
				return fmt.Errorf("scheduler: model %s: l(b) must be positive and non-decreasing", m.ID)
			}
		}
	}
	return nil
}

// Policy names a scheduling policy.
type Policy string

const (
	Symphony  Policy = "symphony"
	Clockwork Policy = "clockwork"
	Lazy      Policy = "lazy"
	Nexus     Policy = "nexus"
)

// Policies lists every policy, the default first.
var Policies = []Policy{Symphony, Clockwork, Nexus, Lazy}

// New builds a scheduler with the given policy.
func New(p Policy, cfg Config) (Scheduler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	switch p {
	case Symphony, "":
		return newCentral(cfg, symphonyRule), nil
	case Clockwork:
		return newCentral(cfg, clockworkRule), nil
	case Lazy:
		return newCentral(cfg, lazyRule), nil
	case Nexus:
		return newNexus(cfg)
	}
	return nil, fmt.Errorf("scheduler: unknown policy %q (known: symphony, clockwork, nexus, lazy)", p)
}
