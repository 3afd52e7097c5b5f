package partition_test

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mdag/mdag/placement/partition"
	"github.com/mdag/mdag/profile"
)

// symphonyTable1 is Symphony Table 1: static and dynamic memory (MB) on 1080Ti.
var symphonyTable1 = []struct {
	name            string
	static, dynamic int64
}{
	{"DenseNet121", 99, 2172}, {"EfficientNet", 88, 1519}, {"InceptionV3", 230, 3386},
	{"MobileNet", 84, 2653}, {"ResNet50", 170, 2798}, {"VGG16", 822, 6200},
}

// zooModels makes n models cycling through Table 1 with rates 100, 200, ...
func zooModels(n int) []partition.Model {
	var out []partition.Model
	for i := 0; i < n; i++ {
		z := symphonyTable1[i%len(symphonyTable1)]
		out = append(out, partition.Model{Name: fmt.Sprintf("%s-%d", z.name, i/len(symphonyTable1)),
			Rate: float64(100 * (1 + i%7)), Static: profile.Bytes(z.static << 20), Dynamic: profile.Bytes(z.dynamic << 20), Current: -1})
	}
	return out
}

func checkLimits(t *testing.T, req partition.Request, p partition.Result) {
	t.Helper()
	if len(p.Assign) != len(req.Models) {
		t.Fatalf("%s: %d assignments for %d models", p.Method, len(p.Assign), len(req.Models))
	}
	rate := make([]float64, req.SubClusters)
	mem := make([]float64, req.SubClusters)
	dyn := make([]float64, req.SubClusters)
	for i, m := range req.Models {
		j := p.Assign[i]
		rate[j] += m.Rate
		mem[j] += float64(m.Static) / (1 << 20)
		dyn[j] = math.Max(dyn[j], float64(m.Dynamic)/(1<<20))
	}
	for j := range rate {
		if req.MaxRate > 0 && rate[j] > req.MaxRate+1e-6 {
			t.Errorf("%s: sub-cluster %d rate %v over %v", p.Method, j, rate[j], req.MaxRate)
		}
		if req.MaxMemory > 0 && mem[j]+dyn[j] > float64(req.MaxMemory)/(1<<20)+1e-6 {
			t.Errorf("%s: sub-cluster %d memory %v over %v MiB", p.Method, j, mem[j]+dyn[j], req.MaxMemory>>20)
		}
	}
}

func TestPartitionMILPBeatsRandom(t *testing.T) {
	req := partition.Request{Models: zooModels(18), SubClusters: 3, MaxRate: 2500, MaxMemory: 16 << 30,
		MaxMoveCost: -1, TimeLimit: 5 * time.Second, Seed: 1}
	milp, err := partition.MILP(req)
	if err != nil {
		t.Fatal(err)
	}
	rnd, err := partition.Random(req, 20000)
	if err != nil {
		t.Fatal(err)
	}
	if !milp.Feasible || !rnd.Feasible {
		t.Fatalf("milp %+v\nrandom %+v", milp, rnd)
	}
	checkLimits(t, req, milp)
	checkLimits(t, req, rnd)
	greedy, _ := partition.Greedy(req)
	checkLimits(t, req, greedy)
	if milp.Objective > rnd.Objective+1e-6 || milp.Objective > greedy.Objective+1e-6 {
		t.Errorf("milp objective %v worse than random %v or greedy %v", milp.Objective, rnd.Objective, greedy.Objective)
	}
	t.Logf("milp %s objective %.2f (rate imbalance %.3f, memory %.3f); random objective %.2f (%.3f, %.3f) after %d tries",
		milp.Status, milp.Objective, milp.RateImbal, milp.MemImbal, rnd.Objective, rnd.RateImbal, rnd.MemImbal, rnd.Iterations)
}

// TestPartitionMoveBound: with no re-partitioning allowed the current
// assignment stays; with a budget of one move at most one model moves.
func TestPartitionMoveBound(t *testing.T) {
	models := zooModels(9)
	for i := range models {
		models[i].Current = 0 // all on sub-cluster 0: badly balanced
	}
	req := partition.Request{Models: models, SubClusters: 3, MaxMoveCost: 0, TimeLimit: 5 * time.Second}
	p, err := partition.MILP(req)
	if err != nil || !p.Feasible {
		t.Fatalf("%v %+v", err, p)
	}
	for i, j := range p.Assign {
		if j != 0 {
			t.Errorf("model %d moved to %d with no move budget", i, j)
		}
	}
	req.MaxMoveCost = 2 // one unload + one load
	p, _ = partition.MILP(req)
	moved := 0
	for _, j := range p.Assign {
		if j != 0 {
			moved++
		}
	}
	if moved != 1 || p.MoveCost != 2 {
		t.Errorf("budget 2: %d models moved (cost %v), want 1", moved, p.MoveCost)
	}
}

func TestPartitionInfeasibleAndBadRequests(t *testing.T) {
	req := partition.Request{Models: zooModels(6), SubClusters: 2, MaxRate: 100, MaxMoveCost: -1, TimeLimit: time.Second}
	p, err := partition.MILP(req)
	if err != nil || p.Feasible {
		t.Errorf("rate limit 100 for 2100 r/s over 2 sub-clusters: %v %+v", err, p)
	}
	if r, _ := partition.Random(req, 1000); r.Feasible || r.Status != "NO_FEASIBLE_FOUND" {
		t.Errorf("random: %+v", r)
	}
	for _, bad := range []partition.Request{
		{Models: zooModels(3), SubClusters: 0},
		{SubClusters: 2},
		{Models: []partition.Model{{Name: "m", Rate: 1, Current: 5}}, SubClusters: 2},
	} {
		if _, err := partition.MILP(bad); err == nil {
			t.Errorf("request %+v accepted", bad)
		}
	}
}

var report = flag.Bool("report", false, "print the partition quality report (TestPartitionReport)")

// TestPartitionReport compares the MILP with random search under the same
// time limit on Symphony-style instances (Appendix A.2): variants of the
// Table 1 models with exponentially distributed rates.
//
//	go test ./placement/partition -run TestPartitionReport -report -v
func TestPartitionReport(t *testing.T) {
	if !*report {
		t.Skip("run with -report")
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, size := range []struct {
		models, k int
		mem       profile.Bytes
	}{{40, 4, 11 << 30}, {200, 8, 16 << 30}} {
		var models []partition.Model
		var total float64
		for i := 0; i < size.models; i++ {
			z := symphonyTable1[i%len(symphonyTable1)]
			r := math.Round(rng.ExpFloat64() * 200)
			total += r
			models = append(models, partition.Model{Name: fmt.Sprintf("%s-%d", z.name, i), Rate: r,
				Static: profile.Bytes(z.static << 20), Dynamic: profile.Bytes(z.dynamic << 20), Current: -1})
		}
		req := partition.Request{Models: models, SubClusters: size.k, MaxRate: 1.3 * total / float64(size.k),
			MaxMemory: size.mem, MaxMoveCost: -1, TimeLimit: 10 * time.Second, Seed: 3}
		milp, err := partition.MILP(req)
		if err != nil {
			t.Fatal(err)
		}
		rnd, err := partition.Random(req, math.MaxInt)
		if err != nil {
			t.Fatal(err)
		}
		greedy, _ := partition.Greedy(req)
		for _, p := range []partition.Result{milp, greedy, rnd} {
			t.Logf("| %d models / %d | %s | %s | %.2f | %.3f | %.3f | %.0f |", size.models, size.k, p.Method, p.Status,
				p.Objective, p.RateImbal, p.MemImbal, p.SolveMS)
		}
	}
}
