// Package lpsolve sets lp_solve options that golp (the pinned Go binding)
// does not expose, on a golp model.
//
// Why: with lp_solve 5.5.2's default ceiling-first branching, branch and
// bound returned OPTIMAL at a cost 0.14% above the true optimum on an
// allocation instance found by the allocator's property test (the
// command-line lp_solve does the same on that LP: `lp_solve -S4` gives
// 376.38, `lp_solve -S4 -cf` gives the optimum 375.84). Floor-first
// branching finds it under every rule tried. golp v0.0.0-20250721104811
// keeps the C model in an unexported field, so FloorFirst reads it with
// reflect and unsafe: the pinned version's layout, checked by a test.
//
// It imports golp and lp_solve's C library (cgo); allocator/milp is its only
// user, so the pure planners never link it.
package lpsolve

/*
#cgo LDFLAGS: -llpsolve55
#include <lp_lib.h>
*/
import "C"

import (
	"reflect"
	"unsafe"

	"github.com/draffensperger/golp"
)

// cModel returns golp's lprec pointer.
func cModel(lp *golp.LP) *C.lprec {
	f := reflect.ValueOf(lp).Elem().FieldByName("ptr")
	if !f.IsValid() || f.Kind() != reflect.Pointer {
		panic("lpsolve: golp.LP has no ptr field: the pinned golp version changed")
	}
	return (*C.lprec)(*(*unsafe.Pointer)(unsafe.Pointer(f.UnsafeAddr())))
}

// FloorFirst makes branch and bound take the floor branch first.
func FloorFirst(lp *golp.LP) { C.set_bb_floorfirst(cModel(lp), C.BRANCH_FLOOR) }

// IsFloorFirst reports whether the model branches floor first.
func IsFloorFirst(lp *golp.LP) bool { return C.get_bb_floorfirst(cModel(lp)) == C.BRANCH_FLOOR }
