package dag

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// graph is the index form of an app's modules. It tolerates invalid apps
// (unknown or repeated inputs are skipped) so that validation can use it.
type graph struct {
	names      []ModuleID
	idx        map[ModuleID]int
	in, out    [][]int // module indices; edges from the source are in fromSource
	fromSource []bool
}

func buildGraph(a *App) *graph {
	g := &graph{idx: map[ModuleID]int{}}
	for _, m := range a.Modules {
		if _, dup := g.idx[m.Name]; dup || m.Name == "" {
			continue
		}
		g.idx[m.Name] = len(g.names)
		g.names = append(g.names, m.Name)
	}
	n := len(g.names)
	g.in, g.out, g.fromSource = make([][]int, n), make([][]int, n), make([]bool, n)
	for _, m := range a.Modules {
		v, ok := g.idx[m.Name]
		if !ok || g.in[v] != nil || g.fromSource[v] {
			continue // a duplicate definition; the first one counts
		}
		seen := map[ModuleID]bool{}
		for _, in := range m.Inputs {
			if seen[in] {
				continue
			}
			seen[in] = true
			if in == Source {
				g.fromSource[v] = true
				continue
			}
			u, ok := g.idx[in]
			if !ok || u == v { // unknown, or a self-loop (reported on its own)
				continue
			}
			g.in[v] = append(g.in[v], u)
			g.out[u] = append(g.out[u], v)
		}
	}
	return g
}

