package kserve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/mdag/mdag/api/kserve"
	"github.com/mdag/mdag/internal/testproc"
	"github.com/mdag/mdag/internal/unixsock"
)

// A unix: endpoint served by this uid (unixsock.Listen, as mdag
// infer-server --listen unix:/PATH) is talked to.
func TestUnixEndpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "infer.sock")
	ln, err := unixsock.Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{models: fakeModels, regions: map[string]*Region{}}
	f.live.Store(true)
	f.ready.Store(true)
	g := grpc.NewServer(ServerOptions()...)
	pb.RegisterGRPCInferenceServiceServer(g, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	defer func() { g.Stop(); <-done }()
	x, err := New(writeRegistry(t, entry("m", "cls", "unix:"+path, inF32, ", shared_memory: \"off\"")), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := x.Health(ctx); err != nil {
		t.Errorf("Health over unix:%s: %v", path, err)
	}
}

// A unix: endpoint another uid serves (another user bound the path first)
// is refused before anything is sent: the worker's frames would go to
// them. The server is this test binary run again as uid 65534.
func TestUnixEndpointOfAnotherUID(t *testing.T) {
	if path := os.Getenv("MDAG_KSERVE_TEST_SERVE"); path != "" { // the child
		l, err := net.Listen("unix", path)
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(3)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
		fmt.Println("listening")
		io.Copy(io.Discard, os.Stdin) // until the parent is done
		l.Close()
		os.Exit(0)
	}
	cmd, pub := testproc.AsNobody(t, "TestUnixEndpointOfAnotherUID")
	dir := filepath.Join(pub, "run")
	if err := os.Mkdir(dir, 0o700); err != nil || os.Chown(dir, 65534, 65534) != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "infer.sock")
	cmd.Env = append(cmd.Env, "MDAG_KSERVE_TEST_SERVE="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the server of uid 65534: %v", err)
		}
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("the server of uid 65534: %q, %v", line, err)
	}
	x, err := New(writeRegistry(t, entry("m", "cls", "unix:"+path, inF32, "")), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	// without the check, the call would wait on the silent server
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = x.Health(ctx)
	want := fmt.Sprintf("unix:%s is served by uid 65534 (pid %d), not root (this user): refusing to talk to it", path, cmd.Process.Pid)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Health: %v, want an error saying %q", err, want)
	}
}
