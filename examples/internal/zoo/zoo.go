// Package zoo holds the published model figures the example profiles are
// built from, each with its source, and renders an example's profiles.yaml
// and README.md from its app.yaml. The files under examples/ are generated
// by `go test ./examples -update` and checked by the same test, so every
// number in them can be traced to a line here.
package zoo

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/modules"
)

// PlanningStreams is the session size the zoo examples are planned for:
// Scrooge's workloads have 12 clients (Section 4.2).
const PlanningStreams = 12

// Worker is one of the three worker types every zoo example offers.
type Worker struct {
	Type, GPU string
	Price     float64
	CPUs      int
	Memory    string
	Source    string
}

// Workers are the worker types of the zoo examples: a P100-like and a
// V100-like GPU VM and a CPU-only VM.
var Workers = []Worker{
	{Type: "P100", GPU: "P100", Price: 2.07, CPUs: 6, Memory: "16GiB", Source: "Azure P100 VM price, Scrooge Table 2; 6 vCPUs as in Scrooge Section 4.1's testbed; 16 GiB, the memory of the 16 GB card"},
	{Type: "V100", GPU: "V100", Price: 3.06, CPUs: 6, Memory: "16GiB", Source: "Azure V100 VM price, Scrooge Table 2; 6 vCPUs as in Scrooge Section 4.1's testbed; 16 GiB, the memory of the 16 GB card"},
	{Type: "CPU", Price: 0.83, CPUs: 8, Source: "a CPU-only VM at $0.83/h, the price set by the product design (issue 2); 8 vCPUs assumed"},
}

// v100Speedup converts P100 latencies to V100 ones where no V100
// measurement is published: the mean of Scrooge Table 2's V100/P100
// throughput ratios (1.11 for SSD-Inception, 1.21 for YOLO).
const v100Speedup = 1.16

// concurrencyGain is the throughput gain of running two batches at once on
// one GPU over one at a time, at the same batch size: Scrooge Tables 3 and 4
// show 60/50 and 120/100 (= 1.2) on worker X. A batch at concurrency 2 thus
// takes d(b) * 2 / 1.2.
const concurrencyGain = 1.2

// Curve gives batch execution times in milliseconds: Points where measured,
// else Alpha*b + Beta.
type Curve struct {
	Alpha, Beta float64
	Points      map[int]float64
	Source      string
}

func (c Curve) at(b int) float64 {
	if d, ok := c.Points[b]; ok {
		return d
	}
	return c.Alpha*float64(b) + c.Beta
}

func (c Curve) scaled(f float64, source string) Curve {
	out := Curve{Alpha: c.Alpha * f, Beta: c.Beta * f, Source: source}
	if c.Points != nil {
		out.Points = map[int]float64{}
		for b, d := range c.Points {
			out.Points[b] = d * f
		}
	}
	return out
}

// Model is a DNN with its figures per worker type.
type Model struct {
	Name    string
	About   string
	Batches []int // batch sizes it supports
	P100    Curve
	V100    *Curve // nil: P100 / v100Speedup
	CPU     *Curve // nil: not run on CPU-only workers
}

var gpuBatches = []int{1, 2, 4, 8, 16}

func fromB1(b1, betaOverAlpha float64) (alpha, beta float64) {
	alpha = b1 / (1 + betaOverAlpha)
	return alpha, b1 - alpha
}

func model(name, about string, p100 Curve) Model {
	return Model{Name: name, About: about, Batches: gpuBatches, P100: p100}
}

