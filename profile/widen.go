package profile

import (
	"fmt"
	"math"
	"time"

	"github.com/mdag/mdag/dag"
)

// Widen returns the app's catalog over k worker types, for measuring the
// planners at more worker types than the profiles hold (Scrooge Section
// 4.3's 30 VM types): the file's own types first (the first k of them when
// k is smaller), then copies of them in turn with speeds scaled by 0.6-1.5x
// and prices by 0.7-1.5x, from fixed low-discrepancy sequences, so the same
// k always gives the same catalog. Copy i of type T is named T-ii.
func Widen(app *dag.App, cat *Catalog, k int) (*Catalog, error) {
	if k < 1 {
		return nil, fmt.Errorf("profile: widen to %d worker types: want at least 1", k)
	}
	src := cat.File
	if len(src.Workers) == 0 {
		return nil, fmt.Errorf("profile: widen %s: no worker types to copy", nameOr(src.Path, "the profiles"))
	}
	f := &File{Path: src.Path + fmt.Sprintf(" widened to %d worker types", k), Plan: src.Plan}
	frac := func(x float64) float64 { return x - math.Floor(x) }
	for i := range k {
		base := src.Workers[i%len(src.Workers)]
		speed := 1.0
		w := base
		if i >= len(src.Workers) {
			speed = 0.6 + 0.9*frac(float64(i)*0.6180339887)
			price := 0.7 + 0.8*frac(float64(i)*0.4142135623)
			w.Type = WorkerTypeID(fmt.Sprintf("%s-%02d", base.Type, i))
			w.Price = math.Round(base.Price*price*100) / 100
		}
		f.Workers = append(f.Workers, w)
		for _, pr := range src.Profiles {
			if pr.Worker != base.Type {
				continue
			}
			np := Profile{Target: pr.Target, Worker: w.Type, Frame: pr.Frame}
			for _, pt := range pr.Points {
				pt.Latency = max(1, pt.Latency*1000/time.Duration(1000*speed))
				if pt.P99 > 0 {
					pt.P99 = max(pt.Latency, pt.P99*1000/time.Duration(1000*speed))
				}
				pt.Throughput *= speed
				np.Points = append(np.Points, pt)
			}
			f.Profiles = append(f.Profiles, np)
		}
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return Bind(app, f)
}
