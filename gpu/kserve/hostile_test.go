package kserve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/mdag/mdag/api/kserve"
)

// shmPath makes a unique object name for a test and removes whatever is
// left under it at the end.
func shmPath(t *testing.T, what string) (key, path string) {
	t.Helper()
	key = fmt.Sprintf("/mdag-hostile-%d-%s", os.Getpid(), what)
	path = filepath.Join(ShmDir, key[1:])
	os.RemoveAll(path)
	t.Cleanup(func() { os.RemoveAll(path) })
	return key, path
}

// A register request names any /dev/shm entry; the server maps only a
// regular file of its own uid with one link, and says why it refuses
// (PermissionDenied). Before the guard, a symbolic link was followed (the
// target's bytes mapped read-write) and another uid's 0600 object mapped.
func TestRegisterRefusesForeignObjects(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()

	// a file outside /dev/shm that a link there leads to
	target := filepath.Join(t.TempDir(), "victim")
	victim := []byte(strings.Repeat("precious ", 500))
	if err := os.WriteFile(target, victim, 0o600); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		make func(t *testing.T, key, path string)
		says string
	}{
		{"symlink", func(t *testing.T, _, path string) {
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"symlink to own object", func(t *testing.T, _, path string) {
			own, _ := shmPath(t, "own")
			r, err := CreateRegion(own, 4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			if err := os.Symlink(filepath.Join(ShmDir, own[1:]), path); err != nil {
				t.Fatal(err)
			}
		}, "is a symbolic link"},
		{"fifo", func(t *testing.T, _, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is a FIFO"},
		{"directory", func(t *testing.T, _, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "is a directory"},
		{"another uid", func(t *testing.T, key, path string) {
			if os.Geteuid() != 0 {
				t.Skip("chown to another uid needs root")
			}
			r, err := CreateRegion(key, 4096)
			if err != nil {
				t.Fatal(err)
			}
			r.own = false // the path's cleanup removes it
			t.Cleanup(func() { r.Close() })
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "owned by uid 65534"},
		{"hard link", func(t *testing.T, _, path string) {
			own, _ := shmPath(t, "linked")
			r, err := CreateRegion(own, 4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			if err := os.Link(filepath.Join(ShmDir, own[1:]), path); err != nil {
				t.Fatal(err)
			}
		}, "has 2 links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, path := shmPath(t, strings.ReplaceAll(tc.name, " ", "-"))
			tc.make(t, key, path)
			t.Cleanup(func() { c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{}) })
			_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "r", Key: key, ByteSize: 32})
			wantCode(t, err, codes.PermissionDenied, fmt.Sprintf("shared memory region %q", "r"), key, tc.says)
			if _, err := OpenRegion(key, 0, 32); !errors.Is(err, ErrNotShm) {
				t.Fatalf("OpenRegion: %v, want ErrNotShm", err)
			}
			st, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{})
			if err != nil || len(st.Regions) != 0 {
				t.Fatalf("status after a refusal: %v, %v: want no region", st, err)
			}
		})
	}
	if got, err := os.ReadFile(target); err != nil || string(got) != string(victim) {
		t.Fatalf("the link's target changed: %v", err)
	}
}

// The regions registered at once and their bytes are bounded; a refusal
// (ResourceExhausted) says the numbers, holds nothing, and unregistering
// makes room again. A failed register gives its reservation back.
func TestRegisterLimits(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	if err := s.SetShmLimits(ShmLimits{MaxRegions: 2, MaxBytes: 5000}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []ShmLimits{{0, 1}, {1, 0}, {-1, 1}} {
		if err := s.SetShmLimits(bad); err == nil {
			t.Errorf("SetShmLimits(%+v): no error", bad)
		}
	}
	c := serve(t, s)
	ctx := context.Background()
	key, _ := shmPath(t, "limits")
	mem, err := CreateRegion(key, 8192)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	reg := func(name string, size uint64) error {
		_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: name, Key: key, ByteSize: size})
		return err
	}
	// failed registers (absent object) must not use up the limits
	for range 5 {
		_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: "x", Key: key + "-absent", ByteSize: 4000})
		wantCode(t, err, codes.NotFound)
	}
	if err := reg("a", 4000); err != nil {
		t.Fatal(err)
	}
	wantCode(t, reg("big", 1001), codes.ResourceExhausted, `"big" of 1001 bytes`, "1 regions of 4000 bytes are registered", "at most 2 regions of 5000 bytes")
	if err := reg("b", 1000); err != nil {
		t.Fatal(err)
	}
	wantCode(t, reg("c", 1), codes.ResourceExhausted, "2 regions of 5000 bytes are registered", "at most 2 regions")
	if _, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := reg("c", 4000); err != nil {
		t.Fatalf("after unregistering one: %v", err)
	}
	if _, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := reg("d", 5000); err != nil {
		t.Fatalf("after unregistering all: %v", err)
	}
}

// A region name is kept by the server: one longer than MaxRegionName is
// refused wherever it comes, without being echoed back.
func TestRegionNameBounded(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	s, _ := newFake(t)
	c := serve(t, s)
	ctx := context.Background()
	key, _ := shmPath(t, "names")
	mem, err := CreateRegion(key, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	long := strings.Repeat("n", 1<<20)
	if err := checkRegionName(strings.Repeat("n", MaxRegionName), "x"); err != nil {
		t.Fatalf("a name of %d bytes: %v", MaxRegionName, err)
	}
	for what, call := range map[string]func() error{
		"register": func() error {
			_, err := c.SystemSharedMemoryRegister(ctx, &pb.SystemSharedMemoryRegisterRequest{Name: long, Key: key, ByteSize: 48})
			return err
		},
		"status": func() error {
			_, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{Name: long})
			return err
		},
		"unregister": func() error {
			_, err := c.SystemSharedMemoryUnregister(ctx, &pb.SystemSharedMemoryUnregisterRequest{Name: long})
			return err
		},
		"infer": func() error {
			req := twiceReq(2)
			req.Outputs = []*pb.ModelInferRequest_InferRequestedOutputTensor{{Name: "y", Parameters: shmP(long, 48, 0)}}
			_, err := c.ModelInfer(ctx, req)
			return err
		},
	} {
		err := call()
		wantCode(t, err, codes.InvalidArgument, fmt.Sprintf("name of %d bytes: at most %d", len(long), MaxRegionName))
		if m := status.Convert(err).Message(); len(m) > 200 {
			t.Errorf("%s: a message of %d bytes: the name echoed back?", what, len(m))
		}
	}
	if st, err := c.SystemSharedMemoryStatus(ctx, &pb.SystemSharedMemoryStatusRequest{}); err != nil || len(st.Regions) != 0 {
		t.Fatalf("status: %v, %v: want no region", st, err)
	}
}
