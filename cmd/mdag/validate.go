package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
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

// appFlags are the app and its session's rate, as the planning commands
// (validate, allocate, place) take them.
type appFlags struct {
	file, profiles string
	rate           float64
	streams        int
}

// bind declares -f, --profiles (described by profilesUse), --rate and --streams.
func (a *appFlags) bind(fs *flag.FlagSet, profilesUse string) {
	fs.StringVar(&a.file, "f", "", "application YAML `file` (required)")
	fs.StringVar(&a.profiles, "profiles", "", profilesUse)
	fs.Float64Var(&a.rate, "rate", 0, "ingress `rate` in frames per second for the whole session (default: --streams x the app's fps)")
	fs.IntVar(&a.streams, "streams", 1, "`number` of streams in the session, each at the app's fps (30 when the app sets none); ignored with --rate")
}

// check reports every problem with the rate and the streams.
func (a *appFlags) check() []error {
	var errs []error
	if a.rate < 0 || math.IsNaN(a.rate) || math.IsInf(a.rate, 0) {
		errs = append(errs, fmt.Errorf("--rate must be a positive number, got %v", a.rate))
	}
	if a.streams < 1 {
		errs = append(errs, fmt.Errorf("--streams must be >= 1, got %d", a.streams))
	}
	return errs
}

// require reports -f and --profiles when missing.
func (a *appFlags) require() []error {
	if a.file == "" || a.profiles == "" {
		return []error{errors.New("-f app.yaml and --profiles profiles.yaml are required")}
	}
	return nil
}

// outputFlag checks -o against the formats a command writes.
func outputFlag(out string, formats ...string) []error {
	if slices.Contains(formats, out) {
		return nil
	}
	return []error{fmt.Errorf("-o must be %s, got %q", strings.Join(formats, " or "), out)}
}

const validateSynopsis = "-f app.yaml [--profiles profiles.yaml] [--models models.yaml] [--cameras cameras.yaml] [--streams N | --rate R] [-o text|json] | --models models.yaml"

func runValidate(args []string, stdout, stderr io.Writer) int {
	return execute("validate", validateSynopsis, new(validateCmd), args, stdout, stderr)
}

// validateCmd is mdag validate's options.
type validateCmd struct {
	app                  appFlags
	out, cameras, models string
}

func (c *validateCmd) flags(fs *flag.FlagSet) {
	c.app.bind(fs, "profiles and worker types YAML `file`; adds the feasibility check")
	fs.StringVar(&c.out, "o", "text", "output `format`: text or json")
	fs.StringVar(&c.cameras, "cameras", "", "cameras YAML `file` to check against the app of -f (names, URLs, apps, fps, transports)")
	fs.StringVar(&c.models, "models", "", "model registry YAML `file`: checks each ONNX entry against its file's graph and, with -f, that every GPU module's model is in it")
}

func (c *validateCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.app.file == "" && c.models == "" {
		errs = append(errs, errors.New("-f app.yaml or --models models.yaml is required"))
	}
	if c.cameras != "" && c.app.file == "" {
		errs = append(errs, errors.New("--cameras needs -f app.yaml: the app the cameras stream into"))
	}
	errs = append(errs, outputFlag(c.out, "text", "json")...)
	return append(errs, c.app.check()...)
}

func (c *validateCmd) run(env *cmdEnv) error {
	if c.models != "" {
		if err := c.checkModels(env.stdout); err != nil || c.app.file == "" {
			return err
		}
	}
	if c.cameras != "" {
		if err := c.checkCameras(env.stdout); err != nil {
			return err
		}
	}
	g, cat, err := readInputs(c.app.file, c.app.profiles)
	if err != nil {
		return err
	}
	rep, err := buildValidateReport(g, cat, c.app.rate, c.app.streams)
	if err != nil {
		return invalid(err)
	}
	if c.out == "json" {
		writeJSON(env.stdout, rep, true)
	} else {
		writeValidateText(env.stdout, rep)
	}
	if rep.Feasible != nil && !*rep.Feasible {
		if c.out == "json" {
			fmt.Fprintln(env.stderr, rep.Reason)
		}
		return reported(exitInfeasible)
	}
	return nil
}

// checkModels checks the registry's files (--models) and, with -f, that it
// has every GPU module's model.
func (c *validateCmd) checkModels(stdout io.Writer) error {
	reg, err := registry.Load(c.models)
	if err == nil {
		err = reg.CheckFiles()
	}
	if err == nil && c.app.file != "" {
		app, lerr := dag.Load(c.app.file)
		if lerr != nil {
			return invalid(lerr)
		}
		err = checkAppModels(app, reg)
	}
	if err != nil {
		return invalid(err)
	}
	if c.app.file == "" {
		fmt.Fprintf(stdout, "%s: %d models valid (%s)\n", c.models, len(reg.Models), strings.Join(reg.Names(), ", "))
	}
	return nil
}

// checkCameras checks the cameras file (--cameras) against the app of -f.
func (c *validateCmd) checkCameras(stdout io.Writer) error {
	app, err := dag.Load(c.app.file)
	if err != nil {
		return invalid(err)
	}
	msg, err := checkCamerasFile(c.cameras, []string{string(app.Name)})
	if err != nil {
		return invalid(err)
	}
	fmt.Fprintln(stdout, msg)
	return nil
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

// readInputs loads an app and, when profiles is not "", its profiles bound
// to it; its errors are problems (they say file:line).
func readInputs(file, profiles string) (*dag.Graph, *profile.Catalog, error) {
	app, err := dag.Load(file)
	if err == nil {
		err = checkOutputs(app)
	}
	if err != nil {
		return nil, nil, invalid(err)
	}
	var cat *profile.Catalog
	if profiles != "" {
		pf, err := profile.Load(profiles)
		if err != nil {
			return nil, nil, invalid(err)
		}
		if cat, err = profile.Bind(app, pf); err != nil {
			return nil, nil, invalid(err)
		}
	}
	g, err := dag.NewGraph(app)
	if err != nil {
		return nil, nil, invalid(err)
	}
	return g, cat, nil
}