// Models are the DNNs the zoo examples use.
var Models = func() map[string]Model {
	ms := map[string]Model{}
	add := func(m Model) { ms[m.Name] = m }

	// SSD-Inception on P100: 40.98 img/s at batch 1 and 67.52 img/s at batch 8
	// (Scrooge Section 2), i.e. 24.40 ms and 118.48 ms; the line through them.
	d1, d8 := 1000/40.98, 8000/67.52
	ssdA := (d8 - d1) / 7
	ssdInc := model("ssd-inception", "object detector", Curve{Alpha: ssdA, Beta: d1 - ssdA,
		Source: "Scrooge Section 2: 40.98 img/s at batch 1, 67.52 img/s at batch 8 on P100; linear between"})
	v := ssdInc.P100.scaled(1/1.11, "P100 / 1.11, Scrooge Table 2's V100/P100 SSD-Inception throughput ratio")
	ssdInc.V100 = &v
	add(ssdInc)

	// Nexus's SSD: 47 ms at batch 1 (Nexus Section 7.3.2), shaped like SSD-Inception.
	a, b := fromB1(47, (d1-ssdA)/ssdA)
	add(model("ssd", "object detector (Nexus traffic)", Curve{Alpha: a, Beta: b,
		Source: "Nexus Section 7.3.2: SSD runs 47 ms at batch 1; beta/alpha of SSD-Inception (Scrooge Section 2)"}))

	a, b = fromB1(4.2, 8.771/1.964)
	add(model("googlenet-car", "car make/model classifier", Curve{Alpha: a, Beta: b,
		Source: "Nexus Section 7.3.2: GoogleNet-car runs 4.2 ms at batch 1; beta/alpha of InceptionV3 (Symphony Table 5)"}))

	add(model("vgg-face", "face recogniser (VGG-16 architecture)", Curve{Alpha: 2.734, Beta: 5.786,
		Source: "Symphony Table 5, VGG16 on 1080Ti (alpha 2.734 ms, beta 5.786 ms)"}))

	add(model("ssd-mobilenet", "SSD-MobileNet detector", Curve{Alpha: 23.778, Beta: 9.729,
		Source: "Symphony Table 5, SSDMobilenet on 1080Ti (alpha 23.778 ms, beta 9.729 ms); gives 29.8-38.2 img/s, matching Scrooge Figure 13b's 27.9-38.2 for the tracker's MobileNet"}))

	// PRNet: about 240 img/s (Scrooge Figure 13b); ResNet50's beta/alpha.
	ra := (16 * 1000.0 / 240) / (16 + 5.378/2.050)
	add(model("prnet", "PRNet facial keypoints", Curve{Alpha: ra, Beta: ra * 5.378 / 2.050,
		Source: "Scrooge Section 4.4 / Figure 13b: PRNet sustains about 240 img/s (taken at batch 16); beta/alpha of ResNet50 (Symphony Table 5)"}))

	triplet := model("triplet", "person re-identification (Triplet, ResNet-50 backbone)", Curve{Alpha: 2.050, Beta: 5.378,
		Source: "Symphony Table 5, ResNet50 on 1080Ti (alpha 2.050 ms, beta 5.378 ms)"})
	clockworkR50 := Curve{Points: map[int]float64{1: 2.61, 2: 3.78, 4: 5.61, 8: 9.13, 16: 15.67},
		Source: "Clockwork Table 1, resnet50 measured on V100 (batch 1-16: 2.61, 3.78, 5.61, 9.13, 15.67 ms)"}
	triplet.V100 = &clockworkR50
	add(triplet)

	add(model("openpose", "OpenPose body keypoints", Curve{Alpha: 3.059, Beta: 7.857,
		Source: "Symphony Table 5, VGG19 on 1080Ti (OpenPose's backbone; the full network is heavier, so this is optimistic)"}))
	add(model("action-rec", "action recogniser over keypoint windows", Curve{Alpha: 1.180, Beta: 3.483,
		Source: "Symphony Table 5, MobileNetV2 on 1080Ti (a light classifier; no published profile of the model itself)"}))
	add(model("alexnet", "AlexNet frame features", Curve{Alpha: 1.009, Beta: 2.390,
		Source: "Symphony Table 5, MobileNet on 1080Ti (similar FLOPs to AlexNet, which no seed paper profiles)"}))

	s2vt := Model{Name: "s2vt", About: "S2VT caption generator (RNN, batch 1 only)", Batches: []int{1},
		P100: Curve{Points: map[int]float64{1: 894}, Source: "Scrooge Section 2 / Figure 3b: 0.686-1.102 s per frame; the midpoint, batch 1 only (Section 4.4)"}}
	add(s2vt)

	bert := Curve{Alpha: 7.008, Beta: 0.159, Source: "Symphony Table 5, BERT on 1080Ti (alpha 7.008 ms, beta 0.159 ms), a transformer-sized stand-in: no seed paper profiles this model"}
	add(model("speech-recognition", "speech to text", bert))
	add(model("translation", "English to German translation", bert))
	add(model("speech-synthesis", "text to speech", bert))

	lenet := model("lenet", "LeNet digit recogniser", Curve{Alpha: 0.01, Beta: 0.09,
		Source: "Nexus Table 1 and Section 7.3.2: LeNet under 0.1 ms at batch 1 on GPU; beta/alpha 9 assumed (launch cost dominates)"})
	lenet.CPU = &Curve{Alpha: 6, Source: "Nexus Table 1: 6 ms per item on CPU"}
	add(lenet)

	a, b = fromB1(6.2, 5.378/2.050)
	r50 := model("resnet50", "ResNet-50 icon recogniser", Curve{Alpha: a, Beta: b,
		Source: "Nexus Table 1: ResNet-50 6.2 ms at batch 1 on GPU; beta/alpha of ResNet50 (Symphony Table 5)"})
	r50.V100 = &clockworkR50
	r50.CPU = &Curve{Alpha: 1130, Source: "Nexus Table 1: 1130 ms per item on CPU"}
	add(r50)
	return ms
}()

