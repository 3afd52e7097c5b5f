package sim

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/scheduler"
)

// bruteForce is the most requests any schedule serves, found without the
// hindsight search's assumptions (consecutive batches, earliest starts):
// every way to group requests into batches or skip them, every order of
// the batches, each started as early as its requests and a GPU allow.
func bruteForce(p *hsProblem) int {
	n := len(p.arr)
	label := make([]int, n) // 0: skipped; batches numbered 1.. in first-use order
	best := 0
	var rec func(i, batches int)
	rec = func(i, batches int) {
		if i == n {
			if s := servedIfFeasible(p, label, batches); s > best {
				best = s
			}
			return
		}
		for l := 0; l <= batches+1; l++ {
			label[i] = l
			rec(i+1, max(batches, l))
		}
	}
	rec(0, 0)
	return best
}

func servedIfFeasible(p *hsProblem, label []int, batches int) int {
	type group struct {
		first, last scheduler.Time
		size        int
	}
	gs := make([]group, batches)
	served := 0
	for i, l := range label {
		if l == 0 {
			continue
		}
		g := &gs[l-1]
		if g.size == 0 {
			g.first = p.arr[i]
		}
		g.last, g.size = p.arr[i], g.size+1
		served++
	}
	for _, g := range gs {
		if g.size > len(p.lat) || g.last+p.net.Delay(g.size)+p.lat[g.size-1] > g.first+p.slo {
			return 0
		}
	}
	// Any order of the batches, each on the GPU that frees first.
	order := make([]int, batches)
	for i := range order {
		order[i] = i
	}
	var perm func(k int) bool
	perm = func(k int) bool {
		if k == len(order) {
			free := make([]scheduler.Time, p.gpus)
			for _, o := range order {
				g := gs[o]
				gi := 0
				for j := range free {
					if free[j] < free[gi] {
						gi = j
					}
				}
				end := max(g.last, free[gi]) + p.net.Delay(g.size) + p.lat[g.size-1]
				if end > g.first+p.slo {
					return false
				}
				free[gi] = end
			}
			return true
		}
		for j := k; j < len(order); j++ {
			order[k], order[j] = order[j], order[k]
			ok := perm(k + 1)
			order[k], order[j] = order[j], order[k]
			if ok {
				return true
			}
		}
		return false
	}
	if !perm(0) {
		return 0
	}
	return served
}

// TestHindsightOptimalOnSmallCases: on random small instances, a wide beam
// serves exactly as many requests as exhaustive search, and every schedule
// it returns passes the independent check (verify).
func TestHindsightOptimalOnSmallCases(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	constrained := 0 // cases where not every request can be served
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	for c := 0; c < 300; c++ {
		n := 3 + rng.IntN(6)
		p := &hsProblem{gpus: 1 + rng.IntN(2), width: 1 << 20, slo: ms(12 + 20*rng.Float64())}
		alpha, beta := 1+4*rng.Float64(), 2+8*rng.Float64()
		for b := 1; b <= 6; b++ {
			p.lat = append(p.lat, ms(beta+alpha*float64(b)))
		}
		if rng.IntN(3) == 0 {
			p.net = scheduler.Network{Control: ms(0.5), PerRequest: ms(0.2)}
		}
		p.dropCost = float64(ms(5))
		var t0 float64
		for range n {
			t0 += 3 * rng.ExpFloat64()
			p.arr = append(p.arr, scheduler.Time(ms(t0)))
		}
		bs, err := p.verify(p.solve())
		if err != nil {
			t.Fatalf("case %d: %v", c, err)
		}
		got := 0
		for _, b := range bs {
			got += b.size
		}
		want := bruteForce(p)
		if want < n {
			constrained++
		}
		if got != want {
			t.Fatalf("case %d (%d requests at %v, %d GPUs, SLO %v, l %v): hindsight serves %d, exhaustive search %d",
				c, n, p.arr, p.gpus, p.slo, p.lat, got, want)
		}
	}
	if constrained < 50 {
		t.Errorf("only %d of 300 cases force skips; the instances are too easy to test anything", constrained)
	}
	t.Logf("%d of 300 cases force skips", constrained)
}

// TestHindsightVerifyCatches: the independent check refuses broken
// schedules (so the test above can fail).
func TestHindsightVerifyCatches(t *testing.T) {
	ms := func(x float64) scheduler.Time { return scheduler.Time(x * float64(time.Millisecond)) }
	p := &hsProblem{gpus: 1, slo: 20 * time.Millisecond, lat: []time.Duration{10 * time.Millisecond, 12 * time.Millisecond},
		arr: []scheduler.Time{0, ms(1), ms(2)}}
	for name, last := range map[string]*hsBatch{
		"early start": {first: 0, size: 2, start: 0},
		"overlap":     {prev: &hsBatch{first: 0, size: 2, start: ms(1)}, first: 1, size: 1, start: ms(13)},
		"GPU busy":    {prev: &hsBatch{first: 0, size: 1, start: 0}, first: 1, size: 1, start: ms(5)},
		"late":        {first: 0, size: 1, start: ms(11)},
	} {
		if _, err := p.verify(last); err == nil {
			t.Errorf("%s: verify accepted it", name)
		}
	}
}

