package modules_test

import (
	"slices"
	"testing"

	"github.com/mdag/mdag/modules"
)

func TestRegistry(t *testing.T) {
	names := modules.Names()
	if !slices.IsSorted(names) || len(names) != len(modules.Ops()) {
		t.Fatalf("Names() = %v", names)
	}
	for _, n := range names {
		op, ok := modules.Lookup(modules.OpID(n))
		if !ok || string(op.Name) != n || op.Summary == "" {
			t.Errorf("Lookup(%s) = %+v %v", n, op, ok)
		}
	}
	if op, _ := modules.Lookup("track"); !op.Stateful {
		t.Error("track is stateful")
	}
	if _, ok := modules.Lookup("blur"); ok {
		t.Error("unknown op found")
	}
}
