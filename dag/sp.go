package dag

// SPKind says what a node of a series-parallel decomposition is.
type SPKind uint8

const (
	SPModule   SPKind = iota // one module
	SPSeries                 // Parts run one after another: latencies add
	SPParallel               // Parts run side by side: the slowest counts
)

// SP is a node of a series-parallel decomposition of the graph: the whole
// app from the client stream to the results is one SP tree when the graph is
// a tree or a fork-join graph (Nexus Section 6.2).
type SP struct {
	Kind   SPKind
	Module ModuleID // SPModule only
	Parts  []*SP    // SPSeries and SPParallel; two or more
}

// Decompose returns the series-parallel decomposition of the graph, or false
// when it has none (a general DAG such as a->c, a->d, b->d).
//
// Each module becomes an edge from its input vertex to its output vertex,
// graph edges and the source/sink connections become empty edges, and the
// classic reductions run to a fixpoint: two edges between the same vertices
// merge in parallel, and a vertex with one edge in and one out merges them in
// series. The graph is series-parallel iff one source-to-sink edge remains.
func (g *Graph) Decompose() (*SP, bool) {
	type edge struct {
		from, to int
		sp       *SP // nil for an empty edge
		alive    bool
	}
	n := len(g.g.names)
	const s, t = 0, 1
	in := func(v int) int { return 2 + 2*v }
	out := func(v int) int { return 3 + 2*v }
	var edges []*edge
	add := func(from, to int, sp *SP) { edges = append(edges, &edge{from, to, sp, true}) }
	for _, v := range g.order {
		add(in(v), out(v), &SP{Kind: SPModule, Module: g.g.names[v]})
		if g.g.fromSource[v] {
			add(s, in(v), nil)
		}
		for _, u := range g.g.in[v] {
			add(out(u), in(v), nil)
		}
		if len(g.g.out[v]) == 0 {
			add(out(v), t, nil)
		}
	}
	for changed := true; changed; {
		changed = false
		// Parallel reductions.
		for i, a := range edges {
			if !a.alive {
				continue
			}
			for _, b := range edges[i+1:] {
				if b.alive && b.from == a.from && b.to == a.to {
					a.sp = combine(SPParallel, a.sp, b.sp)
					b.alive = false
					changed = true
				}
			}
		}
		// Series reductions.
		for w := 2; w < 2+2*n; w++ {
			var ins, outs []*edge
			for _, e := range edges {
				if e.alive && e.to == w {
					ins = append(ins, e)
				}
				if e.alive && e.from == w {
					outs = append(outs, e)
				}
			}
			if len(ins) == 1 && len(outs) == 1 {
				ins[0].to = outs[0].to
				ins[0].sp = combine(SPSeries, ins[0].sp, outs[0].sp)
				outs[0].alive = false
				changed = true
			}
		}
	}
	var last *edge
	for _, e := range edges {
		if e.alive {
			if last != nil {
				return nil, false
			}
			last = e
		}
	}
	if last == nil || last.from != s || last.to != t || last.sp == nil {
		return nil, false
	}
	return last.sp, true
}

// combine joins two parts, flattening nested nodes of the same kind. An empty
// part (nil) adds nothing: in series it takes no time, and in parallel with
// a module the module is the slower.
func combine(kind SPKind, a, b *SP) *SP {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	var parts []*SP
	for _, p := range []*SP{a, b} {
		if p.Kind == kind {
			parts = append(parts, p.Parts...)
		} else {
			parts = append(parts, p)
		}
	}
	return &SP{Kind: kind, Parts: parts}
}

// String renders the decomposition, e.g. a -> (b | c) -> d.
func (sp *SP) String() string {
	switch sp.Kind {
	case SPModule:
		return string(sp.Module)
	case SPSeries:
		s := ""
		for i, p := range sp.Parts {
			if i > 0 {
				s += " -> "
			}
			s += p.String()
		}
		return s
	default:
		s := "("
		for i, p := range sp.Parts {
			if i > 0 {
				s += " | "
			}
			s += p.String()
		}
		return s + ")"
	}
}
