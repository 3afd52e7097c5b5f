package squishy_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/mdag/mdag/placement/squishy"
)

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// table2 is Nexus Table 2: batch -> latency (ms) of models A, B and C.
func table2(name string, slo time.Duration, rate float64) squishy.Session {
	lat := map[string][]float64{"A": {50, 75, 100}, "B": {50, 90, 125}, "C": {60, 95, 125}}[name]
	p := squishy.BatchProfile{Batches: []int{4, 8, 16}}
	for _, l := range lat {
		p.Latency = append(p.Latency, ms(l))
	}
	return squishy.Session{ID: name, Model: name, SLO: slo, Rate: rate, Profile: p}
}

func describeGPUs(gpus []squishy.GPU) []string {
	var out []string
	for _, g := range gpus {
		var parts []string
		for _, a := range g.Sessions {
			parts = append(parts, fmt.Sprintf("%s b%d", a.Session, a.Batch))
		}
		out = append(out, fmt.Sprintf("{%s, duty %v}", strings.Join(parts, ", "), g.DutyCycle))
	}
	return out
}

// TestNexusTable2: A 64 r/s SLO 200 ms, B 32 r/s 250 ms, C 32 r/s 250 ms pack
// onto 2 GPUs: {A batch 8, B batch 4, duty cycle 125 ms} and {C}.
func TestNexusTable2(t *testing.T) {
	res := squishy.Pack([]squishy.Session{
		table2("A", 200*time.Millisecond, 64), table2("B", 250*time.Millisecond, 32), table2("C", 250*time.Millisecond, 32),
	}, squishy.PackOptions{})
	want := []string{"{A b8, B b4, duty 125ms}", "{C b4, duty 125ms}"}
	if diff := cmp.Diff(want, describeGPUs(res.GPUs)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if g := res.GPUs[0]; g.Occupancy != 1 || g.Sessions[1].Worst != 175*time.Millisecond {
		t.Errorf("GPU 0 occupancy %v, B worst %v; want 1 and 175ms (Nexus: 125 + 50)", g.Occupancy, g.Sessions[1].Worst)
	}
	// High rates: A at 2 x 160 r/s saturates two GPUs at batch 16 (2 x 100 ms <= 200 ms).
	res = squishy.Pack([]squishy.Session{table2("A", 200*time.Millisecond, 320)}, squishy.PackOptions{})
	if diff := cmp.Diff([]string{"{A b16, duty 100ms}", "{A b16, duty 100ms}"}, describeGPUs(res.GPUs)); diff != "" || !res.GPUs[0].Saturated {
		t.Errorf("saturated: %s", diff)
	}
	if math.Abs(res.Efficiency-1) > 1e-9 {
		t.Errorf("efficiency %v, want 1", res.Efficiency)
	}
}

// TestTooSlowProfile: a profile whose smallest batch misses the SLO is a
// clear per-session error (a real Nexus crash, uwsampl/nexus#21); the other
// sessions are still packed.
func TestTooSlowProfile(t *testing.T) {
	res := squishy.Pack([]squishy.Session{
		table2("A", 80*time.Millisecond, 10), table2("B", 250*time.Millisecond, 32),
	}, squishy.PackOptions{})
	if len(res.Unschedulable) != 1 || res.Unschedulable[0].Session != "A" ||
		!strings.Contains(res.Unschedulable[0].Reason, "profile too slow for the SLO: even batch 4 takes 50ms, and 2 x 50ms > 80ms") {
		t.Errorf("unschedulable %+v", res.Unschedulable)
	}
	if len(res.GPUs) != 1 || res.GPUs[0].Sessions[0].Session != "B" {
		t.Errorf("gpus %v", describeGPUs(res.GPUs))
	}
}

func TestMemoryLimit(t *testing.T) {
	a, b := table2("A", 200*time.Millisecond, 64), table2("B", 250*time.Millisecond, 32)
	a.Memory, b.Memory = 6<<30, 6<<30
	res := squishy.Pack([]squishy.Session{a, b}, squishy.PackOptions{GPUMemory: 8 << 30})
	if len(res.GPUs) != 2 {
		t.Errorf("A and B fit in time but not in 8 GiB together: %v", describeGPUs(res.GPUs))
	}
}

func genSessions(t *rapid.T) []squishy.Session {
	var out []squishy.Session
	for i := 0; i < rapid.IntRange(1, 12).Draw(t, "sessions"); i++ {
		alpha := ms(rapid.Float64Range(0.2, 5).Draw(t, "alpha"))
		beta := ms(rapid.Float64Range(1, 20).Draw(t, "beta"))
		slo := ms(rapid.Float64Range(20, 300).Draw(t, "slo"))
		out = append(out, squishy.Session{ID: fmt.Sprint("s", i), Model: fmt.Sprint("m", i), SLO: slo,
			Rate: rapid.Float64Range(1, 2000).Draw(t, "rate"), Profile: squishy.LinearProfile(alpha, beta, 64),
			Memory: 1 << 30})
	}
	return out
}

// TestPackProperties: every placed session's rate is met, no shared GPU's
// batches exceed its duty cycle, every worst latency is within the SLO,
// memory holds, the result is deterministic, and repacking an unchanged
// input moves nothing.
func TestPackProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sessions := genSessions(t)
		opt := squishy.PackOptions{GPUMemory: 4 << 30}
		res := squishy.Pack(sessions, opt)
		bad := map[string]bool{}
		for _, u := range res.Unschedulable {
			bad[u.Session] = true
		}
		carried := map[string]float64{}
		for _, g := range res.GPUs {
			var sum time.Duration
			var mem int64
			for _, a := range g.Sessions {
				sum += a.Latency
				mem += 1 << 30
				carried[a.Session] += float64(a.Batch) / g.DutyCycle.Seconds() // saturated: b / l(b)
				var slo time.Duration
				for _, s := range sessions {
					if s.ID == a.Session {
						slo = s.SLO
					}
				}
				if a.Worst > slo {
					t.Fatalf("GPU %d: %s worst %v over SLO %v", g.ID, a.Session, a.Worst, slo)
				}
			}
			if !g.Saturated && sum > g.DutyCycle {
				t.Fatalf("GPU %d: batches take %v, duty cycle %v", g.ID, sum, g.DutyCycle)
			}
			if mem > 4<<30 {
				t.Fatalf("GPU %d over memory", g.ID)
			}
		}
		for _, s := range sessions {
			if !bad[s.ID] && carried[s.ID] < s.Rate*(1-1e-6) {
				t.Fatalf("%s: carried %v of %v", s.ID, carried[s.ID], s.Rate)
			}
		}
		if diff := cmp.Diff(res, squishy.Pack(sessions, opt)); diff != "" {
			t.Fatalf("not deterministic: %s", diff)
		}
		again := squishy.Repack(res.GPUs, sessions, opt)
		if again.Moves != 0 || len(again.GPUs) != len(res.GPUs) {
			t.Fatalf("repack of an unchanged input: %d moves, %d GPUs (was %d)", again.Moves, len(again.GPUs), len(res.GPUs))
		}
	})
}

