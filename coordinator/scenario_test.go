package coordinator

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mdag/mdag/allocator"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/scheduler"
)

// A scenario (testdata/scenarios/*.txt) is a script for the coordinator in
// the spirit of scheduler/testdata/scenarios: an embedded engine (in-process
// workers, emulated GPUs) on a fake clock, every step deterministic (see
// fakeRun), and expect lines checked where they stand. Times T are since
// the clock started (a whole second: window 1s holds the frames captured in
// [1s, 2s)); a command at T first runs the clock to T, firing every timer
// due on the way in order. '#' starts a comment. Commands:
//
//	config KEY=VALUE...        before deploy: lostafter, epoch, turnoff, window,
//	                           dispatch (durations), policy, method, headroom
//	limits TYPE=N...           before deploy: instances per worker type
//	                           (default 8 of every type in the profiles)
//	app <<YAML ... YAML        an app's YAML, inline (a heredoc)
//	profiles <<YAML ... YAML   its profiles' YAML
//	deploy [EXAMPLE]           deploy an example (examples/NAME), or the inline
//	                           app and profiles; the first deploy starts the engine
//	join T STREAM [APP]        a stream joins (APP: the last deployed); returns
//	                           once the session's first plan is applied
//	leave T STREAM             a stream leaves
//	frame T STREAM [OBJECTS]   a frame captured at T (sequence numbers count from
//	                           1 per stream); OBJECTS is its ground truth, e.g.
//	                           car,car,person: what an emulated detector finds
//	frames T STREAMS xN every D [OBJECTS]
//	                           N frames of each stream (a comma list) at T,
//	                           T+D, ...
//	lose T INSTANCE            the instance is lost (Engine.LostInstance)
//	slow T INSTANCE FACTOR     its emulated GPU runs FACTOR times slower
//	run T                      run the clock to T
//	dump                       log the engine's state (for writing a scenario)
//
// Expectations (counts are exact unless written with < or >):
//
//	expect frame STREAM SEQ[-SEQ] OUTCOME [MODULE REASON] [latency=D]
//	                           OUTCOME: finished, late, dropped (MODULE REASON:
//	                           where and why) or open (no outcome yet)
//	expect output STREAM SEQ [boxes=N] [labels=A,B] [counts=CLASS:N,...]
//	expect counts [sent=N] [finished=N] [late=N] [dropped=N] [open=N]
//	expect drops MODULE:REASON=N... | none     the session's drops, all of them
//	expect windows T... | none                 the complete windows, by start
//	expect window T [sent=N]... [rate=F]       the complete window starting at T
//	expect instances ID:STATE... | none        every instance, sorted by ID
//	expect outstanding ID=N...                 tasks in flight on an instance
//	expect replans KINDS...    | none          the re-plans recorded since the
//	                                           last such line, each as its kinds
//	                                           joined by '+'
//	expect triggers KIND=N...                  re-plan triggers so far, all kinds
//	expect items MODULE=N...                   items that entered a module so far
//	expect batches MODULE=N,N...               its GPU batch sizes, in order
//	expect scheddrops MODULE:REASON=N... | none  the GPU scheduler's drops
//	expect admitted F                          the share of frames the plan carries
//	expect degraded TEXT... | none             the session's degraded state says TEXT
func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/scenarios/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/scenarios")
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			steps, err := parseScenario(path)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Test(t, func(t *testing.T) {
				sc := &scenario{t: t, path: path, cfg: Config{Log: testLog(t)}, seq: map[string]uint64{}}
				for _, st := range steps {
					sc.step = st
					sc.exec()
				}
			})
		})
	}
}

// scenarioStep is one command of a scenario, with its heredoc body.
type scenarioStep struct {
	line   int
	fields []string
	body   string
}

// parseScenario reads a scenario file into its commands.
func parseScenario(path string) ([]scenarioStep, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseScript(path, string(data))
}

