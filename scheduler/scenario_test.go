package scheduler_test

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/scheduler"
)

var update = flag.Bool("update", false, "rewrite the expected output of the golden scenarios")

// A scenario file is a script; lines after "--- expect" are the expected log,
// rewritten with -update after review (raft-style). Commands:
//
//	policy NAME
//	gpus N
//	network CONTROL PER_REQUEST
//	model NAME alpha=D beta=D slo=D [maxbatch=N] [rate=R] [gpus=0,1]
//	arrive T MODEL [xN]        N requests at time T
//	run T                      tick at every wake-up the scheduler asks for, up to T
//	finish T GPU               the GPU's outstanding action completes at T (as profiled)
//	reject T GPU               the GPU rejects its outstanding action at T
//	finish T GPU took=D        ... completes at T, measured at D (not as profiled)
//	hold T GPU / unhold T GPU  Scheduler.Hold: the GPU out of service, and back
type scenario struct {
	t       *testing.T
	s       scheduler.Scheduler
	cfg     scheduler.Config
	policy  scheduler.Policy
	now     scheduler.Time
	nextID  uint64
	pending map[scheduler.GPUID]*scheduler.Action
	log     []string
}

func (sc *scenario) collect() {
	acts, drops := sc.s.Take()
	for _, a := range acts {
		ids := make([]string, len(a.Requests))
		for i, r := range a.Requests {
			ids[i] = fmt.Sprint(r.ID)
		}
		sc.log = append(sc.log, fmt.Sprintf("%v action %d gpu=%d model=%s batch=%d reqs=[%s] window=[%v, %v]",
			sc.now, a.ID, a.GPU, a.Model, len(a.Requests), strings.Join(ids, " "), a.Earliest, a.Latest))
		sc.pending[a.GPU] = a
	}
	for _, d := range drops {
		sc.log = append(sc.log, fmt.Sprintf("%v drop req=%d model=%s reason=%s", sc.now, d.Request.ID, d.Request.Model, d.Reason))
	}
}

func dur(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("bad duration %q", s)
	}
	return d
}

func (sc *scenario) build() {
	if sc.s != nil {
		return
	}
	s, err := scheduler.New(sc.policy, sc.cfg)
	if err != nil {
		sc.t.Fatal(err)
	}
	sc.s = s
}

func (sc *scenario) exec(line string) {
	f := strings.Fields(line)
	t := sc.t
	switch f[0] {
	case "policy":
		sc.policy = scheduler.Policy(f[1])
	case "gpus":
		n, _ := strconv.Atoi(f[1])
		for g := 0; g < n; g++ {
			sc.cfg.GPUs = append(sc.cfg.GPUs, scheduler.GPUID(g))
		}
	case "network":
		sc.cfg.Network = scheduler.Network{Control: dur(t, f[1]), PerRequest: dur(t, f[2])}
	case "model":
		m := scheduler.Model{ID: scheduler.ModelID(f[1])}
		var alpha, beta time.Duration
		maxBatch := 16
		for _, kv := range f[2:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "alpha":
				alpha = dur(t, v)
			case "beta":
				beta = dur(t, v)
			case "slo":
				m.SLO = dur(t, v)
			case "maxbatch":
				maxBatch, _ = strconv.Atoi(v)
			case "rate":
				m.Rate, _ = strconv.ParseFloat(v, 64)
			case "gpus":
				for _, g := range strings.Split(v, ",") {
					n, _ := strconv.Atoi(g)
					m.GPUs = append(m.GPUs, scheduler.GPUID(n))
				}
			}
		}
		m.Latency = scheduler.LinearLatency(alpha, beta, maxBatch)
		m.Beta = beta
		sc.cfg.Models = append(sc.cfg.Models, m)
	case "arrive":
		sc.build()
		at, n := dur(t, f[1]), 1
		if len(f) > 3 {
			n, _ = strconv.Atoi(strings.TrimPrefix(f[3], "x"))
		}
		sc.advance(at)
		var slo time.Duration
		for _, m := range sc.cfg.Models {
			if string(m.ID) == f[2] {
				slo = m.SLO
			}
		}
		for i := 0; i < n; i++ {
			sc.s.Arrive(sc.now, scheduler.Request{ID: sc.nextID, Model: scheduler.ModelID(f[2]), Arrival: sc.now, Deadline: sc.now + slo})
			sc.nextID++
			sc.collect()
		}
	case "run":
		sc.build()
		sc.advance(dur(t, f[1]))
	case "finish", "reject":
		sc.build()
		at := dur(t, f[1])
		g, _ := strconv.Atoi(f[2])
		sc.advance(at)
		a := sc.pending[scheduler.GPUID(g)]
		if a == nil {
			t.Fatalf("%s: no outstanding action on gpu %d", line, g)
		}
		delete(sc.pending, scheduler.GPUID(g))
		if f[0] == "finish" {
			took := a.Expected
			if len(f) > 3 {
				took = dur(t, strings.TrimPrefix(f[3], "took="))
			}
			sc.log = append(sc.log, fmt.Sprintf("%v finished action %d", sc.now, a.ID))
			sc.s.Finished(sc.now, a, took)
		} else {
			sc.log = append(sc.log, fmt.Sprintf("%v rejected action %d", sc.now, a.ID))
			sc.s.Rejected(sc.now, a)
		}
		sc.collect()
	case "hold", "unhold":
		sc.build()
		g, _ := strconv.Atoi(f[2])
		sc.advance(dur(t, f[1]))
		sc.log = append(sc.log, fmt.Sprintf("%v %s gpu=%d", sc.now, f[0], g))
		sc.s.Hold(sc.now, scheduler.GPUID(g), f[0] == "hold")
		sc.collect()
	default:
		t.Fatalf("unknown command %q", line)
	}
}

// advance ticks the scheduler at every wake-up it asks for up to t.
func (sc *scenario) advance(t scheduler.Time) {
	if t < sc.now {
		sc.t.Fatalf("time goes backwards: %v after %v", t, sc.now)
	}
	for next := sc.s.Next(); next <= t; next = sc.s.Next() {
		if next < sc.now {
			next = sc.now
		}
		sc.now = next
		sc.s.Tick(sc.now)
		sc.collect()
		if sc.s.Next() == next {
			break
		}
	}
	sc.now = t
}

func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/scenarios/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			script, expect, _ := strings.Cut(string(data), "--- expect\n")
			sc := &scenario{t: t, pending: map[scheduler.GPUID]*scheduler.Action{}}
			var header []string
			sn := bufio.NewScanner(strings.NewReader(script))
			for sn.Scan() {
				line := sn.Text()
				header = append(header, line)
				if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
					sc.exec(l)
				}
			}
			got := strings.Join(sc.log, "\n") + "\n"
			if *update {
				out := strings.Join(header, "\n") + "\n--- expect\n" + got
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if diff := cmp.Diff(expect, got); diff != "" {
				t.Errorf("scenario log differs (-want +got); review, then go test ./scheduler -update:\n%s", diff)
			}
		})
	}
}
