package kserve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/internal/clock"
)

// PlatformEmulated is the platform ModelMetadata reports for Emulated's
// models: the protocol's cost without the model's compute.
const PlatformEmulated = "mdag_emulated"

// EmulatedOutput is the one output of an emulated model: FP32 [batch, 1]
// of zeros.
const EmulatedOutput = "output"

// Emulated is a Backend that takes any input of a registry entry's shape,
// waits the profiled l(b) on an injected clock and returns one FP32 output
// [b, 1] of zeros: what the protocol costs (serialisation, transport,
// shared memory) beside a model's time, without a model. It is a Loader
// too: an emulated model holds no memory, so Load and Unload only change
// what the server accepts.
type Emulated struct {
	clk     clock.Clock
	latency gpu.LatencyFunc
	models  []ModelMeta

	mu     sync.Mutex
	loaded map[string]bool
}

// NewEmulated serves every entry of reg (any format: only the input
// tensor and max_batch are used) with l(b) from latency, which must know
// every model at batch 1..max_batch.
func NewEmulated(reg *registry.Registry, clk clock.Clock, latency gpu.LatencyFunc) (*Emulated, error) {
	e := &Emulated{clk: clk, latency: latency, loaded: map[string]bool{}}
	var errs []error
	for _, name := range reg.Names() {
		m := reg.Models[name]
		for b := 1; b <= m.MaxBatch; b++ {
			if _, ok := latency(name, b); !ok {
				errs = append(errs, fmt.Errorf("model %s: no profiled latency at batch %d (max_batch %d)", name, b, m.MaxBatch))
				break
			}
		}
		shape := m.InputShape(1)
		shape[0] = -1
		e.models = append(e.models, ModelMeta{
			Name: name, Platform: PlatformEmulated, MaxBatch: m.MaxBatch,
			Inputs:  []TensorMeta{{Name: m.Input.Name, DType: m.Input.DType, Shape: shape}},
			Outputs: []TensorMeta{{Name: EmulatedOutput, DType: "float32", Shape: []int64{-1, 1}}},
		})
		e.loaded[name] = true
	}
	if len(errs) == 0 && len(e.models) == 0 {
		errs = append(errs, fmt.Errorf("%s has no models", reg.File))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return e, nil
}

// Models implements Backend.
func (e *Emulated) Models() []ModelMeta { return slices.Clone(e.models) }

// Infer implements Backend: l(b) on the clock, then zeros.
func (e *Emulated) Infer(ctx context.Context, model string, in []Tensor) ([]Tensor, error) {
	e.mu.Lock()
	loaded := e.loaded[model]
	e.mu.Unlock()
	if !loaded {
		return nil, fmt.Errorf("emulated: model %q is not loaded", model)
	}
	if len(in) == 0 || len(in[0].Shape) == 0 {
		return nil, fmt.Errorf("emulated: model %s: no batched input", model)
	}
	b := int(in[0].Shape[0])
	l, ok := e.latency(model, b)
	if !ok {
		return nil, fmt.Errorf("emulated: no profile for model %q at batch %d", model, b)
	}
	if err := wait(ctx, e.clk, l); err != nil {
		return nil, err
	}
	return []Tensor{{Name: EmulatedOutput, DType: "float32", Shape: []int64{int64(b), 1}, Data: make([]byte, 4*b)}}, nil
}

// wait waits d on clk, or until ctx ends.
func wait(ctx context.Context, clk clock.Clock, d time.Duration) error {
	done := make(chan struct{})
	t := clk.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

func (e *Emulated) known(model string) error {
	for _, m := range e.models {
		if m.Name == model {
			return nil
		}
	}
	return fmt.Errorf("emulated: model %q is not in the registry", model)
}

// Load implements Loader.
func (e *Emulated) Load(_ context.Context, model string) error {
	if err := e.known(model); err != nil {
		return err
	}
	e.mu.Lock()
	e.loaded[model] = true
	e.mu.Unlock()
	return nil
}

// Unload implements Loader.
func (e *Emulated) Unload(_ context.Context, model string) error {
	if err := e.known(model); err != nil {
		return err
	}
	e.mu.Lock()
	e.loaded[model] = false
	e.mu.Unlock()
	return nil
}