// parseScript splits a scenario's text into its commands: '#' starts a
// comment (not inside a heredoc), a command ending in <<WORD takes the
// lines up to one that is WORD as its body.
func parseScript(path, text string) ([]scenarioStep, error) {
	var steps []scenarioStep
	sn := bufio.NewScanner(strings.NewReader(text))
	n := 0
	for sn.Scan() {
		n++
		line := sn.Text()
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		st := scenarioStep{line: n, fields: f}
		if last := f[len(f)-1]; strings.HasPrefix(last, "<<") && len(last) > 2 {
			st.fields = f[:len(f)-1]
			end, start := last[2:], n
			var body strings.Builder
			closed := false
			for sn.Scan() {
				n++
				if strings.TrimSpace(sn.Text()) == end {
					closed = true
					break
				}
				body.WriteString(sn.Text() + "\n")
			}
			if !closed {
				return nil, fmt.Errorf("%s:%d: heredoc <<%s has no line %q to end it", path, start, end, end)
			}
			st.body = body.String()
		}
		steps = append(steps, st)
	}
	return steps, sn.Err()
}

// scenario is the state of one running script.
type scenario struct {
	t        *testing.T
	path     string
	step     scenarioStep
	cfg      Config
	limits   map[profile.WorkerTypeID]int
	appYAML  string
	profYAML string
	run      *fakeRun
	app      dag.AppID
	seq      map[string]uint64 // last frame sent per stream
	replans  int               // re-plans already checked by expect replans
}

// fail stops the scenario, saying where.
func (sc *scenario) fail(format string, args ...any) {
	sc.t.Helper()
	sc.t.Fatalf("%s:%d: %s: %s", sc.path, sc.step.line, strings.Join(sc.step.fields, " "), fmt.Sprintf(format, args...))
}

// args checks the command has between lo and hi arguments (hi < 0: any).
func (sc *scenario) args(lo, hi int) []string {
	sc.t.Helper()
	a := sc.step.fields[1:]
	switch {
	case hi < 0 && len(a) < lo:
		sc.fail("want at least %d arguments, got %d", lo, len(a))
	case hi >= 0 && (len(a) < lo || len(a) > hi):
		sc.fail("want %d to %d arguments, got %d", lo, hi, len(a))
	}
	return a
}

func (sc *scenario) dur(s string) time.Duration {
	sc.t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		sc.fail("bad duration %q", s)
	}
	return d
}

// at runs the clock to the command's time T (its first argument).
func (sc *scenario) at(s string) {
	sc.t.Helper()
	sc.engine().runTo(fakeStart.Add(sc.dur(s)))
}

// engine is the running engine; commands that need one fail before deploy.
func (sc *scenario) engine() *fakeRun {
	sc.t.Helper()
	if sc.run == nil {
		sc.fail("no engine yet: deploy first")
	}
	return sc.run
}

func (sc *scenario) exec() {
	sc.t.Helper()
	switch sc.step.fields[0] {
	case "config":
		sc.config()
	case "limits":
		if sc.run != nil {
			sc.fail("limits after the engine started")
		}
		sc.limits = map[profile.WorkerTypeID]int{}
		for _, kv := range sc.args(1, -1) {
			k, v, ok := strings.Cut(kv, "=")
			n, err := strconv.Atoi(v)
			if !ok || err != nil || n < 0 {
				sc.fail("%q: want TYPE=N", kv)
			}
			sc.limits[profile.WorkerTypeID(k)] = n
		}
	case "app", "profiles":
		sc.args(0, 0)
		if sc.step.body == "" {
			sc.fail("want a heredoc: %s <<YAML", sc.step.fields[0])
		}
		if sc.step.fields[0] == "app" {
			sc.appYAML = sc.step.body
		} else {
			sc.profYAML = sc.step.body
		}
	case "deploy":
		sc.deploy(sc.args(0, 1))
	case "join":
		a := sc.args(2, 3)
		sc.at(a[0])
		app := sc.app
		if len(a) == 3 {
			app = dag.AppID(a[2])
		}
		if err := sc.run.e.Join(app, a[1]); err != nil {
			sc.fail("%v", err)
		}
		sc.run.settle()
	case "leave":
		a := sc.args(2, 2)
		sc.at(a[0])
		if err := sc.run.e.Leave(a[1]); err != nil {
			sc.fail("%v", err)
		}
		sc.run.settle()
	case "frame":
		a := sc.args(2, 3)
		sc.at(a[0])
		objects := ""
		if len(a) == 3 {
			objects = a[2]
		}
		sc.frame(a[1], objects)
	case "frames":
		a := sc.args(5, 6)
		n, err := strconv.Atoi(strings.TrimPrefix(a[2], "x"))
		if err != nil || !strings.HasPrefix(a[2], "x") || n < 1 || a[3] != "every" {
			sc.fail("want frames T STREAMS xN every D [OBJECTS]")
		}
		from, every := sc.dur(a[0]), sc.dur(a[4])
		objects := ""
		if len(a) == 6 {
			objects = a[5]
		}
		for i := range n {
			sc.engine().runTo(fakeStart.Add(from + time.Duration(i)*every))
			for _, stream := range strings.Split(a[1], ",") {
				sc.frame(stream, objects)
			}
		}
	case "lose":
		a := sc.args(2, 2)
		sc.at(a[0])
		sc.run.e.LostInstance(a[1], "scenario: "+a[1]+" lost")
		sc.run.settle()
	case "slow":
		a := sc.args(3, 3)
		sc.at(a[0])
		f, err := strconv.ParseFloat(a[2], 64)
		if err != nil {
			sc.fail("bad factor %q", a[2])
		}
		em := sc.run.local.Emulated(a[1])
		if em == nil {
			sc.fail("no in-process instance %s", a[1])
		}
		em.SetSlowdown(f)
	case "run":
		sc.at(sc.args(1, 1)[0])
	case "dump":
		sc.dump()
	case "expect":
		sc.expect()
	default:
		sc.fail("unknown command")
	}
}

