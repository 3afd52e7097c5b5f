package lpsolve_test

import (
	"math"
	"testing"

	"github.com/draffensperger/golp"

	"github.com/mdag/mdag/internal/lpsolve"
)

// TestFloorFirstFindsOptimum is the allocation LP on which lp_solve's
// default (ceiling first) stops at 376.38; the optimum is 375.84.
func TestFloorFirstFindsOptimum(t *testing.T) {
	build := func() *golp.LP {
		lp := golp.NewLP(0, 9)
		lp.SetVerboseLevel(golp.NEUTRAL)
		lp.SetAddRowMode(true)
		add := func(row []golp.Entry, ct golp.ConstraintType, rhs float64) {
			if err := lp.AddConstraintSparse(row, ct, rhs); err != nil {
				t.Fatal(err)
			}
		}
		add([]golp.Entry{{Col: 0, Val: 1}, {Col: 1, Val: 1}}, golp.EQ, 1)
		add([]golp.Entry{{Col: 2, Val: 1}}, golp.EQ, 1)
		add([]golp.Entry{{Col: 3, Val: 1}, {Col: 4, Val: 1}}, golp.EQ, 1)
		add([]golp.Entry{{Col: 0, Val: -0.117111111}, {Col: 1, Val: -0.450444444}, {Col: 5, Val: -1}, {Col: 7, Val: 1}}, golp.GE, 0)
		add([]golp.Entry{{Col: 2, Val: -0.114111111}, {Col: 6, Val: -1}, {Col: 7, Val: 1}}, golp.GE, 0)
		add([]golp.Entry{{Col: 3, Val: -0.021518519}, {Col: 4, Val: -0.086074074}, {Col: 7, Val: -1}, {Col: 8, Val: 1}}, golp.GE, 0)
		for c := 0; c < 5; c++ {
			lp.SetBinary(c, true)
		}
		lp.SetBounds(8, 0, 0.472001)
		lp.SetObjFn([]float64{169.02, 12.96, 51.84, 311.04, 155.52, 0, 0, 0, 0})
		return lp
	}
	lp := build()
	if lpsolve.IsFloorFirst(lp) {
		t.Fatal("lp_solve's default is no longer ceiling first: this workaround may be unneeded")
	}
	lpsolve.FloorFirst(lp)
	if !lpsolve.IsFloorFirst(lp) {
		t.Fatal("FloorFirst did not take")
	}
	if st := lp.Solve(); st != golp.OPTIMAL || math.Abs(lp.Objective()-375.84) > 1e-6 {
		t.Fatalf("floor first: %v %v, want OPTIMAL 375.84", st, lp.Objective())
	}
	def := build()
	if st := def.Solve(); st == golp.OPTIMAL && math.Abs(def.Objective()-375.84) < 1e-6 {
		t.Log("lp_solve's default now finds the optimum too; the workaround is harmless")
	}
}
