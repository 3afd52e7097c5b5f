package unixsock

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mdag/mdag/internal/testproc"
)

// chanWriter sends each write (one log record) to a channel.
type chanWriter chan string

func (w chanWriter) Write(p []byte) (int, error) { w <- string(p); return len(p), nil }

// Listen: the directory is made 0700, the socket 0600 (no other user can
// connect at all), a client of the server's uid is let in, and the socket
// goes with the listener. What is at the path or around it is checked
// first.
func TestListen(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "run")
	path := filepath.Join(dir, "infer.sock")
	lis, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: os.ModeDir | 0o700, path: os.ModeSocket | 0o600} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v: want %v", p, fi.Mode(), err, want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if a := lis.Addr(); a.Network() != "unix" || a.String() != path {
		t.Errorf("Addr %s %s, want unix %s", a.Network(), a, path)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := Dial(context.Background(), "unix:"+path)
	if err != nil {
		t.Fatalf("Dial of the own uid's socket: %v", err)
	}
	s, ok := <-accepted
	if !ok {
		t.Fatal("Accept failed")
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s.Close()
	if _, err := Listen(path, nil); err == nil || !strings.Contains(err.Error(), "another server is listening there") {
		t.Errorf("a second server on a live socket: %v", err)
	}
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the socket is left after Close: %v", err)
	}

	t.Run("stale socket replaced", func(t *testing.T) {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		lis, err := Listen(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		lis.Close()
	})
	// a symbolic link to the directory is resolved once, before anything
	// is checked: the socket is bound and named in the directory checked
	// (review: re-pointing the link between the check and the bind moved
	// the socket where another user could replace it)
	t.Run("symlinked directory resolved", func(t *testing.T) {
		real := filepath.Join(base, "real")
		if err := os.Mkdir(real, 0o700); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(base, "link")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		lis, err := Listen(filepath.Join(link, "s.sock"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		if want := filepath.Join(real, "s.sock"); lis.Addr().String() != want {
			t.Errorf("Addr %s, want the resolved %s", lis.Addr(), want)
		}
	})
	t.Run("unix:///PATH", func(t *testing.T) {
		lis, err := Listen("//"+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if lis.Addr().String() != path {
			t.Errorf("Addr %s, want %s", lis.Addr(), path)
		}
		lis.Close()
	})
	for _, tc := range []struct {
		name string
		prep func(t *testing.T) string // the path to listen on
		says string
	}{
		{"relative", func(t *testing.T) string { return "s.sock" }, `socket path "s.sock": want an absolute path (unix:/PATH)`},
		{"not a socket", func(t *testing.T) string {
			p := filepath.Join(dir, "file")
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, "exists and is not a socket"},
		{"group-writable directory", func(t *testing.T) string {
			d := filepath.Join(base, "g")
			if err := os.Mkdir(d, 0o700); err != nil || os.Chmod(d, 0o770) != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "s")
		}, "is mode 0770: writable by group or others"},
		{"another user's directory", func(t *testing.T) string {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			d := filepath.Join(base, "u")
			if err := os.Mkdir(d, 0o700); err != nil || os.Chown(d, 65534, 65534) != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "s")
		}, "is owned by another user"},
		{"no parent", func(t *testing.T) string { return filepath.Join(base, "a", "b", "s") }, "no such file"},
		{"a directory above writable by all, not sticky", func(t *testing.T) string {
			w := filepath.Join(base, "w")
			if err := os.Mkdir(w, 0o700); err != nil || os.Chmod(w, 0o777) != nil {
				t.Fatal(err)
			}
			d := filepath.Join(w, "run")
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "s")
		}, "above it is writable by every user without the sticky bit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.prep(t)
			l, err := Listen(p, nil)
			if err == nil {
				l.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Listen(%s): %v, want an error saying %q", p, err, tc.says)
			}
		})
	}
}