func (sc *scenario) config() {
	sc.t.Helper()
	if sc.run != nil {
		sc.fail("config after the engine started")
	}
	for _, kv := range sc.args(1, -1) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			sc.fail("%q: want KEY=VALUE", kv)
		}
		switch k {
		case "lostafter":
			sc.cfg.LostAfter = sc.dur(v)
		case "epoch":
			sc.cfg.Epoch = sc.dur(v)
		case "turnoff":
			sc.cfg.TurnOff = sc.dur(v)
		case "window":
			sc.cfg.Adapt.Window = sc.dur(v)
		case "dispatch":
			sc.cfg.DispatchDelay = sc.dur(v)
		case "policy":
			sc.cfg.Policy = scheduler.Policy(v)
		case "method":
			sc.cfg.Method = allocator.Method(v)
		case "headroom":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				sc.fail("bad headroom %q", v)
			}
			sc.cfg.Headroom = f
		default:
			sc.fail("unknown config key %q", k)
		}
	}
}

func (sc *scenario) deploy(a []string) {
	sc.t.Helper()
	var (
		app  *dag.App
		prof *profile.File
		err  error
	)
	if len(a) == 1 {
		app, prof, err = examples.Parse(a[0])
	} else {
		if sc.appYAML == "" || sc.profYAML == "" {
			sc.fail("no inline app and profiles (app <<YAML, profiles <<YAML) and no example named")
		}
		where := fmt.Sprintf("%s:%d", sc.path, sc.step.line)
		if app, err = dag.Parse(where+" (app)", []byte(sc.appYAML)); err == nil {
			prof, err = profile.Parse(where+" (profiles)", []byte(sc.profYAML))
		}
	}
	if err != nil {
		sc.fail("%v", err)
	}
	if sc.run == nil {
		limits := sc.limits
		if limits == nil {
			limits = map[profile.WorkerTypeID]int{}
			for _, w := range prof.Workers {
				limits[w.Type] = 8
			}
		}
		sc.run = startFake(sc.t, sc.cfg, limits)
	}
	if err := sc.run.e.Deploy(app, prof); err != nil {
		sc.fail("%v", err)
	}
	sc.app = app.Name
	sc.run.settle()
}

// frame ingests the stream's next frame, captured now, with one ground
// truth box per object (12 pixels apart on a small black frame).
func (sc *scenario) frame(stream, objects string) {
	sc.t.Helper()
	var truth []media.Box
	if objects != "" && objects != "-" {
		for i, class := range strings.Split(objects, ",") {
			truth = append(truth, media.Box{X: 4 + 12*i, Y: 4, W: 8, H: 8, Class: class, Score: 1})
		}
	}
	f := media.NewFrame(max(32, 12*len(truth)+8), 16)
	sc.seq[stream]++
	if err := sc.run.e.Ingest(stream, sc.seq[stream], sc.run.clk.Now(), f, truth); err != nil {
		sc.fail("%v", err)
	}
	sc.run.settle()
}

// session is the status of the last deployed app's session.
func (sc *scenario) session() SessionStatus {
	sc.t.Helper()
	for _, s := range sc.engine().e.Status().Sessions {
		if s.App == sc.app {
			return s
		}
	}
	sc.fail("no session %s", sc.app)
	return SessionStatus{}
}

