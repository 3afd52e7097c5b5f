package milp_test

import (
	"testing"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// widen returns the app's catalog over k worker types (profile.Widen), the
// way the issue asks solve times to be measured at 2, 10 and 30 worker types.
func widen(t testing.TB, g *dag.Graph, cat *profile.Catalog, k int) *profile.Catalog {
	t.Helper()
	wide, err := profile.Widen(g.App(), cat, k)
	if err != nil {
		t.Fatal(err)
	}
	return wide
}