// longDir makes a directory under base whose path is n bytes long.
func longDir(t *testing.T, base string, n int) string {
	t.Helper()
	pad := n - len(base) - 1
	if pad < 1 {
		t.Fatalf("base %s is too long for a %d-byte directory", base, n)
	}
	d := filepath.Join(base, strings.Repeat("d", pad))
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// A path that fits a socket address is served, however long, the
// temporary one it is bound at first included; one that does not is
// refused up front with its length and the limit (the kernel says only
// "invalid argument").
func TestListenPathLength(t *testing.T) {
	base, err := os.MkdirTemp("", "ul") // t.TempDir's name is long
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })

	// the directory as long as allowed: the temporary path DIR/.mXXXXXXXX/s
	// is 107 bytes; the socket's own path is shorter
	dir := longDir(t, base, MaxPath-len("/.m12345678/s"))
	path := filepath.Join(dir, "c.sock")
	l, err := Listen(path, nil)
	if err != nil {
		t.Fatalf("Listen(%s), %d bytes: %v", path, len(path), err)
	}
	l.Close()

	// the longest socket path: 107 bytes
	path = filepath.Join(dir, strings.Repeat("s", MaxPath-len(dir)-1))
	if l, err := Listen(path, nil); err != nil {
		t.Fatalf("Listen(%s), %d bytes: %v", path, len(path), err)
	} else {
		l.Close()
	}

	for _, tc := range []struct {
		name, path, says string
	}{
		{"the socket's path", path + "s", fmt.Sprintf("socket path %ss is 108 bytes: a Unix socket path may have at most 107 (sun_path, 108 bytes with its NUL)", path)},
		{"the temporary path", filepath.Join(longDir(t, base, MaxPath-len("/.m12345678/s")+1), "c.sock"),
			"/.mXXXXXXXX/s first, then renamed into place, and that path is 108 bytes: a Unix socket path may have at most 107"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := Listen(tc.path, nil)
			if err == nil {
				l.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Listen(%s): %v, want an error saying %q", tc.path, err, tc.says)
			}
			if !strings.Contains(err.Error(), tc.path) {
				t.Errorf("the error does not name the path %s: %v", tc.path, err)
			}
		})
	}
	if _, err := Dial(context.Background(), "unix:"+path+"s"); err == nil || !strings.Contains(err.Error(), "is 108 bytes") {
		t.Errorf("Dial of a 108-byte path: %v, want the length error", err)
	}
}

func TestPeerAllowed(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		says string
	}{{1000, ""}, {0, ""}, {1001, "peer pid 7 uid 1001: only uid 1000 (the server's) and root may use this socket"}} {
		err := peerAllowed(&syscall.Ucred{Pid: 7, Uid: tc.uid}, 1000)
		if (tc.says == "") != (err == nil) || (err != nil && err.Error() != tc.says) {
			t.Errorf("uid %d: %v, want %q", tc.uid, err, tc.says)
		}
	}
}

func TestServerUID(t *testing.T) {
	for _, tc := range []struct {
		server, client uint32
		says           string
	}{
		{1000, 1000, ""}, {0, 1000, ""}, {0, 0, ""},
		{1001, 1000, "unix:/run/mdag/coord.sock is served by uid 1001 (pid 7), not this user (uid 1000) or root: refusing to talk to it"},
		{1001, 0, "unix:/run/mdag/coord.sock is served by uid 1001 (pid 7), not root (this user): refusing to talk to it"},
	} {
		err := serverUID(&syscall.Ucred{Pid: 7, Uid: tc.server}, "unix:/run/mdag/coord.sock", int(tc.client))
		if (tc.says == "") != (err == nil) || (err != nil && err.Error() != tc.says) {
			t.Errorf("server uid %d, client uid %d: %v, want %q", tc.server, tc.client, err, tc.says)
		}
	}
}

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		addr, path string
		ok, target bool
	}{
		{"unix:/run/s", "/run/s", true, true},
		{"unix:///run/s", "/run/s", true, true},
		{"unix:rel/s", "rel/s", true, true},
		{"unix-abstract:x", "", false, true},
		{"127.0.0.1:7070", "", false, false},
		{"dns:///unix:7070", "", false, false},
	} {
		p, ok := Path(tc.addr)
		if p != tc.path || ok != tc.ok || IsTarget(tc.addr) != tc.target {
			t.Errorf("%s: Path %q %v, IsTarget %v; want %q %v, %v", tc.addr, p, ok, IsTarget(tc.addr), tc.path, tc.ok, tc.target)
		}
	}
	if _, err := Dial(context.Background(), "127.0.0.1:7070"); err == nil || !strings.Contains(err.Error(), `"127.0.0.1:7070" is not a Unix socket address`) {
		t.Errorf("Dial of a TCP address: %v", err)
	}
}