func (sc *scenario) dump() {
	sc.t.Helper()
	r := sc.engine()
	st := r.e.Status()
	sc.t.Logf("%s:%d: dump at +%v", sc.path, sc.step.line, r.since())
	for _, s := range st.Sessions {
		sc.t.Logf("  session %s: %+v open %d drops %v admitted %v degraded %q", s.App, s.Total, s.Open, s.Drops, s.Admitted, s.Degraded)
		for _, w := range s.Windows {
			sc.t.Logf("    window +%v %+v rate %.3f drops %v", w.Start.Sub(fakeStart), w.Counts, w.FinishRate, w.Drops)
		}
		for _, m := range s.Modules {
			sc.t.Logf("    module %s budget %.3f ms instances %d", m.Module, m.BudgetMS, m.Instances)
		}
	}
	for _, in := range st.Instances {
		sc.t.Logf("  instance %s %s %s outstanding %d %v", in.ID, in.Type, in.State, in.Outstanding, in.Modules)
	}
	for _, p := range r.e.Replans() {
		sc.t.Logf("  replan %d +%v %v %q problems %v", p.N, p.At.Sub(fakeStart), p.Kinds, p.Trigger, p.Problems)
	}
	r.rec.mu.Lock()
	defer r.rec.mu.Unlock()
	keys := make([]frameKey, 0, len(r.rec.frames))
	for k := range r.rec.frames {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].stream != keys[j].stream {
			return keys[i].stream < keys[j].stream
		}
		return keys[i].seq < keys[j].seq
	})
	for _, k := range keys {
		f := r.rec.frames[k]
		sc.t.Logf("  frame %s %d %s %s %s latency %v at +%v counts %v", k.stream, k.seq, f.Outcome, f.Module, f.Reason, f.Latency, f.Finished.Sub(fakeStart), f.Counts)
	}
	for _, name := range keysOf(r.rec.mods) {
		m := r.rec.mods[name]
		sc.t.Logf("  module %s in %d batches %v scheduler drops %v", name, m.in, m.batches, m.drops)
	}
	sc.t.Logf("  triggers %v", r.rec.triggers)
}

// ---- expectations ----

func (sc *scenario) expect() {
	sc.t.Helper()
	a := sc.args(1, -1)
	r := sc.engine()
	r.settle()
	what, a := a[0], a[1:]
	switch what {
	case "frame":
		sc.expectFrame(a)
	case "output":
		sc.expectOutput(a)
	case "counts":
		s := sc.session()
		sc.numbers(a, map[string]float64{"sent": float64(s.Total.Sent), "finished": float64(s.Total.Finished),
			"late": float64(s.Total.Late), "dropped": float64(s.Total.Dropped), "open": float64(s.Open)})
	case "drops":
		got := map[string]int{}
		for k, n := range sc.session().Drops {
			mod, reason, _ := strings.Cut(k, ": ")
			got[mod+":"+reason] = int(n)
		}
		sc.exactMap(a, got)
	case "window":
		sc.expectWindow(a)
	case "windows":
		var got []string
		for _, w := range sc.session().Windows {
			got = append(got, w.Start.Sub(fakeStart).String())
		}
		if len(got) == 0 {
			got = []string{"none"}
		}
		if !slices.Equal(got, a) {
			sc.fail("complete windows %v", got)
		}
	case "instances":
		var got []string
		for _, in := range r.e.Status().Instances {
			got = append(got, in.ID+":"+in.State)
		}
		if len(got) == 0 {
			got = []string{"none"}
		}
		if !slices.Equal(got, a) {
			sc.fail("instances %v", got)
		}
	case "outstanding":
		got := map[string]float64{}
		for _, in := range r.e.Status().Instances {
			got[in.ID] = float64(in.Outstanding)
		}
		sc.numbers(a, got)
	case "replans":
		rs := r.e.Replans()
		var got []string
		for _, p := range rs[min(sc.replans, len(rs)):] {
			var kinds []string
			for _, k := range p.Kinds {
				kinds = append(kinds, string(k))
			}
			got = append(got, strings.Join(kinds, "+"))
		}
		sc.replans = len(rs)
		if len(got) == 0 {
			got = []string{"none"}
		}
		if !slices.Equal(got, a) {
			var which []string
			for _, p := range rs[max(0, len(rs)-len(got)):] {
				which = append(which, fmt.Sprintf("+%v %q", p.At.Sub(fakeStart), p.Trigger))
			}
			sc.fail("re-plans since the last check: %v (%s)", got, strings.Join(which, "; "))
		}
	case "triggers":
		got := map[string]int{}
		r.rec.mu.Lock()
		for k, n := range r.rec.triggers {
			got[string(k)] = n
		}
		r.rec.mu.Unlock()
		sc.exactMap(a, got)
	case "items":
		got := map[string]float64{}
		for _, kv := range a {
			k, _, _ := strings.Cut(kv, "=")
			got[k] = float64(r.rec.module(k).in)
		}
		sc.numbers(a, got)
	case "batches":
		for _, kv := range a {
			k, v, _ := strings.Cut(kv, "=")
			got := fmt.Sprint(r.rec.module(k).batches)
			want := "[" + strings.ReplaceAll(v, ",", " ") + "]"
			if got != want {
				sc.fail("%s batches %s", k, got)
			}
		}
	case "scheddrops":
		got := map[string]int{}
		r.rec.mu.Lock()
		for name, m := range r.rec.mods {
			for reason, n := range m.drops {
				got[name+":"+string(reason)] = n
			}
		}
		r.rec.mu.Unlock()
		sc.exactMap(a, got)
	case "admitted":
		if len(a) != 1 {
			sc.fail("want expect admitted F")
		}
		sc.numbers([]string{"admitted" + opPrefix(a[0])}, map[string]float64{"admitted": sc.session().Admitted})
	case "degraded":
		d := sc.session().Degraded
		want := strings.Join(a, " ")
		if want == "none" && d != "" || want != "none" && !strings.Contains(d, want) {
			sc.fail("degraded %q", d)
		}
	default:
		sc.fail("unknown expectation %q", what)
	}
}

