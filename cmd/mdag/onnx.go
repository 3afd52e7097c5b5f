package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/gpu/onnx"
	"github.com/mdag/mdag/gpu/registry"
)

// The onnx executor (gpu/onnx) is in both builds: onnxruntime_go opens the
// ONNX Runtime library with dlopen at run time, so the lean binary links
// no more than the C runtime.

// onnxFlags are the flags of the onnx executor (mdag worker, mdag serve).
type onnxFlags struct {
	models, device, lib *string
	intra, sessions     *int
	keep                []string // infer-server --model: only these of the registry (nil: all)
}

func addONNXFlags(fs *flag.FlagSet) *onnxFlags {
	return &onnxFlags{
		models:   fs.String("models", "", "with --executor onnx or kserve: the model registry (models.yaml); the app's `model:` names its entries"),
		device:   fs.String("device", "cpu", "with --executor onnx: cpu, or cuda (needs an ONNX Runtime library with the CUDA provider; make deps installs a CPU-only one)"),
		lib:      fs.String("ort-lib", onnx.DefaultLib(), "with --executor onnx: the ONNX Runtime shared library (env "+onnx.LibEnv+"; make deps installs it)"),
		intra:    fs.Int("intra-threads", 1, "with --executor onnx: intra-op threads per session, as mdag profile measures them by default (0: ONNX Runtime's default, the cores: sessions x cores threads then contend for the cores the profile measured one thread on)"),
		sessions: fs.Int("sessions", 2, "with --executor onnx: sessions per model, the batches of one model that run at once"),
	}
}

// set lists the onnx flags given (--models with them: it is kserve's too).
func (o *onnxFlags) set(fs *flag.FlagSet) []string {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "models", "device", "ort-lib", "intra-threads", "sessions":
			given = append(given, "--"+f.Name)
		}
	})
	return given
}

// executorFlags checks that the flags given fit the executor chosen: the
// onnx flags with onnx (--models with kserve too), the kserve flags with
// kserve.
func executorFlags(executor string, onnxGiven, kserveGiven []string) error {
	switch executor {
	case "onnx":
		if len(kserveGiven) > 0 {
			return fmt.Errorf("%s need --executor kserve", strings.Join(kserveGiven, ", "))
		}
	case "kserve":
		var own []string
		for _, f := range onnxGiven {
			if f != "--models" {
				own = append(own, f)
			}
		}
		if len(own) > 0 {
			return fmt.Errorf("%s need --executor onnx", strings.Join(own, ", "))
		}
	default:
		if len(onnxGiven) > 0 {
			return fmt.Errorf("%s need --executor onnx (or kserve, for --models)", strings.Join(onnxGiven, ", "))
		}
		if len(kserveGiven) > 0 {
			return fmt.Errorf("%s need --executor kserve", strings.Join(kserveGiven, ", "))
		}
	}
	return nil
}

// executor loads the registry (graphs checked) and the models on ORT.
func (o *onnxFlags) executor() (*onnx.Executor, *registry.Registry, error) {
	if *o.models == "" {
		return nil, nil, fmt.Errorf("--executor onnx needs --models models.yaml")
	}
	reg, err := o.registry()
	if err != nil {
		return nil, nil, err
	}
	x, err := onnx.New(reg, onnx.Config{Lib: *o.lib, Device: *o.device, IntraThreads: *o.intra, Sessions: *o.sessions})
	return x, reg, err
}

// checkAppModels lists the app's GPU modules whose model is not in the
// registry, with the app's file:line.
// registry loads --models, keeping only o.keep's entries when given (an
// unknown name is an error listing the registry's).
func (o *onnxFlags) registry() (*registry.Registry, error) {
	reg, err := registry.Load(*o.models)
	if err != nil || o.keep == nil {
		return reg, err
	}
	keep := map[string]bool{}
	for _, n := range o.keep {
		if _, ok := reg.Models[n]; !ok {
			return nil, fmt.Errorf("--model %s: not in %s (it has: %s)", n, *o.models, strings.Join(reg.Names(), ", "))
		}
		keep[n] = true
	}
	for n := range reg.Models {
		if !keep[n] {
			delete(reg.Models, n)
		}
	}
	return reg, nil
}

func checkAppModels(app *dag.App, reg *registry.Registry) error {
	var bad []string
	for i, m := range app.Modules {
		if m.Kind != dag.GPU {
			continue
		}
		if _, ok := reg.Models[m.Model]; ok {
			continue
		}
		path := fmt.Sprintf("modules[%d].model", i)
		line := 0
		if p := app.Positions(); p != nil {
			line = p.Line(path)
		}
		bad = append(bad, fmt.Sprintf("%s:%d: %s: %q is not in the model registry %s (it has: %s)", app.File, line, path, m.Model, reg.File, strings.Join(reg.Names(), ", ")))
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "\n"))
	}
	return nil
}
