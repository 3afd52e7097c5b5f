package sim_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/scheduler/sim"
)

func workload(t testing.TB, doc string) *sim.Workload {
	t.Helper()
	w, err := sim.ParseWorkload("w.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestSymphonyTable4 is Symphony Table 4's first row: ResNet50 (alpha 1.053
// ms, beta 5.072 ms, SLO 25 ms) on 8 GPUs with uniform arrivals near the
// staggered throughput. Symphony's coordinated batches approach the
// staggered analytical size (16); Nexus's uncoordinated GPUs run at most the
// uncoordinated one (7).
func TestSymphonyTable4(t *testing.T) {
	w := workload(t, `gpus: 8
duration: 5s
arrival: {kind: uniform}
models:
  - {name: resnet50, alpha: 1.053ms, beta: 5.072ms, slo: 25ms, rate: 5500}
`)
	sym, err := sim.Run(w, scheduler.Symphony, 0)
	if err != nil {
		t.Fatal(err)
	}
	nex, err := sim.Run(w, scheduler.Nexus, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("symphony mean batch %.2f (bad %.4f), nexus %.2f (bad %.4f)", sym.MeanBatch, sym.BadRate, nex.MeanBatch, nex.BadRate)
	if sym.MeanBatch < 14 || sym.MeanBatch > 17 {
		t.Errorf("symphony mean batch %.2f, want close to the staggered 16", sym.MeanBatch)
	}
	if nex.MeanBatch < 5 || nex.MeanBatch > 7.01 {
		t.Errorf("nexus mean batch %.2f, want close to the uncoordinated 7", nex.MeanBatch)
	}
	if sym.BadRate > 0.01 {
		t.Errorf("symphony bad rate %.4f at 94%% of the staggered bound", sym.BadRate)
	}
}

// TestDeterminism: the same seed gives identical JSON; another seed differs.
func TestDeterminism(t *testing.T) {
	doc := `gpus: 4
duration: 3s
seed: 7
arrival: {kind: gamma, shape: 0.3}
jitter: 0.05
zipf: 0.9
rate: 3000
models:
  - {name: a, alpha: 1.053ms, beta: 5.072ms, slo: 25ms}
  - {name: b, alpha: 2.050ms, beta: 5.378ms, slo: 27ms}
  - {name: c, alpha: 0.335ms, beta: 5.350ms, slo: 20ms}
`
	for _, p := range scheduler.Policies {
		run := func(d string) string {
			r, err := sim.Run(workload(t, d), p, 0)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(r)
			return string(b)
		}
		a, b := run(doc), run(doc)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Errorf("%s: same seed, different results:\n%s", p, diff)
		}
		if run(strings.Replace(doc, "seed: 7", "seed: 8", 1)) == a {
			t.Errorf("%s: different seeds, identical results", p)
		}
	}
}

// TestAccounting: every request is good, late or dropped, for every policy
// and arrival process, including a trace.
func TestAccounting(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/trace.csv", []byte("minute,count\n0,60000\n1,120000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arrival := range []string{"{kind: uniform}", "{kind: poisson}", "{kind: gamma, shape: 0.1}", "{kind: trace, file: trace.csv}"} {
		doc := `gpus: 2
duration: 2s
arrival: ` + arrival + `
network: {control: 100us, per_request: 20us}
models:
  - {name: a, alpha: 1.053ms, beta: 5.072ms, slo: 25ms, rate: 1500}
  - {name: b, alpha: 5.090ms, beta: 18.368ms, slo: 70ms, rate: 300}
`
		w, err := sim.ParseWorkload(dir+"/w.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range scheduler.Policies {
			r, err := sim.Run(w, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			dropped := 0
			for _, n := range r.Dropped {
				dropped += n
			}
			if r.Requests == 0 || r.Good+r.Late+dropped != r.Requests {
				t.Errorf("%s %s: %d requests, %d good + %d late + %d dropped", arrival, p, r.Requests, r.Good, r.Late, dropped)
			}
		}
	}
}

// TestFindGoodput: the search lands where the bad rate crosses 1%.
func TestFindGoodput(t *testing.T) {
	w := workload(t, `gpus: 2
duration: 5s
arrival: {kind: poisson}
models:
  - {name: a, alpha: 1.053ms, beta: 5.072ms, slo: 25ms, rate: 500}
`)
	r, err := sim.FindGoodput(w, scheduler.Symphony)
	if err != nil {
		t.Fatal(err)
	}
	// 2 GPUs at the staggered batch (l(b) (1 + 1/2) <= 25 ms: b = 11) carry
	// at most 2 x 11 / 16.65 ms = 1321 r/s.
	if r.GoodputRPS < 800 || r.GoodputRPS > 1321 || r.BadRate > 0.01 {
		t.Errorf("goodput %.0f r/s (bad %.4f), want within the staggered bound 1321", r.GoodputRPS, r.BadRate)
	}
	above, _ := sim.Run(w, scheduler.Symphony, r.GoodputRPS*1.05)
	if above.BadRate <= 0.01 {
		t.Errorf("5%% above the goodput the bad rate is %.4f, want > 1%%", above.BadRate)
	}
}

func TestAdvice(t *testing.T) {
	add, rel := sim.Advice(8, 0.2, 0.25, 0.01)
	if add != 2 || rel != 2 {
		t.Errorf("Advice(8, 0.2, 0.25) = %d, %d; want 2 (8 x 0.2/0.8) and 2 (8 x 0.25)", add, rel)
	}
	if add, _ := sim.Advice(8, 0.005, 0, 0.01); add != 0 {
		t.Errorf("below threshold: add %d", add)
	}
}

func TestWorkloadErrors(t *testing.T) {
	_, err := sim.ParseWorkload("w.yaml", []byte(`gpus: 0
duration: -1s
arrival: {kind: bursty}
jitter: 2
models:
  - {name: a, slo: 0s, rate: 5, share: 0.5}
  - {name: a, alpha: 1ms, beta: 1ms, profile: p.yaml, slo: 1s}
`))
	want := []string{
		"w.yaml:1: gpus: must be in 1..100000, got 0",
		"w.yaml:2: duration: must be in (0, 24h], got -1s",
		`w.yaml:3: arrival.kind: must be uniform, poisson, gamma or trace, got "bursty"`,
		"w.yaml:4: jitter: must be in [0, 1), got 2",
		"w.yaml:6: models[0]: give rate (requests/s) or share (of the total), not both, and neither negative",
		"w.yaml:6: models[0]: needs a latency profile: alpha > 0 and beta >= 0, or profile and worker",
		"w.yaml:6: models[0].slo: required: a positive latency objective",
		"w.yaml:7: models[1]: give alpha and beta, or profile and worker, not both",
		`w.yaml:7: models[1].name: required and unique, got "a"`,
	}
	if err == nil {
		t.Fatal("accepted")
	}
	if diff := cmp.Diff(want, strings.Split(err.Error(), "\n")); diff != "" {
		t.Error(diff)
	}
}

// FuzzParseWorkload: the loader never panics, and what it accepts runs.
func FuzzParseWorkload(f *testing.F) {
	for _, p := range []string{"../../examples/sim/resnet50-8gpu.yaml"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := sim.ParseWorkload("fuzz.yaml", data)
		if err != nil || w.GPUs > 16 || w.Duration > time.Second || len(w.Models) > 4 {
			return
		}
		for _, m := range w.Models {
			if m.Rate > 5000 || m.Share > 1 {
				return
			}
		}
		if w.Rate > 5000 {
			return
		}
		if _, err := sim.Run(w, scheduler.Symphony, 0); err != nil {
			return
		}
	})
}
