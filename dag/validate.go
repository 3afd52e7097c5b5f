package dag

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/mdag/mdag/internal/yamlx"
	"github.com/mdag/mdag/modules"
)

var (
	appNameRE    = regexp.MustCompile(`^[a-z0-9-]+$`)
	moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

// Validate checks the app and returns every problem found, each with the
// field path and, for loaded apps, file and line. It returns nil when the app
// is valid.
func (a *App) Validate() error { return a.validate(false).Err() }

// validate checks the app. With decodeFailed, the graph-wide checks (source,
// cycles, reachability) are skipped: fields that failed to decode would make
// them report noise.
func (a *App) validate(decodeFailed bool) yamlx.ErrorList {
	p := a.pos
	if p == nil {
		p = &yamlx.Positions{File: a.File}
	}
	var errs yamlx.ErrorList
	add := func(path, format string, args ...any) { errs = append(errs, p.Errorf(path, format, args...)) }

	switch {
	case a.Name == "":
		add("app", "required: the application name")
	case !appNameRE.MatchString(string(a.Name)):
		add("app", "name %q must match [a-z0-9-]+", a.Name)
	}
	if a.SLO <= 0 {
		if a.SLO == 0 {
			add("slo", "required: the end-to-end latency objective, e.g. 400ms")
		} else {
			add("slo", "must be positive, got %v", a.SLO)
		}
	}
	if a.Media != Video && a.Media != Audio {
		add("media", "must be video or audio, got %q", a.Media)
	}
	if a.FPS < 0 {
		add("fps", "must be positive, got %g", a.FPS)
	}
	switch {
	case a.Warm < 0 || a.Warm > MaxWarm:
		add("warm", "must be 0 to %d streams, got %d", MaxWarm, a.Warm)
	case a.Warm > 0 && a.FPS <= 0:
		add("warm", "needs fps: the rate each stream kept warm is planned at")
	}
	a.validateOutputs(add)
	a.validateClips(add)
	if len(a.Modules) == 0 {
		add("modules", "required: at least one module")
		return errs
	}

	index := map[ModuleID]int{}
	for i, m := range a.Modules {
		at := fmt.Sprintf("modules[%d]", i)
		switch {
		case m.Name == "":
			add(at+".name", "required")
		case m.Name == Source:
			add(at+".name", "%q is reserved for the client stream", Source)
		case !moduleNameRE.MatchString(string(m.Name)):
			add(at+".name", "name %q must match [A-Za-z0-9_-]+", m.Name)
		default:
			if j, dup := index[m.Name]; dup {
				add(at+".name", "duplicate module name %q (first defined at modules[%d])", m.Name, j)
			} else {
				index[m.Name] = i
			}
		}
		switch m.Kind {
		case GPU:
			if m.Model == "" {
				add(at+".model", "required for gpu modules: the model whose profiles apply")
			}
			if m.Op != "" {
				add(at+".op", "only cpu modules name an op; gpu modules name a model")
			}
		case CPU:
			if m.Model != "" {
				add(at+".model", "only gpu modules name a model; cpu modules name an op")
			}
			switch op, ok := modules.Lookup(modules.OpID(m.Op)); {
			case m.Op == "":
				add(at+".op", "required for cpu modules: one of %s", strings.Join(modules.Names(), ", "))
			case !ok:
				add(at+".op", "unknown op %q (known: %s)", m.Op, strings.Join(modules.Names(), ", "))
			default:
				// Decode as the worker will, so what validates also builds.
				_, perrs := op.Decode(m.Params)
				for _, pe := range perrs {
					add(at+".params."+pe.Key, "%s", pe.Msg)
				}
			}
		case "":
			add(at+".kind", "required: cpu or gpu")
		default:
			add(at+".kind", "must be cpu or gpu, got %q", m.Kind)
		}
		if m.Scale < 0 {
			add(at+".scale", "must be >= 0 (items emitted per input item), got %g", m.Scale)
		}
		if len(m.Inputs) == 0 {
			add(at+".inputs", "required: %q for the client stream, or names of modules", Source)
		}
	}

	seenSource, badRef := false, false
	for i, m := range a.Modules {
		seen := map[ModuleID]bool{}
		for j, in := range m.Inputs {
			at := fmt.Sprintf("modules[%d].inputs[%d]", i, j)
			switch {
			case seen[in]:
				add(at, "input %q listed twice", in)
			case in == Source:
				seenSource = true
			case in == m.Name:
				add(at, "cycle: %s -> %s (a module cannot consume its own output)", in, in)
			default:
				if _, ok := index[in]; !ok {
					add(at, "unknown module %q%s", in, closest(in, index))
					badRef = true
				}
			}
			seen[in] = true
		}
	}
	if decodeFailed {
		return errs
	}
	if !seenSource {
		add("modules", "no module reads %q: nothing would receive the client stream", Source)
		return errs
	}

	g := buildGraph(a)
	if len(g.sinks()) == 0 {
		add("modules", "no sink: every module feeds another, so no result leaves the graph")
	}
	if cyc := g.findCycle(); cyc != nil {
		names := make([]string, len(cyc))
		for i, n := range cyc {
			names[i] = string(g.names[n])
		}
		first := cyc[0]
		add(fmt.Sprintf("modules[%d].inputs", first), "cycle: %s", strings.Join(names, " -> "))
		return errs
	}
	reach := g.reachableFromSource()
	for v, name := range g.names {
		if !reach[v] && !badRef { // an unknown input already explains it
			add(fmt.Sprintf("modules[%d]", index[name]), "module %q is not reachable from %q", name, Source)
		}
	}
	return errs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// closest suggests a known module name that differs by a few edits.
func closest(name ModuleID, index map[ModuleID]int) string {
	names := make([]string, 0, len(index))
	for k := range index {
		names = append(names, string(k))
	}
	return yamlx.Suggest(string(name), names)
}

// MaxWarm bounds App.Warm: capacity for more streams than this, planned
// with none connected, is a typo rather than a policy.
const MaxWarm = 1000
