package main

import (
	"flag"
	"fmt"

	"github.com/mdag/mdag/gpu"
)

// varianceFlag is --variance: how far the emulated GPUs' batch times
// stray from their profiles (gpu.Variance). serve, demo and worker default
// to the realistic model, so the runtime meets what real executors do;
// exact keeps every batch at its profiled time (the papers' setting: mdag
// eval and mdag sim are always exact).
type varianceFlag struct {
	v   gpu.Variance
	set bool // given on the command line
}

func (f *varianceFlag) String() string { return f.v.String() }

func (f *varianceFlag) Set(s string) error {
	v, err := gpu.ParseVariance(s)
	if err != nil {
		return err
	}
	f.v, f.set = v, true
	return nil
}

// addVarianceFlag adds --variance to fs, default realistic.
func addVarianceFlag(fs *flag.FlagSet) *varianceFlag {
	f := &varianceFlag{v: gpu.Realistic()}
	fs.Var(f, "variance", "the emulated GPUs' variance model: "+gpu.VarianceSyntax+
		"; realistic is "+realisticWords+"; exact takes every batch's profiled time")
	return f
}

// realisticWords describes gpu.Realistic for the flag's help.
var realisticWords = func() string {
	r := gpu.Realistic()
	return fmt.Sprintf("jitter=%g,stall=%gx%g,cold=%g@%v,shape=%g,contention=%g", r.Jitter, r.StallP, r.StallX, r.Cold, r.ColdIdle, r.Shape, r.Contention)
}()

// only refuses a --variance given with an executor that is not emulated:
// real executors vary by themselves.
func (f *varianceFlag) only(executor string) error {
	if f.set {
		return fmt.Errorf("--variance changes the emulated executor's times; %s runs real ones", executor)
	}
	return nil
}
