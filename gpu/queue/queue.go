// Package queue times the waits inside an executor: a batch that finds all
// of a model's slots busy waits in Run, and that wait is not the
// model's execution time. Pure Go, below the executors and the worker.
package queue

import (
	"context"
	"sync/atomic"
	"time"
)

// An executor that bounds the batches a model runs at once
// (ONNX Runtime's sessions, a KServe model's slots) makes a batch that
// finds them all busy wait inside Run. That wait is not the model's
// execution: counted as such, it reads as ballooning when in-process
// instances that share one executor send it more batches than it has
// sessions (7 instances on one 2-session executor measured 4x), and a
// ballooning re-plan buys more instances, which send more. The worker hands Run
// a context with a queue timer; the executor adds each wait to it, and the
// worker measures the batch without it (the wait still delays the frames,
// which the scheduler's deadlines see).

type key struct{}

// WithTimer returns ctx carrying q: executors add to it (Add) the
// time a batch waits for one of their slots before it runs.
func WithTimer(ctx context.Context, q *atomic.Int64) context.Context {
	return context.WithValue(ctx, key{}, q)
}

// Add adds d, a wait for a slot, to ctx's queue timer (none: nothing).
func Add(ctx context.Context, d time.Duration) {
	if q, ok := ctx.Value(key{}).(*atomic.Int64); ok && d > 0 {
		q.Add(int64(d))
	}
}
