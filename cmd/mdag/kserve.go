package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/mdag/mdag/gpu/kserve"
	"github.com/mdag/mdag/gpu/registry"
)

// The kserve executor (gpu/kserve) is in both builds: pure Go (gRPC). It
// runs the registry's `format: kserve` entries on Open Inference Protocol
// servers (`mdag infer-server`, Triton, KServe); --models is shared with
// the onnx executor.

// kserveFlags are the kserve executor's own flags (mdag worker, serve).
type kserveFlags struct {
	shm   *string
	slots *int
}

func addKServeFlags(fs *flag.FlagSet) *kserveFlags {
	return &kserveFlags{
		shm: fs.String("shared-memory", "auto", "with --executor kserve: tensors through the system shared memory extension: auto (when the endpoint is on this host and the server offers it), on or off; "+
			"a model's kserve.shared_memory overrides it"),
		slots: fs.Int("slots", kserve.DefaultSlots, "with --executor kserve: requests in flight per model (each keeps its buffers, and with shared memory its region)"),
	}
}

// set lists the kserve flags given.
func (k *kserveFlags) set(fs *flag.FlagSet) []string {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "shared-memory" || f.Name == "slots" {
			given = append(given, "--"+f.Name)
		}
	})
	return given
}

// executor loads the registry and prepares its kserve models; it does not
// need the servers up.
func (k *kserveFlags) executor(models string) (*kserve.Executor, *registry.Registry, error) {
	if models == "" {
		return nil, nil, fmt.Errorf("--executor kserve needs --models models.yaml")
	}
	reg, err := registry.Load(models)
	if err != nil {
		return nil, nil, err
	}
	x, err := kserve.New(reg, kserve.Config{SharedMemory: *k.shm, Slots: *k.slots})
	return x, reg, err
}

// checkServers probes the servers once at start (health, shared memory):
// what is wrong is said now, though a server may come up later.
func checkServers(x *kserve.Executor) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return x.Check(ctx)
}
