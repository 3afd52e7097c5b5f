package dag_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/dag"
)

// build makes an app from "name<-in1,in2" specs; every module is a cpu count
// op, and scales maps module to scale factor.
func build(t *testing.T, scales map[string]float64, specs ...string) *dag.Graph {
	t.Helper()
	app := &dag.App{Name: "g", SLO: time.Second, Media: dag.Video}
	for _, s := range specs {
		name, ins, _ := strings.Cut(s, "<-")
		m := dag.Module{Name: dag.ModuleID(name), Kind: dag.CPU, Op: "count", Scale: 1}
		if f, ok := scales[name]; ok {
			m.Scale = f
		}
		for _, in := range strings.Split(ins, ",") {
			m.Inputs = append(m.Inputs, dag.ModuleID(in))
		}
		app.Modules = append(app.Modules, m)
	}
	g, err := dag.NewGraph(app)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGraphStructure(t *testing.T) {
	tests := []struct {
		name           string
		specs          []string
		order          []dag.ModuleID
		sources        []dag.ModuleID
		sinks          []dag.ModuleID
		paths          []string
		shape          dag.Shape
		edges          int
		inputsOfLast   []dag.ModuleID
		outputsOfFirst []dag.ModuleID
	}{
		{
			name: "chain", specs: []string{"a<-source", "b<-a", "c<-b"},
			order: []dag.ModuleID{"a", "b", "c"}, sources: []dag.ModuleID{"a"}, sinks: []dag.ModuleID{"c"},
			paths: []string{"source->a->b->c"}, shape: dag.Chain, edges: 3,
			inputsOfLast: []dag.ModuleID{"b"}, outputsOfFirst: []dag.ModuleID{"b"},
		},
		{
			name: "tree declared out of order", specs: []string{"c<-a", "b<-a", "a<-source"},
			order: []dag.ModuleID{"a", "c", "b"}, sources: []dag.ModuleID{"a"}, sinks: []dag.ModuleID{"c", "b"},
			paths: []string{"source->a->c", "source->a->b"}, shape: dag.Tree, edges: 3,
			inputsOfLast: []dag.ModuleID{"a"}, outputsOfFirst: []dag.ModuleID{"c", "b"},
		},
		{
			name: "two sources is still a tree", specs: []string{"a<-source", "b<-source", "c<-a"},
			order: []dag.ModuleID{"a", "b", "c"}, sources: []dag.ModuleID{"a", "b"}, sinks: []dag.ModuleID{"b", "c"},
			paths: []string{"source->a->c", "source->b"}, shape: dag.Tree, edges: 3,
			inputsOfLast: []dag.ModuleID{"a"}, outputsOfFirst: []dag.ModuleID{"c"},
		},
		{
			name: "fork-join", specs: []string{"a<-source", "b<-a", "c<-a", "d<-b,c"},
			order: []dag.ModuleID{"a", "b", "c", "d"}, sources: []dag.ModuleID{"a"}, sinks: []dag.ModuleID{"d"},
			paths: []string{"source->a->b->d", "source->a->c->d"}, shape: dag.ForkJoin, edges: 5,
			inputsOfLast: []dag.ModuleID{"b", "c"}, outputsOfFirst: []dag.ModuleID{"b", "c"},
		},
		{
			name: "join with the source", specs: []string{"a<-source", "b<-source,a"},
			order: []dag.ModuleID{"a", "b"}, sources: []dag.ModuleID{"a", "b"}, sinks: []dag.ModuleID{"b"},
			paths: []string{"source->a->b", "source->b"}, shape: dag.ForkJoin, edges: 3,
			inputsOfLast: []dag.ModuleID{dag.Source, "a"}, outputsOfFirst: []dag.ModuleID{"b"},
		},
		{
			// The "N" graph (a->c, a->d, b->d) is the smallest non-series-parallel DAG.
			name: "not series-parallel", specs: []string{"a<-source", "b<-source", "c<-a", "d<-a,b"},
			order: []dag.ModuleID{"a", "b", "c", "d"}, sources: []dag.ModuleID{"a", "b"}, sinks: []dag.ModuleID{"c", "d"},
			paths: []string{"source->a->c", "source->a->d", "source->b->d"}, shape: dag.General, edges: 5,
			inputsOfLast: []dag.ModuleID{"a", "b"}, outputsOfFirst: []dag.ModuleID{"c", "d"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := build(t, nil, tt.specs...)
			paths, err := g.Paths()
			if err != nil {
				t.Fatal(err)
			}
			var ps []string
			for _, p := range paths {
				ps = append(ps, p.String())
			}
			order := g.Order()
			got := []any{order, g.Sources(), g.Sinks(), ps, g.Shape(), g.Edges(), g.Inputs(order[len(order)-1]), g.Outputs(order[0])}
			want := []any{tt.order, tt.sources, tt.sinks, tt.paths, tt.shape, tt.edges, tt.inputsOfLast, tt.outputsOfFirst}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCriticalPath(t *testing.T) {
	g := build(t, nil, "a<-source", "b<-a", "c<-a", "d<-b,c", "e<-a")
	lat := map[dag.ModuleID]time.Duration{"a": 10 * time.Millisecond, "b": 30 * time.Millisecond,
		"c": 50 * time.Millisecond, "d": 5 * time.Millisecond, "e": 60 * time.Millisecond}
	path, total := g.CriticalPath(func(m dag.ModuleID) time.Duration { return lat[m] })
	if path.String() != "source->a->e" || total != 70*time.Millisecond {
		t.Errorf("critical path = %s %v, want source->a->e 70ms", path, total)
	}
	lat["e"] = time.Millisecond
	path, total = g.CriticalPath(func(m dag.ModuleID) time.Duration { return lat[m] })
	if path.String() != "source->a->c->d" || total != 65*time.Millisecond {
		t.Errorf("critical path = %s %v, want source->a->c->d 65ms", path, total)
	}
}

func TestRates(t *testing.T) {
	// Scrooge's example: A scales by 4, so B sees 4x the ingress rate.
	g := build(t, map[string]float64{"A": 4}, "A<-source", "B<-A")
	if diff := cmp.Diff(map[dag.ModuleID]float64{"A": 80, "B": 320}, g.Rates(80, nil)); diff != "" {
		t.Error(diff)
	}
	// Observed scaling overrides the declared one.
	if got := g.Rates(80, map[dag.ModuleID]float64{"A": 0.5})["B"]; got != 40 {
		t.Errorf("B with A's scale 0.5 = %g, want 40", got)
	}
	// A join sums its inputs: d gets b's 2x and c's 3x of a's 10.
	g = build(t, map[string]float64{"b": 2, "c": 3}, "a<-source", "b<-a", "c<-a", "d<-b,c,source")
	want := map[dag.ModuleID]float64{"a": 10, "b": 10, "c": 10, "d": 10*2 + 10*3 + 10}
	if diff := cmp.Diff(want, g.Rates(10, nil)); diff != "" {
		t.Error(diff)
	}
}

func TestPathsLimit(t *testing.T) {
	// 18 layers of two modules each, fully connected between layers: 2^18 paths.
	specs := []string{"l0a<-source", "l0b<-source"}
	for i := 1; i < 18; i++ {
		prev := fmt.Sprintf("l%da,l%db", i-1, i-1)
		specs = append(specs, fmt.Sprintf("l%da<-%s", i, prev), fmt.Sprintf("l%db<-%s", i, prev))
	}
	g := build(t, nil, specs...)
	if _, err := g.Paths(); err != dag.ErrTooManyPaths {
		t.Fatalf("Paths() error = %v, want ErrTooManyPaths", err)
	}
	if want := math.Pow(2, 18); want <= dag.MaxPaths {
		t.Fatalf("test graph too small: %g paths", want)
	}
}

func TestDecompose(t *testing.T) {
	tests := []struct {
		specs []string
		want  string // "" when not series-parallel
	}{
		{[]string{"a<-source", "b<-a", "c<-b"}, "a -> b -> c"},
		{[]string{"a<-source", "b<-a", "c<-a"}, "a -> (b | c)"},
		{[]string{"a<-source", "b<-a", "c<-a", "d<-b,c"}, "a -> (b | c) -> d"},
		{[]string{"a<-source", "b<-source,a"}, "a -> b"},
		{[]string{"a<-source", "b<-source"}, "(a | b)"},
		{[]string{"a<-source", "b<-a", "c<-b", "d<-a", "e<-c,d"}, "a -> (b -> c | d) -> e"},
		{[]string{"a<-source", "b<-source", "c<-a", "d<-a,b"}, ""},
	}
	for _, tt := range tests {
		g := build(t, nil, tt.specs...)
		sp, ok := g.Decompose()
		got := ""
		if ok {
			got = sp.String()
		}
		if got != tt.want {
			t.Errorf("%v: Decompose = %q, want %q", tt.specs, got, tt.want)
		}
	}
}