// OpLatencyMS is the per-item time of each CPU op on one core, for 640x480
// frames. These are engineering estimates, not published figures; measured
// profiles replace them once the ops are implemented (`mdag profile`).
var OpLatencyMS = map[modules.OpID]float64{
	"resize": 1.5, "crop": 0.4, "haar-face": 25, "count": 0.05, "track": 2,
	"window": 0.1, "sequence": 0.1, "activity": 1, "segment": 0.2, "sink": 0.05,
}

// Profiles renders the profiles.yaml of an app from the zoo.
func Profiles(app *dag.App) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Profiles for the %s example. Generated from examples/internal/zoo by\n", app.Name)
	b.WriteString("# `go test ./examples -update`; README.md says where each number comes from.\n")
	b.WriteString("workers:\n")
	for _, w := range Workers {
		fmt.Fprintf(&b, "  - {type: %s, price: %.2f", w.Type, w.Price)
		if w.GPU != "" {
			fmt.Fprintf(&b, ", gpu: %s, gpus: 1", w.GPU)
		}
		fmt.Fprintf(&b, ", cpus: %d", w.CPUs)
		if w.Memory != "" {
			fmt.Fprintf(&b, ", gpuMemory: %s", w.Memory)
		}
		b.WriteString("}\n")
	}
	b.WriteString("profiles:\n")
	seen := map[string]bool{}
	for _, m := range app.Modules {
		switch m.Kind {
		case dag.GPU:
			if seen[m.Model] {
				continue
			}
			seen[m.Model] = true
			md, ok := Models[m.Model]
			if !ok {
				return "", fmt.Errorf("zoo: no figures for model %q of module %s", m.Model, m.Name)
			}
			for _, w := range Workers {
				c, ok := md.curve(w.Type)
				if !ok {
					continue
				}
				fmt.Fprintf(&b, "  - target: %s\n    worker: %s\n    points:\n", md.Name, w.Type)
				concs := []int{1, 2}
				if w.GPU == "" {
					concs = []int{1, w.CPUs}
				}
				for _, e := range concs {
					for _, bs := range md.Batches {
						d := c.at(bs)
						if e > 1 && w.GPU != "" {
							d = d * float64(e) / concurrencyGain
						}
						fmt.Fprintf(&b, "      - {batch: %d, concurrency: %d, latency: %s}\n", bs, e, fmtMS(d))
					}
				}
			}
		case dag.CPU:
			d, ok := OpLatencyMS[modules.OpID(m.Op)]
			if !ok {
				return "", fmt.Errorf("zoo: no latency for op %q of module %s", m.Op, m.Name)
			}
			for _, w := range Workers {
				fmt.Fprintf(&b, "  - target: %s\n    worker: %s\n    points:\n", m.Name, w.Type)
				for _, e := range cpuConcurrency(w.CPUs) {
					fmt.Fprintf(&b, "      - {batch: 1, concurrency: %d, latency: %s}\n", e, fmtMS(d))
				}
			}
		}
	}
	return b.String(), nil
}

