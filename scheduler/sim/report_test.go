package sim_test

import (
	"flag"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/mdag/mdag/scheduler"
	"github.com/mdag/mdag/scheduler/sim"
)

var report = flag.Bool("report", false, "print the goodput report (TestGoodputReport)")

// TestGoodputReport measures, side by side in one run, what
// docs/benchmarks.md records for the scheduler:
//
//	go test ./scheduler/sim -run TestGoodputReport -report -v -timeout 30m
func TestGoodputReport(t *testing.T) {
	if !*report {
		t.Skip("run with -report")
	}
	// Symphony Table 4, with hindsight beside the policies: the reference
	// that knows every arrival (not a policy; a practical ceiling for them
	// on the same arrivals).
	policies := []scheduler.Policy{scheduler.Symphony, scheduler.Clockwork, scheduler.Nexus, scheduler.Lazy, sim.Hindsight}
	t.Log("| model | staggered bound r/s | symphony | clockwork | nexus | lazy | hindsight (knows the future) |")
	t.Log("|---|---|---|---|---|---|---|")
	for _, row := range table4 {
		w := row.workload(t, "20s", 1, row.bound*0.8)
		line := fmt.Sprintf("| %s | %.0f |", row.name, row.bound)
		for _, p := range policies {
			r, err := sim.FindGoodput(w, p)
			if err != nil {
				t.Fatal(err)
			}
			line += fmt.Sprintf(" %.0f (%.1f%%, batch %.1f) |", r.GoodputRPS, 100*r.GoodputRPS/row.bound, r.MeanBatch)
		}
		t.Log(line)
	}
	// Mixed zoo: all 35 Table 5 models, Zipf 0.9, 64 GPUs; Poisson and Gamma(0.1).
	data, err := os.ReadFile("../../examples/sim/zoo-64gpu.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("")
	t.Log("| mixed zoo, 64 GPUs | symphony goodput r/s | clockwork goodput r/s | ratio |")
	t.Log("|---|---|---|---|")
	peaks := map[string]float64{}
	for _, arrival := range []string{"{kind: poisson}", "{kind: gamma, shape: 0.1}"} {
		doc := string(data)
		doc = replaceLine(doc, "arrival:", "arrival: "+arrival)
		doc = replaceLine(doc, "duration:", "duration: 5s")
		w := workload(t, doc)
		sym, err := sim.FindGoodput(w, scheduler.Symphony)
		if err != nil {
			t.Fatal(err)
		}
		cw, err := sim.FindGoodput(w, scheduler.Clockwork)
		if err != nil {
			t.Fatal(err)
		}
		peaks[arrival] = sym.GoodputRPS
		t.Logf("| %s | %.0f | %.0f | %.2fx |", arrival, sym.GoodputRPS, cw.GoodputRPS, sym.GoodputRPS/cw.GoodputRPS)
	}
	// Overload flat-top (Symphony Figure 10): offered 1.0-2.0x the peak.
	t.Log("")
	t.Log("| workload | offered / symphony peak | symphony goodput / peak | clockwork goodput / peak |")
	t.Log("|---|---|---|---|")
	flat := func(name string, w *sim.Workload, peak float64) {
		for _, x := range []float64{1.0, 1.25, 1.5, 2.0} {
			s, err := sim.Run(w, scheduler.Symphony, peak*x)
			if err != nil {
				t.Fatal(err)
			}
			c, err := sim.Run(w, scheduler.Clockwork, peak*x)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("| %s | %.2f | %.3f | %.3f |", name, x, s.GoodputRPS/peak, c.GoodputRPS/peak)
		}
	}
	r50 := workload(t, "gpus: 8\nduration: 20s\narrival: {kind: poisson}\nmodels:\n  - {name: resnet50, alpha: 1.053ms, beta: 5.072ms, slo: 25ms, rate: 5000}\n")
	p, err := sim.FindGoodput(r50, scheduler.Symphony)
	if err != nil {
		t.Fatal(err)
	}
	flat("ResNet50, 8 GPUs", r50, p.GoodputRPS)
	zoo := workload(t, replaceLine(string(data), "duration:", "duration: 5s"))
	flat("mixed zoo, 64 GPUs", zoo, peaks["{kind: poisson}"])
}

// table4Row is a row of Symphony Table 4: one model on 8 GPUs, Poisson
// arrivals, and its staggered-execution bound.
type table4Row struct {
	name             string
	alpha, beta, slo float64 // ms
	bound            float64 // r/s
}

var table4 = []table4Row{{"ResNet50", 1.053, 5.072, 25, 5839}, {"InceptionResNetV2", 5.090, 18.368, 70, 1083}}

func (row table4Row) workload(t *testing.T, duration string, seed int, rate float64) *sim.Workload {
	return workload(t, fmt.Sprintf("gpus: 8\nduration: %s\nseed: %d\narrival: {kind: poisson}\nmodels:\n"+
		"  - {name: %s, alpha: %gms, beta: %gms, slo: %gms, rate: %g}\n", duration, seed, row.name, row.alpha, row.beta, row.slo, rate))
}

// TestGoalRateReport checks issue 5's goal (symphony >= 94% of the
// staggered bound) where it is decided: at exactly 94% of the bound, on
// four 60 s traces per Table 4 row, is at most 1% of requests bad? It
// prints the symphony policy's bad rate beside what hindsight (width 256
// and, on InceptionResNetV2, 1024) reaches on the same arrivals.
//
//	go test ./scheduler/sim -run TestGoalRateReport -report -v -timeout 30m
func TestGoalRateReport(t *testing.T) {
	if !*report {
		t.Skip("run with -report")
	}
	defer func(w int) { sim.HindsightWidth = w }(sim.HindsightWidth)
	t.Log("| model | rate (94% of the bound) | seed | symphony bad | hindsight bad, width 256 | width 1024 |")
	t.Log("|---|---|---|---|---|---|")
	for _, row := range table4 {
		widths := []int{256}
		if row.name == "InceptionResNetV2" {
			widths = append(widths, 1024) // on ResNet50: about 4 min a trace
		}
		rate := math.Round(row.bound * 0.94)
		for seed := 1; seed <= 4; seed++ {
			w := row.workload(t, "60s", seed, rate)
			sy, err := sim.Run(w, scheduler.Symphony, 0)
			if err != nil {
				t.Fatal(err)
			}
			line := fmt.Sprintf("| %s | %.0f | %d | %.2f%% |", row.name, rate, seed, 100*sy.BadRate)
			for _, width := range widths {
				sim.HindsightWidth = width
				hs, err := sim.Run(w, sim.Hindsight, 0)
				if err != nil {
					t.Fatal(err)
				}
				if hs.Requests != sy.Requests {
					t.Fatalf("different traces: %d and %d requests", hs.Requests, sy.Requests)
				}
				line += fmt.Sprintf(" %.2f%% |", 100*hs.BadRate)
			}
			if len(widths) == 1 {
				line += " - |"
			}
			t.Log(line)
		}
	}
}

func replaceLine(doc, prefix, with string) string {
	out := ""
	for _, l := range splitLines(doc) {
		if len(l) >= len(prefix) && l[:len(prefix)] == prefix {
			l = with
		}
		out += l + "\n"
	}
	return out
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