// opPrefix turns a bare value (1, <1, >0.5) into the tail of KEY=VALUE,
// KEY<VALUE or KEY>VALUE.
func opPrefix(v string) string {
	if strings.HasPrefix(v, "<") || strings.HasPrefix(v, ">") {
		return v
	}
	return "=" + v
}

// numbers checks KEY=N, KEY<N or KEY>N against got.
func (sc *scenario) numbers(kvs []string, got map[string]float64) {
	sc.t.Helper()
	for _, kv := range kvs {
		i := strings.IndexAny(kv, "=<>")
		if i <= 0 {
			sc.fail("%q: want KEY=N, KEY<N or KEY>N", kv)
		}
		k, op := kv[:i], kv[i]
		want, err := strconv.ParseFloat(kv[i+1:], 64)
		if err != nil {
			sc.fail("%q: bad number", kv)
		}
		g, ok := got[k]
		if !ok {
			sc.fail("%q: unknown key %q (known: %v)", kv, k, keysOf(got))
		}
		if op == '=' && g != want || op == '<' && !(g < want) || op == '>' && !(g > want) {
			sc.fail("%s is %v, want %s", k, g, kv[i:])
		}
	}
}

// exactMap checks that got is exactly KEY=N... ("none": empty).
func (sc *scenario) exactMap(kvs []string, got map[string]int) {
	sc.t.Helper()
	want := map[string]int{}
	if !(len(kvs) == 1 && kvs[0] == "none") {
		for _, kv := range kvs {
			i := strings.LastIndex(kv, "=")
			n, err := strconv.Atoi(kv[i+1:])
			if i <= 0 || err != nil {
				sc.fail("%q: want KEY=N", kv)
			}
			want[kv[:i]] = n
		}
	}
	for k, v := range got {
		if v == 0 {
			delete(got, k)
		}
	}
	if fmt.Sprint(want) != fmt.Sprint(got) {
		sc.fail("got %v", got)
	}
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// seqs parses SEQ or FROM-TO.
func (sc *scenario) seqs(s string) (uint64, uint64) {
	sc.t.Helper()
	a, b, ranged := strings.Cut(s, "-")
	from, err1 := strconv.ParseUint(a, 10, 64)
	to, err2 := from, error(nil)
	if ranged {
		to, err2 = strconv.ParseUint(b, 10, 64)
	}
	if err1 != nil || err2 != nil || to < from {
		sc.fail("bad sequence numbers %q: want SEQ or FROM-TO", s)
	}
	return from, to
}

func (sc *scenario) expectFrame(a []string) {
	sc.t.Helper()
	if len(a) < 3 {
		sc.fail("want expect frame STREAM SEQ OUTCOME ...")
	}
	stream, outcome, rest := a[0], a[2], a[3:]
	from, to := sc.seqs(a[1])
	var latency time.Duration
	hasLatency := false
	if n := len(rest); n > 0 && strings.HasPrefix(rest[n-1], "latency=") {
		latency, hasLatency = sc.dur(strings.TrimPrefix(rest[n-1], "latency=")), true
		rest = rest[:n-1]
	}
	var module, reason string
	switch {
	case outcome == string(Dropped) && len(rest) == 2:
		module, reason = rest[0], rest[1]
	case len(rest) != 0:
		sc.fail("unexpected %v (only a drop names MODULE REASON)", rest)
	}
	for seq := from; seq <= to; seq++ {
		if seq > sc.seq[stream] {
			sc.fail("%s %d was never sent", stream, seq)
		}
		res, ok := sc.run.rec.result(stream, seq)
		desc := fmt.Sprintf("%s %d is open", stream, seq)
		if ok {
			desc = fmt.Sprintf("%s %d %s %s %s after %v", stream, seq, res.Outcome, res.Module, res.Reason, res.Latency)
		}
		switch {
		case outcome == "open":
			if ok {
				sc.fail("%s", desc)
			}
		case !ok || string(res.Outcome) != outcome,
			module != "" && (string(res.Module) != module || string(res.Reason) != reason),
			hasLatency && res.Latency != latency:
			sc.fail("%s", desc)
		}
	}
}

func (sc *scenario) expectOutput(a []string) {
	sc.t.Helper()
	if len(a) < 3 {
		sc.fail("want expect output STREAM SEQ [boxes=N] [labels=A,B] [counts=CLASS:N,...]")
	}
	from, _ := sc.seqs(a[1])
	res, ok := sc.run.rec.result(a[0], from)
	if !ok {
		sc.fail("%s %d has no outcome", a[0], from)
	}
	for _, kv := range a[2:] {
		k, v, _ := strings.Cut(kv, "=")
		var got string
		switch k {
		case "boxes":
			got = strconv.Itoa(len(res.Boxes))
		case "labels":
			l := slices.Clone(res.Labels)
			slices.Sort(l)
			got = strings.Join(l, ",")
		case "counts":
			var parts []string
			for _, c := range keysOf(res.Counts) {
				parts = append(parts, fmt.Sprintf("%s:%d", c, res.Counts[c]))
			}
			got = strings.Join(parts, ",")
		default:
			sc.fail("unknown output key %q", k)
		}
		if got != v {
			sc.fail("%s %d: %s=%s", a[0], from, k, got)
		}
	}
}

func (sc *scenario) expectWindow(a []string) {
	sc.t.Helper()
	if len(a) < 2 {
		sc.fail("want expect window T KEY=N...")
	}
	start := fakeStart.Add(sc.dur(a[0]))
	s := sc.session()
	var starts []string
	for _, w := range s.Windows {
		if w.Start.Equal(start) {
			sc.numbers(a[1:], map[string]float64{"sent": float64(w.Sent), "finished": float64(w.Finished), "late": float64(w.Late),
				"dropped": float64(w.Dropped), "open": float64(w.Open()), "rate": w.FinishRate})
			return
		}
		starts = append(starts, w.Start.Sub(fakeStart).String())
	}
	sc.fail("no complete window at %s (complete: %v)", a[0], starts)
}

func TestParseScript(t *testing.T) {
	tests := []struct {
		name, text string
		want       string // the steps as line:fields|body, or the error
	}{
		{"commands and comments", "# a scenario\njoin 0s cam  # a comment\n\n  run 1s\n",
			"[2:[join 0s cam]| 4:[run 1s]|]"},
		{"heredoc keeps its lines as they are", "app <<YAML\napp: x # not a comment\n  modules: []\nYAML\ndeploy\n",
			"[1:[app]|app: x # not a comment\n  modules: []\n 5:[deploy]|]"},
		{"unterminated heredoc", "join 0s cam\nprofiles <<END\nworkers: []\n",
			"s.txt:2: heredoc <<END has no line \"END\" to end it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			steps, err := parseScript("s.txt", tc.text)
			got := ""
			if err != nil {
				got = err.Error()
			} else {
				var parts []string
				for _, st := range steps {
					parts = append(parts, fmt.Sprintf("%d:%v|%s", st.line, st.fields, st.body))
				}
				got = fmt.Sprint(parts)
			}
			if got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}