func cpuConcurrency(cpus int) []int {
	out := []int{1}
	for e := 2; e < cpus; e *= 2 {
		out = append(out, e)
	}
	if cpus > 1 {
		out = append(out, cpus)
	}
	return out
}

func (m Model) curve(worker string) (Curve, bool) {
	switch worker {
	case "P100":
		return m.P100, true
	case "V100":
		if m.V100 != nil {
			return *m.V100, true
		}
		return m.P100.scaled(1/v100Speedup, ""), true
	case "CPU":
		if m.CPU != nil {
			return *m.CPU, true
		}
	}
	return Curve{}, false
}

func (m Model) source(worker string) string {
	switch worker {
	case "P100":
		return m.P100.Source
	case "V100":
		if m.V100 != nil {
			return m.V100.Source
		}
		return fmt.Sprintf("P100 latency / %.2f (mean of Scrooge Table 2's V100/P100 throughput ratios, 1.11 and 1.21)", v100Speedup)
	case "CPU":
		if m.CPU != nil {
			return m.CPU.Source
		}
	}
	return ""
}

// fmtMS renders milliseconds as a Go duration with microsecond precision.
func fmtMS(ms float64) string {
	us := math.Round(ms * 1000)
	if us < 1 {
		us = 1
	}
	return fmt.Sprintf("%gms", us/1000)
}

// Readme renders an example's README.md: what the app is, where it comes
// from, and the source of every number in its profiles.
func Readme(app *dag.App, title, about string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n%s\n\n", title, strings.TrimSpace(about))
	fmt.Fprintf(&b, "SLO %v, media %s", app.SLO, app.Media)
	if app.FPS > 0 {
		fmt.Fprintf(&b, ", %g frames/s per stream", app.FPS)
	}
	fmt.Fprintf(&b, ". Planned for a session of %d streams, as in Scrooge's evaluation (Section 4.2):\n\n", PlanningStreams)
	fmt.Fprintf(&b, "```\nmdag validate -f examples/%s/app.yaml --profiles examples/%s/profiles.yaml --streams %d\n```\n\n", app.Name, app.Name, PlanningStreams)
	b.WriteString("## Modules\n\n| module | kind | runs | inputs | scale |\n|---|---|---|---|---|\n")
	for _, m := range app.Modules {
		runs := "op " + m.Op
		if m.Kind == dag.GPU {
			runs = "model " + m.Model
		}
		ins := make([]string, len(m.Inputs))
		for i, in := range m.Inputs {
			ins[i] = string(in)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %g |\n", m.Name, m.Kind, runs, strings.Join(ins, ", "), m.Scale)
	}
	b.WriteString("\n## Where the numbers come from\n\n")
	b.WriteString("Generated from `examples/internal/zoo`; regenerate with `go test ./examples -update`.\n\n")
	b.WriteString("| worker type | $/h | source |\n|---|---|---|\n")
	for _, w := range Workers {
		fmt.Fprintf(&b, "| %s | %.2f | %s |\n", w.Type, w.Price, w.Source)
	}
	b.WriteString("\n| model or op | worker | source |\n|---|---|---|\n")
	seen := map[string]bool{}
	var ops []string
	for _, m := range app.Modules {
		if m.Kind == dag.CPU {
			if !seen["op:"+m.Op] {
				seen["op:"+m.Op] = true
				ops = append(ops, m.Op)
			}
			continue
		}
		if seen[m.Model] {
			continue
		}
		seen[m.Model] = true
		md := Models[m.Model]
		for _, w := range Workers {
			if src := md.source(w.Type); src != "" {
				fmt.Fprintf(&b, "| %s | %s | %s |\n", md.Name, w.Type, src)
			}
		}
	}
	sort.Strings(ops)
	for _, op := range ops {
		fmt.Fprintf(&b, "| op %s | all | %g ms per item on one core: an engineering estimate for 640x480 frames, not a published figure; concurrency up to the worker's vCPUs at the same latency |\n",
			op, OpLatencyMS[modules.OpID(op)])
	}
	b.WriteString("\nGPU points at concurrency 2 take d(b) x 2 / 1.2: Scrooge Tables 3 and 4 show a 1.2x throughput gain from\n")
	b.WriteString("running two batches at once (60 vs 50 and 120 vs 100 items/s on worker X).\n")
	return b.String()
}
