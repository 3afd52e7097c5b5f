package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/profile"
)

type validateModule struct {
	Name      dag.ModuleID   `json:"name"`
	Kind      dag.Kind       `json:"kind"`
	Runs      string         `json:"runs"`
	Inputs    []dag.ModuleID `json:"inputs"`
	Scale     float64        `json:"scale"`
	Rate      float64        `json:"rate"`
	Configs   int            `json:"configs,omitempty"`
	Fastest   string         `json:"fastest,omitempty"`
	LatencyMS float64        `json:"latency_ms,omitempty"`
}

type validateReport struct {
	App        dag.AppID        `json:"app"`
	Media      dag.Media        `json:"media"`
	SLOMS      float64          `json:"slo_ms"`
	Shape      dag.Shape        `json:"shape"`
	Edges      int              `json:"edges"`
	Rate       float64          `json:"rate"`
	RateSource string           `json:"rate_source"`
	Modules    []validateModule `json:"modules"`
	Paths      []string         `json:"paths"`
	Profiles   string           `json:"profiles,omitempty"`
	Workers    []string         `json:"workers,omitempty"`
	Feasible   *bool            `json:"feasible,omitempty"`
	Critical   string           `json:"critical_path,omitempty"`
	CriticalMS float64          `json:"critical_latency_ms,omitempty"`
	Reason     string           `json:"reason,omitempty"`
	Hint       string           `json:"hint,omitempty"`
}

// defaultFPS is the per-stream frame rate assumed when the app sets no fps.
const defaultFPS = 30

// SessionRate returns the ingress rate of a session and how it was chosen:
// rate when positive, else streams times the app's fps (or defaultFPS).
func SessionRate(app *dag.App, rate float64, streams int) (float64, string) {
	if rate > 0 {
		return rate, "--rate"
	}
	fps, from := app.FPS, "the app's fps"
	if fps <= 0 {
		fps, from = defaultFPS, "default fps; set fps in the app"
	}
	if streams == 1 {
		return fps, "1 stream at " + from
	}
	return float64(streams) * fps, fmt.Sprintf("%d streams at %s", streams, from)
}

func runValidate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("validate", "-f app.yaml [--profiles profiles.yaml] [--models models.yaml] [--cameras cameras.yaml] [--streams N | --rate R] [-o text|json] | --models models.yaml", stderr)
	file := fs.String("f", "", "application YAML `file` (required)")
	profiles := fs.String("profiles", "", "profiles and worker types YAML `file`; adds the feasibility check")
	rate := fs.Float64("rate", 0, "ingress `rate` in frames per second for the whole session (default: --streams x the app's fps)")
	streams := fs.Int("streams", 1, "`number` of streams in the session, each at the app's fps (30 when the app sets none); ignored with --rate")
	out := fs.String("o", "text", "output `format`: text or json")
	cameras := fs.String("cameras", "", "cameras YAML `file` to check against the app of -f (names, URLs, apps, fps, transports)")
	models := fs.String("models", "", "model registry YAML `file`: checks each ONNX entry against its file's graph and, with -f, that every GPU module's model is in it")
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *models != "" {
		reg, err := registry.Load(*models)
		if err == nil {
			err = reg.CheckFiles()
		}
		if err == nil && *file != "" {
			app, lerr := dag.Load(*file)
			if lerr != nil {
				printErrors(stderr, lerr)
				return exitInvalid
			}
			err = checkAppModels(app, reg)
		}
		if err != nil {
			printErrors(stderr, err)
			return exitInvalid
		}
		if *file == "" {
			fmt.Fprintf(stdout, "%s: %d models valid (%s)\n", *models, len(reg.Models), strings.Join(reg.Names(), ", "))
			return exitOK
		}
	}
	if *cameras != "" {
		if *file == "" {
			fmt.Fprintln(stderr, "mdag validate: --cameras needs -f app.yaml: the app the cameras stream into")
			return exitInvalid
		}
		app, err := dag.Load(*file)
		if err != nil {
			printErrors(stderr, err)
			return exitInvalid
		}
		msg, err := checkCamerasFile(*cameras, []string{string(app.Name)})
		if err != nil {
			printErrors(stderr, err)
			return exitInvalid
		}
		fmt.Fprintln(stdout, msg)
	}
	if *file == "" {
		fmt.Fprintln(stderr, "mdag validate: -f app.yaml or --models models.yaml is required")
		fs.Usage()
		return exitInvalid
	}
	if *out != "text" && *out != "json" {
		fmt.Fprintf(stderr, "mdag validate: -o must be text or json, got %q\n", *out)
		return exitInvalid
	}
	if *rate < 0 || math.IsNaN(*rate) || math.IsInf(*rate, 0) {
		fmt.Fprintf(stderr, "mdag validate: --rate must be a positive number, got %v\n", *rate)
		return exitInvalid
	}
	if *streams < 1 {
		fmt.Fprintf(stderr, "mdag validate: --streams must be >= 1, got %d\n", *streams)
		return exitInvalid
	}
	g, cat, code := loadInputs(*file, *profiles, stderr)
	if code != exitOK {
		return code
	}
	rep, err := buildValidateReport(g, cat, *rate, *streams)
	if err != nil {
		fmt.Fprintln(stderr, "mdag validate:", err)
		return exitInvalid
	}
	if *out == "json" {
		writeJSON(stdout, rep, true)
	} else {
		writeValidateText(stdout, rep)
	}
	if rep.Feasible != nil && !*rep.Feasible {
		if *out == "json" {
			fmt.Fprintln(stderr, rep.Reason)
		}
		return exitInfeasible
	}
	return exitOK
}

