package kserve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// serveFakeAt serves a fake with shared memory on addr until stop.
func serveFakeAt(t *testing.T, addr string) (f *fakeServer, stop func()) {
	t.Helper()
	f = &fakeServer{models: fakeModels, shm: true, regions: map[string]*Region{}}
	f.live.Store(true)
	f.ready.Store(true)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	pb.RegisterGRPCInferenceServiceServer(g, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	return f, func() {
		g.Stop()
		<-done
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, r := range f.regions {
			r.Close()
		}
	}
}

// A server that restarts has lost the slots' registrations: the first
// batch after it finds its region unknown, the model negotiates again and
// the batch is retried on a fresh region (no worker restart); every slot
// then uses shared memory on the new server.
func TestServerRestartSharedMemory(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, stop := serveFakeAt(t, addr)
	x := newExec(t, Config{SharedMemory: "on", Slots: 2}, entry("cls", "cls", addr, inF32, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := x.Check(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	f, stop2 := serveFakeAt(t, addr)
	defer stop2()
	for i := range 4 { // both slots
		out, err := x.Run(ctx, "cls", items(byte(30+i)))
		if err != nil {
			t.Fatalf("batch %d after the restart: %v", i, err)
		}
		if l := out[0][0].Labels; len(l) != 1 || l[0] != fmt.Sprintf("class%d", i) {
			t.Fatalf("batch %d: %v", i, l)
		}
	}
	if err := x.Health(ctx); err != nil {
		t.Fatalf("health after the restart: %v", err)
	}
	if n, regs := f.shmInfers.Load(), f.registered(); n != 4 || len(regs) != 2 {
		t.Errorf("the new server: %d of 4 requests by shared memory, regions %v (want one per slot)", n, regs)
	}
	if d := x.Describe(); !strings.Contains(d, "(shared memory)") {
		t.Errorf("Describe: %s", d)
	}
}

// With no time left for a second attempt, the region error is the batch's,
// said as such (not "the server does not serve"), and the next batch
// registers again.
func TestRegionUnknownError(t *testing.T) {
	f, addr := startFake(t, true)
	x := newExec(t, Config{SharedMemory: "on", Slots: 1}, entry("cls", "cls", addr, inF32, ""))
	ctx := context.Background()
	if _, err := x.Run(ctx, "cls", items(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	m := x.models["cls"]
	s := <-m.slots
	_, again, err := m.attempt(ctx, s, frames(1))
	m.slots <- s
	want := ": the server does not know shared memory region " + s.name
	if err == nil || !again || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "does not serve") {
		t.Fatalf("attempt with the region unregistered: again %v, %v; want %q", again, err, want)
	}
	if _, err := x.Run(ctx, "cls", items(2)); err != nil {
		t.Fatalf("the next batch: %v", err)
	}
	if regs := f.registered(); len(regs) != 1 {
		t.Errorf("registered %v, want the slot's new region", regs)
	}
}

func frames(reds ...byte) []*media.Frame {
	out := make([]*media.Frame, len(reds))
	for i, r := range reds {
		out[i] = frame(r)
	}
	return out
}

// Something truncates the executor's region (a buggy server, a cleanup
// script): the copy into it faults, which is the attempt's error (the
// worker does not die), and the batch is retried on a fresh region.
func TestClientRegionTruncated(t *testing.T) {
	f, addr := startFake(t, true)
	x := newExec(t, Config{SharedMemory: "on", Slots: 1}, entry("cls", "cls", addr, inF32, ""))
	ctx := context.Background()
	if _, err := x.Run(ctx, "cls", items(1)); err != nil {
		t.Fatal(err)
	}
	old := f.registered()
	for _, n := range old {
		if err := os.Truncate(filepath.Join(ShmDir, n), 0); err != nil {
			t.Fatal(err)
		}
	}
	m := x.models["cls"]
	s := <-m.slots
	_, again, err := m.attempt(ctx, s, frames(1))
	m.slots <- s
	if err == nil || !again || !strings.Contains(err.Error(), "writing the input: shared memory region "+old[0]+" faulted at ") {
		t.Fatalf("attempt on a truncated region: again %v, %v", again, err)
	}
	out, err := x.Run(ctx, "cls", items(7))
	if err != nil {
		t.Fatalf("after the fault: %v", err)
	}
	if l := out[0][0].Labels; len(l) != 1 || l[0] != "class7" {
		t.Errorf("labels %v", l)
	}
	if regs := f.registered(); len(regs) != 1 || regs[0] == old[0] {
		t.Errorf("registered %v, want a fresh region in place of %v", regs, old)
	}
}

// hugeMeta is a server whose metadata claims an output of 1<<60 values an
// item and which answers without contents.
type hugeMeta struct{ *fakeServer }

func (h hugeMeta) ModelMetadata(_ context.Context, r *pb.ModelMetadataRequest) (*pb.ModelMetadataResponse, error) {
	return &pb.ModelMetadataResponse{Name: r.Name,
		Inputs:  []*pb.ModelMetadataResponse_TensorMetadata{{Name: "input", Datatype: "FP32", Shape: []int64{-1, 3, 8, 8}}},
		Outputs: []*pb.ModelMetadataResponse_TensorMetadata{{Name: "probs", Datatype: "FP32", Shape: []int64{-1, 1 << 60}}}}, nil
}

func (h hugeMeta) ModelInfer(_ context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	b := r.Inputs[0].Shape[0]
	return &pb.ModelInferResponse{ModelName: r.ModelName, Outputs: []*pb.ModelInferResponse_InferOutputTensor{{Name: "probs", Datatype: "FP32", Shape: []int64{b, 10}}}}, nil
}

// The server's metadata is outside input: sizes that overflow or exceed a
// message come back as raw bytes (per 0), never a wrapped size; the rest
// are placed aligned, one after the other.
func TestLayout(t *testing.T) {
	x := newExec(t, Config{SharedMemory: "off"}, entry("cls", "cls", "127.0.0.1:1", inF32, ""))
	m := x.models["cls"] // input 3x8x8 float32, max_batch 4: 3072 bytes
	for _, tc := range []struct {
		name  string
		dtype string
		shape []int64
		per   int
	}{
		{"fixed", "FP32", []int64{-1, 10}, 40},
		{"fp16", "FP16", []int64{-1, 2, 5}, 20},
		{"wraps", "FP32", []int64{-1, 1 << 60}, 0},
		{"product wraps", "FP32", []int64{-1, 1 << 31, 1 << 31, 1 << 31}, 0},
		{"over a message", "FP32", []int64{-1, MaxMessageBytes / 4 / 2}, 0}, // 2 items fit, not max_batch 4
		{"variable", "FP32", []int64{-1, -1, 4}, 0},
		{"scalar", "FP32", []int64{}, 0},
		{"unknown dtype", "BYTES", []int64{-1, 4}, 0},
		{"zero", "UINT8", []int64{-1, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := &pb.ModelMetadataResponse{Outputs: []*pb.ModelMetadataResponse_TensorMetadata{
				{Name: "probs", Datatype: tc.dtype, Shape: tc.shape}, {Name: "next", Datatype: "FP32", Shape: []int64{-1, 1}}}}
			outs, err := m.layout(md)
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != 3 || outs[0].per != tc.per || outs[0].offset != 3072 || outs[1].per != 4 {
				t.Fatalf("layout %+v, want probs at 3072 with %d bytes an item", outs, tc.per)
			}
			if want := (3072 + tc.per*4 + 63) &^ 63; outs[1].offset != want || outs[2].offset != (want+16+63)&^63 {
				t.Errorf("offsets %+v, want next at %d", outs, want)
			}
		})
	}
	// end to end: such a server does not crash the worker
	f := &fakeServer{models: fakeModels, shm: true, regions: map[string]*Region{}}
	f.live.Store(true)
	f.ready.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	pb.RegisterGRPCInferenceServiceServer(g, hugeMeta{f})
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	defer func() {
		g.Stop()
		<-done
		for _, r := range f.regions {
			r.Close()
		}
	}()
	hx := newExec(t, Config{SharedMemory: "on", Slots: 1}, entry("cls", "cls", ln.Addr().String(), inF32, ""))
	_, err = hx.Run(context.Background(), "cls", items(1))
	if err == nil || !strings.Contains(err.Error(), "output 'probs' has no contents in the response") {
		t.Fatalf("Run against metadata of 1<<60 values: %v", err)
	}
}

// Unloading one model of a server leaves the workers of its other models
// healthy, and their batches run (the server stays ready).
func TestUnloadOtherModel(t *testing.T) {
	s, lisAddr := serveEmulated(t)
	addr := lisAddr
	ent := func(name string) string {
		return fmt.Sprintf(`
  %s:
    format: kserve
    kserve: {endpoint: "%s", model: %s}
    input: {name: input, dtype: float32, layout: NCHW, width: 8, height: 4}
    max_batch: 4
    decoder: {name: classify}
`, name, addr, name)
	}
	resnet := newExec(t, Config{SharedMemory: "off"}, ent("resnet"))
	face := newExec(t, Config{SharedMemory: "off"}, ent("face"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.RepositoryModelUnload(ctx, &pb.RepositoryModelUnloadRequest{ModelName: "face"}); err != nil {
		t.Fatal(err)
	}
	if err := resnet.Health(ctx); err != nil {
		t.Fatalf("resnet's worker after face was unloaded: %v", err)
	}
	if _, err := resnet.Run(ctx, "resnet", items(1)); err != nil {
		t.Fatalf("resnet after face was unloaded: %v", err)
	}
	if err := face.Health(ctx); err == nil || !strings.Contains(err.Error(), "server model face is not ready on the server") {
		t.Errorf("face's worker after face was unloaded: %v", err)
	}
}

// Regions of this executor's naming whose process is gone are removed at
// New; this process's, and other names, are left.
func TestRemoveStaleRegions(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no process to outlive: %v", err)
	}
	dead := cmd.Process.Pid // reaped: no such process (barring reuse)
	for _, tc := range []struct {
		name string
		gone bool
	}{
		{fmt.Sprintf("mdag-%d-17", dead), true},
		{fmt.Sprintf("mdag-%d-18", os.Getpid()), false},
		{fmt.Sprintf("mdag-%d-x", dead), false},
		{fmt.Sprintf("mdag-srv-%d", dead), false},
		{fmt.Sprintf("other-%d-1", dead), false},
	} {
		p := filepath.Join(ShmDir, tc.name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		removeStale()
		_, err := os.Stat(p)
		if gone := errors.Is(err, os.ErrNotExist); gone != tc.gone {
			t.Errorf("%s: removed %v, want %v", tc.name, gone, tc.gone)
		}
	}
}

// CreateRegion reserves its pages: where the tmpfs lacks the room it is an
// error at once (auto then falls back to raw bytes), not a SIGBUS when the
// region is first written.
func TestCreateRegionNoSpace(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v", err)
	}
	defer syscall.Unmount(dir, 0)
	old := ShmDir
	ShmDir = dir
	defer func() { ShmDir = old }()
	r, err := CreateRegion("/mdag-nospace", 512<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r2, err := CreateRegion("/mdag-nospace-2", 768<<10)
	if err == nil {
		r2.Close() // else the tmpfs stays busy
	}
	if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "reserving 786432 bytes in "+dir) {
		t.Fatalf("a region beyond the free space: %v", err)
	}
	if names, _ := os.ReadDir(dir); len(names) != 1 || !slices.ContainsFunc(names, func(e os.DirEntry) bool { return e.Name() == "mdag-nospace" }) {
		t.Errorf("left in %s: %v", dir, names)
	}
}

// Which ModelInfer errors mean the server lost a region (register again)
// and which do not.
func TestRegionUnknown(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		msg  string
		want bool
	}{
		{codes.NotFound, `input 'x': shared memory region "r1" is not registered (registered: none)`, true},
		{codes.InvalidArgument, "Unable to find system shared memory region: 'mdag-1-2'", true},
		{codes.InvalidArgument, `region "mdag-1-2" [0, +768) not registered or too small`, true},
		{codes.InvalidArgument, `input 'x': offset 0 + byte_size 4096 is outside shared memory region "r" of 96 bytes`, false},
		{codes.NotFound, `model "m" is not served here (served: a)`, false},
		{codes.Unavailable, "shared memory region r is not registered", false},
		{codes.Internal, "unknown shared memory region", false},
	} {
		if got := regionUnknown(status.Error(tc.code, tc.msg)); got != tc.want {
			t.Errorf("%s %q: %v, want %v", tc.code, tc.msg, got, tc.want)
		}
	}
}

// Health asks the server for a registered region: one it no longer knows
// (a restart) makes the model negotiate again, so the next batch registers
// a fresh region on its first attempt; a region the server knows changes
// nothing.
func TestHealthFindsLostRegions(t *testing.T) {
	s, lisAddr := serveEmulated(t)
	x := newExec(t, Config{SharedMemory: "on", Slots: 1}, fmt.Sprintf(`
  resnet:
    format: kserve
    kserve: {endpoint: "%s", model: resnet}
    input: {name: input, dtype: float32, layout: NCHW, width: 8, height: 4}
    max_batch: 4
    decoder: {name: classify}
`, lisAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.Check(ctx); err != nil {
		t.Fatal(err)
	}
	m := x.models["resnet"]
	ready := func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.ready }
	if err := x.Health(ctx); err != nil || !ready() {
		t.Fatalf("health with the region known: %v, ready %v", err, ready())
	}
	old := m.all[0].name
	if _, err := s.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := x.Health(ctx); err != nil {
		t.Fatalf("health with the region lost: %v", err)
	}
	if err := x.Health(ctx); err != nil || !ready() {
		t.Fatalf("the second probe: %v, ready %v (the first renegotiates)", err, ready())
	}
	sl := <-m.slots
	_, again, err := m.attempt(ctx, sl, frames(1))
	m.slots <- sl
	if err != nil || again {
		t.Fatalf("the first attempt after the probe: again %v, %v", again, err)
	}
	if st, err := s.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{}); err != nil || len(st.Regions) != 1 || st.Regions[old] != nil {
		t.Errorf("regions %v, %v: want one, not %s", st, err, old)
	}
}

// serveEmulated serves the emulated backend over emulatedRegistry on
// 127.0.0.1:0 until the test ends; it returns the server and its address.
func serveEmulated(t *testing.T) (*Server, string) {
	t.Helper()
	e, err := NewEmulated(emulatedRegistry(t), clock.Real{}, linearLatency)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer("mdag", "test", e)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done; s.Close() })
	return s, lis.Addr().String()
}
