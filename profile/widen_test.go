package profile_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/profile"
)

// TestWiden: k worker types, the file's own first and unchanged, the copies
// named uniquely, every module configured on every type it was before (and
// their copies), the same catalog for the same k, and k < 1 refused.
func TestWiden(t *testing.T) {
	g, cat, err := examples.Load("traffic")
	if err != nil {
		t.Fatal(err)
	}
	own := len(cat.Workers())
	for _, k := range []int{1, own, 10, 30} {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			wide, err := profile.Widen(g.App(), cat, k)
			if err != nil {
				t.Fatal(err)
			}
			again, err := profile.Widen(g.App(), cat, k)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(wide.Workers(), again.Workers()); d != "" {
				t.Fatalf("not deterministic: %s", d)
			}
			if len(wide.Workers()) != k {
				t.Fatalf("%d worker types, want %d", len(wide.Workers()), k)
			}
			seen := map[profile.WorkerTypeID]bool{}
			for i, w := range wide.Workers() {
				if seen[w.Type] {
					t.Fatalf("worker type %s twice", w.Type)
				}
				seen[w.Type] = true
				if i < own && w != cat.Workers()[i] {
					t.Errorf("own type %d changed: %+v, was %+v", i, w, cat.Workers()[i])
				}
				if i >= own && (!strings.HasPrefix(string(w.Type), string(cat.Workers()[i%own].Type)+"-") || w.Price <= 0) {
					t.Errorf("copy %d: %+v", i, w)
				}
			}
			for _, m := range g.App().Modules {
				var n int
				for _, c := range cat.Configs(m.Name) {
					if indexOf(cat.Workers(), c.Worker) < k {
						n++
					}
				}
				perType := map[profile.WorkerTypeID]int{}
				for _, c := range wide.Configs(m.Name) {
					perType[c.Worker]++
				}
				if k <= own && len(wide.Configs(m.Name)) != n {
					t.Errorf("%s: %d configurations, want %d", m.Name, len(wide.Configs(m.Name)), n)
				}
				for i, w := range wide.Workers() {
					base := cat.Workers()[i%own].Type
					if perType[w.Type] != len(cat.ConfigsOn(m.Name, base)) {
						t.Errorf("%s on %s: %d configurations, %s has %d", m.Name, w.Type, perType[w.Type], base, len(cat.ConfigsOn(m.Name, base)))
					}
				}
			}
		})
	}
	if _, err := profile.Widen(g.App(), cat, 0); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("k=0: error %v", err)
	}
}

func indexOf(ws []profile.WorkerType, t profile.WorkerTypeID) int {
	for i, w := range ws {
		if w.Type == t {
			return i
		}
	}
	return -1
}