// TestRepack: when the load falls, the least used GPUs are emptied; when it
// rises past a GPU's capacity, sessions are evicted and re-packed; the
// number of moves is reported.
func TestRepack(t *testing.T) {
	sessions := []squishy.Session{
		table2("A", 200*time.Millisecond, 64), table2("B", 250*time.Millisecond, 32), table2("C", 250*time.Millisecond, 32),
	}
	first := squishy.Pack(sessions, squishy.PackOptions{})
	// Load falls: three sessions on three GPUs at 500 r/s fit one at 50 r/s.
	linear := func(rate float64) []squishy.Session {
		var out []squishy.Session
		for _, id := range []string{"x", "y", "z"} {
			out = append(out, squishy.Session{ID: id, Model: id, SLO: 100 * time.Millisecond, Rate: rate,
				Profile: squishy.LinearProfile(time.Millisecond, 5*time.Millisecond, 64)})
		}
		return out
	}
	busy := squishy.Pack(linear(500), squishy.PackOptions{})
	res := squishy.Repack(busy.GPUs, linear(50), squishy.PackOptions{})
	if len(busy.GPUs) != 3 || len(res.GPUs) != 1 || res.Moves != 4 {
		t.Errorf("load fell: %v -> %v (moves %d), want 3 GPUs -> 1 with 2 sessions moved and 2 GPUs released",
			describeGPUs(busy.GPUs), describeGPUs(res.GPUs), res.Moves)
	}
	// Load rises: B triples; A's GPU can no longer hold it.
	high := []squishy.Session{
		table2("A", 200*time.Millisecond, 64), table2("B", 250*time.Millisecond, 96), table2("C", 250*time.Millisecond, 32),
	}
	res = squishy.Repack(first.GPUs, high, squishy.PackOptions{})
	t.Logf("load rose: %v -> %v (moves %d)", describeGPUs(first.GPUs), describeGPUs(res.GPUs), res.Moves)
	for _, g := range res.GPUs {
		var sum time.Duration
		for _, a := range g.Sessions {
			sum += a.Latency
		}
		if !g.Saturated && sum > g.DutyCycle {
			t.Errorf("GPU %d overloaded after repack", g.ID)
		}
	}
	if res.GPUs[0].ID != 0 || res.GPUs[0].Sessions[0].Session != "A" {
		t.Errorf("A should stay on GPU 0: %v", describeGPUs(res.GPUs))
	}
}