// TestHindsightBeatsOnline: knowing the future, the reference serves at
// least what the symphony policy serves on the same arrivals, with the
// same request count (the same trace).
func TestHindsightBeatsOnline(t *testing.T) {
	w, err := ParseWorkload("w.yaml", []byte("gpus: 8\nduration: 4s\narrival: {kind: poisson}\nmodels:\n"+
		"  - {name: inceptionresnetv2, alpha: 5.090ms, beta: 18.368ms, slo: 70ms, rate: 1030}\n"))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := Run(w, Hindsight, 0)
	if err != nil {
		t.Fatal(err)
	}
	sym, err := Run(w, scheduler.Symphony, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hindsight good %d / %d (batch %.2f, busy %.3f); symphony good %d / %d", hs.Good, hs.Requests, hs.MeanBatch,
		hs.GPUBusyFraction, sym.Good, sym.Requests)
	if hs.Requests != sym.Requests || hs.Good < sym.Good || hs.Late != 0 {
		t.Errorf("hindsight %d good of %d (%d late), symphony %d of %d", hs.Good, hs.Requests, hs.Late, sym.Good, sym.Requests)
	}
	if hs.BadRate > 0 && hs.Autoscale.WorstWindowBadRate < hs.BadRate {
		t.Errorf("worst 1 s window bad rate %.4f below the run's %.4f", hs.Autoscale.WorstWindowBadRate, hs.BadRate)
	}
	if hs.Good+hs.Dropped["skipped"] != hs.Requests {
		t.Errorf("accounting: %d good + %d skipped != %d requests", hs.Good, hs.Dropped["skipped"], hs.Requests)
	}
}

func TestHindsightErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"gpus: 2\nmodels:\n  - {name: a, alpha: 1ms, beta: 1ms, slo: 20ms, rate: 10}\n  - {name: b, alpha: 1ms, beta: 1ms, slo: 20ms, rate: 10}\n", "single-model"},
		{"gpus: 2\njitter: 0.1\nmodels:\n  - {name: a, alpha: 1ms, beta: 1ms, slo: 20ms, rate: 10}\n", "jitter"},
	} {
		w, err := ParseWorkload("w.yaml", []byte(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(w, Hindsight, 0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error about %q", err, c.want)
		}
	}
}

// TestHindsightGapReport measures what docs/benchmarks.md says about the
// symphony policy against hindsight on InceptionResNetV2 (8 GPUs, Poisson):
// hindsight's goodput against its beam width, and where, on one 60 s trace
// at 1018 r/s, the two lose requests (windows of 500 requests) and which
// batch sizes serve them.
//
//	go test ./scheduler/sim -run TestHindsightGapReport -report -v -timeout 30m
func TestHindsightGapReport(t *testing.T) {
	if f := flag.Lookup("report"); f == nil || f.Value.String() != "true" {
		t.Skip("run with -report")
	}
	doc := func(dur string, rate float64) *Workload {
		w, err := ParseWorkload("w.yaml", []byte(fmt.Sprintf("gpus: 8\nduration: %s\narrival: {kind: poisson}\nmodels:\n"+
			"  - {name: inceptionresnetv2, alpha: 5.090ms, beta: 18.368ms, slo: 70ms, rate: %g}\n", dur, rate)))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	defer func(w int) { HindsightWidth = w }(HindsightWidth)
	for _, width := range []int{64, 256, 1024} {
		HindsightWidth = width
		r, err := FindGoodput(doc("20s", 1083*0.8), Hindsight) // as TestGoodputReport
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("hindsight width %d: goodput %.0f r/s (%.1f%% of 1083)", width, r.GoodputRPS, 100*r.GoodputRPS/1083)
	}
	HindsightWidth = 256
	w := doc("60s", 1018)
	_, hs, err := run(w, Hindsight, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, sy, err := run(w, scheduler.Symphony, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != len(sy) {
		t.Fatalf("different traces: %d and %d requests", len(hs), len(sy))
	}
	const win = 500
	var hsBad, syBad, syInShared, shared int
	burst, calm := [2]map[int]int{{}, {}}, [2]map[int]int{{}, {}} // [hindsight, symphony]: batch size -> requests
	for i := 0; i < len(hs); i += win {
		end := min(len(hs), i+win)
		h, s := 0, 0
		for j := i; j < end; j++ {
			if !hs[j].good {
				h++
			}
			if !sy[j].good {
				s++
			}
		}
		hsBad, syBad = hsBad+h, syBad+s
		if h > 0 && s > 0 {
			shared++
			syInShared += s
		}
		into := calm
		if h >= 5 {
			into = burst
		}
		for j := i; j < end; j++ {
			into[0][hs[j].batch]++
			into[1][sy[j].batch]++
		}
	}
	t.Logf("1018 r/s, 60 s: bad hindsight %d, symphony %d; %d of symphony's fall in the %d windows of %d requests where hindsight also skips",
		hsBad, syBad, syInShared, shared, win)
	t.Logf("requests by batch size (0: not served), windows where hindsight skips >= 5: hindsight %v, symphony %v", burst[0], burst[1])
	t.Logf("other windows: hindsight %v, symphony %v", calm[0], calm[1])
}