func buildValidateReport(g *dag.Graph, cat *profile.Catalog, rate float64, streams int) (*validateReport, error) {
	app := g.App()
	rep := &validateReport{App: app.Name, Media: app.Media, SLOMS: msf(app.SLO), Shape: g.Shape(), Edges: g.Edges()}
	rep.Rate, rep.RateSource = SessionRate(app, rate, streams)
	paths, err := g.Paths()
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		rep.Paths = append(rep.Paths, p.String())
	}
	rates := g.Rates(rep.Rate, nil)
	latency := map[dag.ModuleID]time.Duration{}
	feasible := true
	var unreachable []string
	for _, id := range g.Order() {
		m, _ := app.Module(id)
		vm := validateModule{Name: id, Kind: m.Kind, Inputs: g.Inputs(id), Scale: m.Scale, Rate: rates[id]}
		if m.Kind == dag.GPU {
			vm.Runs = "model " + m.Model
		} else {
			vm.Runs = "op " + m.Op
		}
		if cat != nil {
			cfgs := cat.Configs(id)
			vm.Configs = len(cfgs)
			if ch, ok := profile.Fastest(cfgs, rates[id]); ok {
				vm.Fastest, vm.LatencyMS = ch.String(), msf(ch.Latency)
				latency[id] = ch.Latency
			} else {
				feasible = false
				unreachable = append(unreachable, string(id))
			}
		}
		rep.Modules = append(rep.Modules, vm)
	}
	if cat != nil {
		rep.Profiles = cat.File.Path
		for _, w := range cat.Workers() {
			desc := fmt.Sprintf("%s $%.2f/h", w.Type, w.Price)
			if w.GPU != "" {
				desc += fmt.Sprintf(" (%dx %s)", w.GPUs, w.GPU)
			}
			rep.Workers = append(rep.Workers, desc)
		}
		path, crit := g.CriticalPath(func(m dag.ModuleID) time.Duration { return latency[m] })
		rep.Critical, rep.CriticalMS = path.String(), msf(crit)
		switch {
		case !feasible:
			rep.Reason = fmt.Sprintf("infeasible: no configuration can carry the rate of %s", strings.Join(unreachable, ", "))
		case crit > app.SLO:
			feasible = false
			rep.Reason = fmt.Sprintf("infeasible: the fastest configurations give %s ms on %s, above the %s ms SLO (by %s ms)",
				fmtMS(crit), path, fmtMS(app.SLO), fmtMS(crit-app.SLO))
			if streams == 1 {
				rep.Hint = "each module's latency includes gathering a batch at its input rate (d + b/rate, Scrooge Eq. 3), " +
					"which is slow at low rates; plan for the whole session: --streams N or --rate R"
			}
		}
		rep.Feasible = &feasible
	}
	return rep, nil
}