// gRPC hands Dial its unix targets as unix:///ABS, both for unix:/ABS and
// unix:///ABS; a server of this uid answers through it.
func TestDialGRPC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "g.sock")
	lis, err := Listen(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	defer func() {
		g.Stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, target := range []string{"unix:" + path, "unix://" + path} {
		t.Run(target, func(t *testing.T) {
			var mu sync.Mutex
			var dialed []string
			dial := func(ctx context.Context, addr string) (net.Conn, error) {
				mu.Lock()
				dialed = append(dialed, addr)
				mu.Unlock()
				return Dial(ctx, addr)
			}
			cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("Check over %s: %v, %v", target, r, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(dialed) == 0 || dialed[0] != "unix://"+path {
				t.Errorf("gRPC dialed %q, want unix://%s", dialed, path)
			}
		})
	}
}

// The helper process: this test binary run again as uid 65534, serving a
// socket (MDAG_UNIXSOCK_SERVE) or dialing one (MDAG_UNIXSOCK_DIAL).
func TestHelperProcess(t *testing.T) {
	if path := os.Getenv("MDAG_UNIXSOCK_SERVE"); path != "" {
		l, err := Listen(path, nil)
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
	if path := os.Getenv("MDAG_UNIXSOCK_DIAL"); path != "" {
		c, err := Dial(context.Background(), "unix:"+path)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(3)
		}
		c.SetReadDeadline(time.Now().Add(time.Minute))
		_, err = c.Read(make([]byte, 1))
		fmt.Println("read:", err)
		os.Exit(0)
	}
}

// A connection from another uid is closed at once and logged, even when
// the socket's mode and directory are loosened so that its connect
// succeeds: SO_PEERCRED is checked on every connection. (The peer, uid
// 65534, talks to a root's server: its Dial lets it.)
func TestListenPeerRefused(t *testing.T) {
	cmd, pub := testproc.AsNobody(t, "TestHelperProcess")
	logs := make(chanWriter, 16)
	path := filepath.Join(pub, "run", "infer.sock")
	lis, err := Listen(path, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	// loosen the file modes: only the peer check is left
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil || os.Chmod(path, 0o666) != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	cmd.Env = append(cmd.Env, "MDAG_UNIXSOCK_DIAL="+path)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "read: EOF") {
		t.Fatalf("the peer of uid 65534: %v: %s (want its connection closed: read: EOF)", err, out)
	}
	select {
	case rec := <-logs:
		if !strings.Contains(rec, "refused a connection") || !strings.Contains(rec, "uid 65534: only uid 0 (the server's) and root may use this socket") {
			t.Fatalf("log %q: want the refusal and its reason", rec)
		}
	case <-time.After(time.Minute):
		t.Fatal("no refusal logged in a minute")
	}
	select {
	case c := <-accepted:
		t.Fatalf("Accept returned %v for the refused peer", c)
	default:
	}
	// the server's own uid is still let in after a refusal
	c, err := Dial(context.Background(), "unix:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case a, ok := <-accepted:
		if !ok {
			t.Fatal("Accept failed")
		}
		a.Close()
	case <-time.After(time.Minute):
		t.Fatal("the server's own uid was not accepted in a minute")
	}
}

// serveAsNobody starts a server of uid 65534 on a socket (returned) in a
// directory of that uid; it stops at the test's end.
func serveAsNobody(t *testing.T) (path string, pid int) {
	t.Helper()
	cmd, pub := testproc.AsNobody(t, "TestHelperProcess")
	dir := filepath.Join(pub, "run")
	if err := os.Mkdir(dir, 0o700); err != nil || os.Chown(dir, 65534, 65534) != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "coord.sock")
	cmd.Env = append(cmd.Env, "MDAG_UNIXSOCK_SERVE="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the server of uid 65534: %v", err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("the server of uid 65534: %q, %v", line, err)
	}
	return path, cmd.Process.Pid
}

// A client refuses a socket another uid serves (another user bound the
// path first, say), before anything is sent; through gRPC too.
func TestDialRefusesAnotherUID(t *testing.T) {
	path, pid := serveAsNobody(t)
	want := fmt.Sprintf("unix:%s is served by uid 65534 (pid %d), not root (this user): refusing to talk to it", path, pid)
	// plain: the connect itself succeeds (root may connect anywhere)
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("the socket does not answer: %v", err)
	} else {
		c.Close()
	}
	if c, err := Dial(context.Background(), "unix:"+path); err == nil || err.Error() != want {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial: %v, want %q", err, want)
	}
	for _, target := range []string{"unix:" + path, "unix://" + path} {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(Dial))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		cc.Close()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("gRPC over %s: %v, want an error saying %q", target, err, want)
		}
	}
}
