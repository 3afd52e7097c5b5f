package allocator

import "errors"

var (
	// ErrBadRequest wraps problems with the request itself: unknown modules
	// or worker types, non-positive rates or factors, unknown methods.
	ErrBadRequest = errors.New("bad allocation request")
	// ErrTooLarge is returned by bruteforce for inputs it refuses to search.
	ErrTooLarge = errors.New("input too large for bruteforce")
	// ErrSolver wraps a MILP solver failure (numerical trouble, no memory).
	ErrSolver = errors.New("MILP solver failed")
	// ErrNoMILPSolver is returned for method milp (the default) when the
	// request hands in no MILP solver: this package does not link one.
	ErrNoMILPSolver = errors.New("milp: no MILP solver given; set allocator.Request.MILPSolver to milp.Solver{} (package github.com/mdag/mdag/allocator/milp)")
)