// findCycle returns one cycle as node indices in data-flow order, first node
// repeated at the end, or nil if the graph is acyclic.
func (g *graph) findCycle() []int {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(g.names))
	stack := []int{}
	var found []int
	var visit func(u int) bool
	visit = func(u int) bool {
		color[u] = grey
		stack = append(stack, u)
		for _, v := range g.out[u] {
			switch color[v] {
			case grey:
				i := len(stack) - 1
				for stack[i] != v {
					i--
				}
				found = append(append([]int{}, stack[i:]...), v)
				return true
			case white:
				if visit(v) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[u] = black
		return false
	}
	for u := range g.names {
		if color[u] == white && visit(u) {
			return found
		}
	}
	return nil
}

func (g *graph) reachableFromSource() []bool {
	seen := make([]bool, len(g.names))
	var q []int
	for v, s := range g.fromSource {
		if s {
			seen[v] = true
			q = append(q, v)
		}
	}
	for len(q) > 0 {
		u := q[0]
		q = q[1:]
		for _, v := range g.out[u] {
			if !seen[v] {
				seen[v] = true
				q = append(q, v)
			}
		}
	}
	return seen
}

func (g *graph) sinks() []int {
	var s []int
	for v := range g.names {
		if len(g.out[v]) == 0 {
			s = append(s, v)
		}
	}
	return s
}

// topo returns a topological order that keeps declaration order among
// modules that are ready at the same time (deterministic, readable).
func (g *graph) topo() []int {
	indeg := make([]int, len(g.names))
	for v := range g.names {
		indeg[v] = len(g.in[v])
	}
	var order []int
	done := make([]bool, len(g.names))
	for len(order) < len(g.names) {
		progressed := false
		for v := range g.names {
			if !done[v] && indeg[v] == 0 {
				done[v] = true
				order = append(order, v)
				for _, w := range g.out[v] {
					indeg[w]--
				}
				progressed = true
				break
			}
		}
		if !progressed {
			panic("dag: topo on a cyclic graph")
		}
	}
	return order
}

// Graph is the validated, indexed form of an App.
type Graph struct {
	app   *App
	g     *graph
	order []int
}

// ErrInvalid wraps the validation errors of an app given to NewGraph.
var ErrInvalid = errors.New("invalid application")

// NewGraph validates the app and indexes it.
func NewGraph(a *App) (*Graph, error) {
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	g := buildGraph(a)
	return &Graph{app: a, g: g, order: g.topo()}, nil
}

// App returns the application the graph was built from.
func (g *Graph) App() *App { return g.app }

// Len returns the number of modules.
func (g *Graph) Len() int { return len(g.g.names) }

// Order returns the modules in topological order (declaration order among
// modules ready at the same time).
func (g *Graph) Order() []ModuleID { return g.ids(g.order) }

// Inputs returns the module's inputs; Source appears for the client stream.
func (g *Graph) Inputs(m ModuleID) []ModuleID {
	v := g.g.idx[m]
	var out []ModuleID
	if g.g.fromSource[v] {
		out = append(out, Source)
	}
	return append(out, g.ids(g.g.in[v])...)
}

// Outputs returns the modules that consume m's output.
func (g *Graph) Outputs(m ModuleID) []ModuleID { return g.ids(g.g.out[g.g.idx[m]]) }

// Sources returns the modules that read the client stream.
func (g *Graph) Sources() []ModuleID {
	var out []ModuleID
	for _, v := range g.order {
		if g.g.fromSource[v] {
			out = append(out, g.g.names[v])
		}
	}
	return out
}

// Sinks returns the modules whose output leaves the graph.
func (g *Graph) Sinks() []ModuleID {
	var out []ModuleID
	for _, v := range g.order {
		if len(g.g.out[v]) == 0 {
			out = append(out, g.g.names[v])
		}
	}
	return out
}

// Edges counts the edges, those from the source included.
func (g *Graph) Edges() int {
	n := 0
	for v := range g.g.names {
		n += len(g.g.in[v])
		if g.g.fromSource[v] {
			n++
		}
	}
	return n
}

func (g *Graph) ids(vs []int) []ModuleID {
	out := make([]ModuleID, len(vs))
	for i, v := range vs {
		out[i] = g.g.names[v]
	}
	return out
}

// Path is a sequence of modules from one reading the source to a sink.
type Path []ModuleID

// String renders the path as source->a->b.
func (p Path) String() string {
	var b strings.Builder
	b.WriteString(string(Source))
	for _, m := range p {
		b.WriteString("->")
		b.WriteString(string(m))
	}
	return b.String()
}

// MaxPaths bounds Paths: an app with more source-to-sink paths is reported
// rather than enumerated.
const MaxPaths = 100_000

// ErrTooManyPaths is returned by Paths past MaxPaths.
var ErrTooManyPaths = fmt.Errorf("more than %d source-to-sink paths", MaxPaths)

// Paths enumerates every source-to-sink path, in a deterministic order.
func (g *Graph) Paths() ([]Path, error) {
	var out []Path
	var cur []int
	var walk func(v int) error
	walk = func(v int) error {
		cur = append(cur, v)
		defer func() { cur = cur[:len(cur)-1] }()
		if len(g.g.out[v]) == 0 {
			if len(out) >= MaxPaths {
				return ErrTooManyPaths
			}
			out = append(out, Path(g.ids(cur)))
			return nil
		}
		for _, w := range g.g.out[v] {
			if err := walk(w); err != nil {
				return err
			}
		}
		return nil
	}
	for _, v := range g.order {
		if g.g.fromSource[v] {
			if err := walk(v); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// Shape classifies the graph for the planners that need a structure.
type Shape string

const (
	Chain    Shape = "chain"     // one path
	Tree     Shape = "tree"      // every module has exactly one input
	ForkJoin Shape = "fork-join" // two-terminal series-parallel (Nexus Section 6.2)
	General  Shape = "dag"       // any other DAG
)

// Shape returns the most specific shape the graph has.
func (g *Graph) Shape() Shape {
	tree := true
	chain := true
	sources := 0
	for v := range g.g.names {
		ins := len(g.g.in[v])
		if g.g.fromSource[v] {
			ins++
			sources++
		}
		if ins != 1 {
			tree = false
		}
		if len(g.g.out[v]) > 1 {
			chain = false
		}
	}
	switch {
	case tree && chain && sources == 1:
		return Chain
	case tree:
		return Tree
	}
	if _, ok := g.Decompose(); ok {
		return ForkJoin
	}
	return General
}

// CriticalPath returns the path with the largest sum of per-module latency
// and that sum. Ties go to the path found first in topological order.
func (g *Graph) CriticalPath(latency func(ModuleID) time.Duration) (Path, time.Duration) {
	n := len(g.g.names)
	dist := make([]time.Duration, n)
	prev := make([]int, n)
	for _, v := range g.order {
		prev[v] = -1
		var best time.Duration
		have := g.g.fromSource[v] // the source contributes latency 0
		for _, u := range g.g.in[v] {
			if !have || dist[u] > best {
				best, prev[v], have = dist[u], u, true
			}
		}
		dist[v] = best + latency(g.g.names[v])
	}
	end := -1
	for _, v := range g.order {
		if len(g.g.out[v]) == 0 && (end < 0 || dist[v] > dist[end]) {
			end = v
		}
	}
	var rev []int
	for v := end; v >= 0; v = prev[v] {
		rev = append(rev, v)
	}
	p := make(Path, len(rev))
	for i, v := range rev {
		p[len(rev)-1-i] = g.g.names[v]
	}
	return p, dist[end]
}

// Rates propagates an ingress rate (items per second at the source) through
// the graph. A module's input rate is the sum over its inputs of the input's
// rate times the input's scale factor; the source contributes the ingress
// rate. scale overrides a module's declared scale factor (observed scaling).
func (g *Graph) Rates(ingress float64, scale map[ModuleID]float64) map[ModuleID]float64 {
	rates := make(map[ModuleID]float64, len(g.g.names))
	for _, v := range g.order {
		var r float64
		if g.g.fromSource[v] {
			r += ingress
		}
		for _, u := range g.g.in[v] {
			r += rates[g.g.names[u]] * g.Scale(g.g.names[u], scale)
		}
		rates[g.g.names[v]] = r
	}
	return rates
}

// Scale returns m's scale factor: the override if one is given, else the
// declared one.
func (g *Graph) Scale(m ModuleID, override map[ModuleID]float64) float64 {
	if f, ok := override[m]; ok {
		return f
	}
	mod, _ := g.app.Module(m)
	return mod.Scale
}
