package milp_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/profile"
)

// widen returns the app's catalog over k worker types: the file's own types
// first, then copies of them with speeds scaled by 0.6-1.5x and prices by
// 0.7-1.5x (deterministic), the way the issue asks solve times to be
// measured at 2, 10 and 30 worker types.
func widen(t testing.TB, g *dag.Graph, cat *profile.Catalog, k int) *profile.Catalog {
	t.Helper()
	src := cat.File
	f := &profile.File{Path: src.Path + fmt.Sprintf(" widened to %d worker types", k)}
	frac := func(x float64) float64 { return x - math.Floor(x) }
	for i := 0; i < k; i++ {
		base := src.Workers[i%len(src.Workers)]
		speed, price := 1.0, 1.0
		w := base
		if i >= len(src.Workers) {
			speed = 0.6 + 0.9*frac(float64(i)*0.6180339887)
			price = 0.7 + 0.8*frac(float64(i)*0.4142135623)
			w.Type = profile.WorkerTypeID(fmt.Sprintf("%s-%02d", base.Type, i))
			w.Price = math.Round(base.Price*price*100) / 100
		}
		f.Workers = append(f.Workers, w)
		for _, pr := range src.Profiles {
			if pr.Worker != base.Type {
				continue
			}
			np := profile.Profile{Target: pr.Target, Worker: w.Type}
			for _, pt := range pr.Points {
				pt.Latency = max(1, pt.Latency*1000/profileDuration(1000*speed))
				pt.Throughput *= speed
				np.Points = append(np.Points, pt)
			}
			f.Profiles = append(f.Profiles, np)
		}
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	wide, err := profile.Bind(g.App(), f)
	if err != nil {
		t.Fatal(err)
	}
	return wide
}

type profileDuration = time.Duration
