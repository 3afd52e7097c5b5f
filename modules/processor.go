package modules

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/mdag/mdag/media"
)

// Processor runs one CPU op on items. A Processor may be called from
// several goroutines at once (the runtime's pool for the module); stateless
// ops need no locking, ops holding OpenCV objects lock them.
type Processor interface {
	// Process turns one input item into zero or more outputs (crop fans
	// out one item per detection).
	Process(it *media.Item) ([]*media.Item, error)
	// Close releases what the processor holds.
	Close()
}

// Factory builds a processor from decoded params.
type Factory func(p Params) (Processor, error)

// ErrNotImplemented is returned by Registry.New for declared ops the
// registry has no factory for (not implemented yet, or left out of this
// binary: the lean build has no OpenCV ops).
var ErrNotImplemented = errors.New("op has no implementation in this binary")

// Registry maps declared ops to the factories this binary links. The zero
// value is empty; it is safe for concurrent use.
type Registry struct {
	mu sync.RWMutex
	f  map[OpID]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{f: map[OpID]Factory{}} }

// Register adds op's factory. The op must be declared (Lookup) and not
// registered yet.
func (r *Registry) Register(op OpID, f Factory) error {
	if _, ok := Lookup(op); !ok {
		return fmt.Errorf("register %q: not a declared op (declared: %s)", op, strings.Join(Names(), ", "))
	}
	if f == nil {
		return fmt.Errorf("register %q: nil factory", op)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		r.f = map[OpID]Factory{}
	}
	if _, dup := r.f[op]; dup {
		return fmt.Errorf("register %q: already registered", op)
	}
	r.f[op] = f
	return nil
}

// Replace sets op's factory whether or not one is registered: tests and
// embedders swapping an implementation (the op must be declared).
func (r *Registry) Replace(op OpID, f Factory) error {
	if _, ok := Lookup(op); !ok {
		return fmt.Errorf("replace %q: not a declared op", op)
	}
	if f == nil {
		return fmt.Errorf("replace %q: nil factory", op)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		r.f = map[OpID]Factory{}
	}
	r.f[op] = f
	return nil
}

// Has reports whether op has a factory.
func (r *Registry) Has(op OpID) bool {
	if r == nil {
		return false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.f[op]
	return ok
}

// Implemented lists the ops with a factory, sorted.
func (r *Registry) Implemented() []string {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.f))
	for op := range r.f {
		out = append(out, string(op))
	}
	sort.Strings(out)
	return out
}

// Check says why op cannot be built here: unknown, or declared without a
// factory in this registry (errors.Is ErrNotImplemented). Nil when it can.
func (r *Registry) Check(op OpID) error {
	if _, ok := Lookup(op); !ok {
		return fmt.Errorf("unknown op %q (known: %s)", op, strings.Join(Names(), ", "))
	}
	if !r.Has(op) {
		impl := "none"
		if names := r.Implemented(); len(names) > 0 {
			impl = strings.Join(names, ", ")
		}
		return fmt.Errorf("op %s: %w (implemented: %s)", op, ErrNotImplemented, impl)
	}
	return nil
}

// New decodes params and builds op's processor.
func (r *Registry) New(op OpID, raw map[string]any) (Processor, error) {
	if err := r.Check(op); err != nil {
		return nil, err
	}
	p, err := DecodeParams(op, raw)
	if err != nil {
		return nil, err
	}
	r.mu.RLock()
	f := r.f[op]
	r.mu.RUnlock()
	return f(p)
}

// Must panics on a registration error: for wiring code registering
// declared ops once at start, where an error is a programming mistake.
func Must(err error) {
	if err != nil {
		panic(err)
	}
}
