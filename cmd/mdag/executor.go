package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/registry"
)

// builtExecutor is the GPU executor a command's --executor flags name.
type builtExecutor struct {
	name   string
	exec   gpu.Executor       // nil: emulated
	reg    *registry.Registry // the model registry (--models); nil for emulated and opencv
	kserve *kserve.Executor   // the kserve executor, for its servers' health checks
	close  func()             // never nil
}

// describe says where GPU modules run ("" for emulated).
func (b *builtExecutor) describe() string {
	if d, ok := b.exec.(interface{ Describe() string }); ok {
		return d.Describe()
	}
	return ""
}

// buildExecutor is the one place a command's executor flags become an
// executor: emulated (none), onnx or kserve from --models (the flags given
// checked against the choice), or with extra one of the full build's own
// (opencv, from models: mdag worker's --model). The caller prefixes the
// errors with its command and exits invalid.
func buildExecutor(name string, fs *flag.FlagSet, ox *onnxFlags, kx *kserveFlags, models []gpu.ModelFile, extra bool) (*builtExecutor, error) {
	if err := checkExecutor(name, fs, ox, kx, models, extra); err != nil {
		return nil, err
	}
	b := &builtExecutor{name: name, close: func() {}}
	switch name {
	case "emulated":
	case "kserve":
		x, reg, err := kx.executor(*ox.models)
		if err != nil {
			return nil, err
		}
		b.exec, b.reg, b.kserve, b.close = x, reg, x, func() { x.Close() }
	case "onnx":
		x, reg, err := ox.executor()
		if err != nil {
			return nil, err
		}
		b.exec, b.reg, b.close = x, reg, func() { x.Close() }
	default:
		x, closeX, err := newExecutor(name, models, 2)
		if err != nil {
			return nil, err
		}
		b.exec, b.close = x, closeX
	}
	return b, nil
}

// checkExecutor checks the executor flags alone (a command's validate
// calls it; buildExecutor calls it again): the executor's name, the flags
// that go with it and --model (the opencv executor's).
func checkExecutor(name string, fs *flag.FlagSet, ox *onnxFlags, kx *kserveFlags, models []gpu.ModelFile, extra bool) error {
	known := []string{"emulated", "onnx", "kserve"}
	if extra {
		known = append(known, executors...)
	}
	if !slices.Contains(known, name) {
		if extra && len(executors) == 0 {
			return fmt.Errorf("--executor %q: the %s build has emulated, onnx and kserve; "+
				"the OpenCV DNN executor (--executor opencv) is in the full build: bin/mdag (make build)", name, buildName)
		}
		return fmt.Errorf("--executor %q: want %s or %s", name, strings.Join(known[:len(known)-1], ", "), known[len(known)-1])
	}
	if err := executorFlags(name, ox.set(fs), kx.set(fs)); err != nil {
		return err
	}
	switch {
	case name == "emulated" && len(models) > 0:
		return errors.New("--model needs --executor opencv")
	case (name == "kserve" || name == "onnx") && len(models) > 0:
		return fmt.Errorf("--model is the opencv executor's; --executor %s reads --models models.yaml", name)
	case name != "emulated" && name != "kserve" && name != "onnx" && len(models) == 0:
		return fmt.Errorf("--executor %s needs at least one --model NAME=DECODER:PATH", name)
	}
	return nil
}