func writeValidateText(w io.Writer, rep *validateReport) {
	fmt.Fprintf(w, "app %s: valid\n", rep.App)
	fmt.Fprintf(w, "  media %s, SLO %s ms, %d modules, %d edges, %d paths, shape %s\n",
		rep.Media, fmtFloat(rep.SLOMS), len(rep.Modules), rep.Edges, len(rep.Paths), rep.Shape)
	fmt.Fprintf(w, "  ingress %s frames/s (%s)\n\n", fmtFloat(rep.Rate), rep.RateSource)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if rep.Profiles == "" {
		fmt.Fprintln(tw, "MODULE\tKIND\tRUNS\tINPUTS\tSCALE\tRATE/S")
	} else {
		fmt.Fprintln(tw, "MODULE\tKIND\tRUNS\tINPUTS\tSCALE\tRATE/S\tCONFIGS\tFASTEST\tLATENCY MS")
	}
	for _, m := range rep.Modules {
		ins := make([]string, len(m.Inputs))
		for i, in := range m.Inputs {
			ins[i] = string(in)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s", m.Name, m.Kind, m.Runs, strings.Join(ins, ","), fmtFloat(m.Scale), fmtFloat(m.Rate))
		if rep.Profiles != "" {
			fastest, lat := m.Fastest, fmtFloat(m.LatencyMS)
			if fastest == "" {
				fastest, lat = "none carries this rate", "-"
			}
			fmt.Fprintf(tw, "\t%d\t%s\t%s", m.Configs, fastest, lat)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "\npaths:")
	for _, p := range rep.Paths {
		fmt.Fprintln(w, "  "+p)
	}
	if rep.Profiles == "" {
		fmt.Fprintln(w, "\nno profiles given: add --profiles to check feasibility against the SLO")
		return
	}
	fmt.Fprintf(w, "\nprofiles %s: %s\n", rep.Profiles, strings.Join(rep.Workers, ", "))
	if *rep.Feasible {
		fmt.Fprintf(w, "feasible: the fastest configurations give %s ms on %s, within the %s ms SLO (slack %s ms)\n",
			fmtFloat(rep.CriticalMS), rep.Critical, fmtFloat(rep.SLOMS), fmtFloat(rep.SLOMS-rep.CriticalMS))
	} else {
		fmt.Fprintln(w, rep.Reason)
		if rep.Hint != "" {
			fmt.Fprintln(w, "hint: "+rep.Hint)
		}
	}
}

func msf(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*100) / 100 }

func fmtMS(d time.Duration) string { return fmtFloat(msf(d)) }

// fmtFloat prints a number with at most two decimals and no trailing zeros.
func fmtFloat(f float64) string {
	return strconv.FormatFloat(math.Round(f*100)/100, 'f', -1, 64)
}

// loadInputs loads and validates an app and, when profiles is not empty, its
// profiles bound to it; problems are printed and turned into an exit code.
func loadInputs(file, profiles string, stderr io.Writer) (*dag.Graph, *profile.Catalog, int) {
	app, err := dag.Load(file)
	if err == nil {
		err = checkOutputs(app)
	}
	if err != nil {
		printErrors(stderr, err)
		return nil, nil, exitInvalid
	}
	var cat *profile.Catalog
	if profiles != "" {
		pf, err := profile.Load(profiles)
		if err != nil {
			printErrors(stderr, err)
			return nil, nil, exitInvalid
		}
		if cat, err = profile.Bind(app, pf); err != nil {
			printErrors(stderr, err)
			return nil, nil, exitInvalid
		}
	}
	g, err := dag.NewGraph(app)
	if err != nil {
		printErrors(stderr, err)
		return nil, nil, exitInvalid
	}
	return g, cat, exitOK
}
