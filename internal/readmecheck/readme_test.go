package readmecheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	text := "intro\n\n<!-- readme: run lines=1,3 each with=\"bin/mdag serve --example traffic\" -->\n```\na \\\n  b\n# note\nc\n```\n" +
		"<!-- readme: output -->\n```\nx 1\n```\n```yaml\nk: v\n```\n<!-- readme: skip needs a GPU -->\n```sh\ngpu\n```\n"
	bs, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 4 {
		t.Fatalf("%d blocks, want 4", len(bs))
	}
	if a := bs[0].Annot; a.Mode != "run" || !slices.Equal(a.Lines, []int{1, 3}) || !a.Each || a.With != "bin/mdag serve --example traffic" {
		t.Errorf("run annotation %+v", a)
	}
	if got := Commands(bs[0].Body); !slices.Equal(got, []string{"a b", "c"}) {
		t.Errorf("commands %q, want [a b] [c]", got)
	}
	if bs[1].Annot.Mode != "output" || bs[2].Annot.Mode != "" || bs[2].Checked() || bs[3].Annot.Why != "needs a GPU" || !bs[3].Checked() {
		t.Errorf("blocks %+v", bs[1:])
	}
	for _, bad := range []string{"<!-- readme: walk -->", "<!-- readme: skip -->", "<!-- readme: run lines=0 -->", "<!-- readme: output with=x -->", `<!-- readme: run with="x -->`} {
		if _, err := Parse(bad + "\n```\nx\n```\n"); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestMatch(t *testing.T) {
	got := "level=INFO msg=x\n== mdag demo summary (6s)\nframes: sent 60, finished 59, late 1\nre-allocations: 3 (plans by the kinds of event that asked for them: join 2, leave 1)\n"
	for _, c := range []struct {
		want []string
		ok   bool
	}{
		{[]string{"== mdag demo summary (30s)", "frames: sent 1301, finished 1301, late 0"}, true},
		{[]string{"re-allocations: 24 (plans by the kinds of event that asked for them: join 6, ...)"}, true},
		{[]string{"...", "frames:   sent 1,   finished 2,  late 3"}, true},
		{[]string{"frames: sent 1301, finished 1301, late 0", "== mdag demo summary (30s)"}, false}, // out of order
		{[]string{"frames: sent 1301, finished 1301"}, false},                                       // a line changed
		{[]string{"clients: 7 WHIP streams"}, false},
	} {
		if msg := Match(c.want, got); (msg == "") != c.ok {
			t.Errorf("Match(%q): %q, want ok %v", c.want, msg, c.ok)
		}
	}
}

func TestFlags(t *testing.T) {
	got := Flags("mdag allocate -f app.yaml --profiles p.yaml [--rate R | --streams N] [--scale MODULE=F ...]\n (--models m.yaml --model NAME) --rate 2")
	if want := []string{"--profiles", "--rate", "--streams", "--scale", "--models", "--model"}; !slices.Equal(got, want) {
		t.Errorf("Flags: %q, want %q", got, want)
	}
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func readme(t *testing.T) []Block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := Parse(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// TestREADMEAnnotated: every shell block of README.md says what the walk
// does with it, and an output block follows a run block or names its
// command; a new block without one fails here, so none goes unwalked by
// accident.
func TestREADMEAnnotated(t *testing.T) {
	prev := ""
	for _, b := range readme(t) {
		if !b.Checked() {
			continue
		}
		switch b.Annot.Mode {
		case "":
			t.Errorf("README.md:%d: a shell block without <!-- readme: run|output|synopsis|skip REASON --> before it", b.Line)
		case "output":
			if prev != "run" && b.Annot.Run == "" {
				t.Errorf("README.md:%d: an output block after a %q block: give it run=\"CMD\"", b.Line, prev)
			}
		}
		prev = b.Annot.Mode
	}
}

// Caps the walk puts on a reader's command so that make test stays short:
// what it checks is that each command works and prints what the README
// shows, not for how long.
const (
	maxDuration = 6 * time.Second
	maxClients  = 3
	streamFor   = 4 * time.Second // a client or source without --duration
	cmdTimeout  = 2 * time.Minute
)

// TestREADMECommands walks README.md's run, output and synopsis blocks in
// order, in one scratch directory (bin, examples, build and tools linked
// from the checkout), as a reader copying them would: each command must
// exit 0; servers (coordinator, worker, infer-server, serve without
// --duration) run in the background until their block ends and must not
// exit before; output blocks must match what their command printed
// (numbers aside: Match); a synopsis's flags must be the binary's. As
// root it runs in a network namespace of its own, so the commands'
// default ports (8080, 7070, 8001) are its own.
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's commands (about a minute)")
	}
	root, err := filepath.Abs(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "mdag")
	if os.Getenv("MDAG_README_NETNS") == "" {
		if _, err := os.Stat(bin); err != nil {
			build := exec.Command("go", "build", "-o", bin, "./cmd/mdag")
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("bin/mdag is missing and does not build (make build): %v\n%s", err, out)
			}
		}
		if unshare, err := exec.LookPath("unshare"); err == nil && os.Geteuid() == 0 && exec.Command(unshare, "--net", "--", "ip", "link", "set", "lo", "up").Run() == nil {
			// the walk again, in a network namespace of its own
			cmd := exec.Command(unshare, "--net", "--", os.Args[0], "-test.run=^TestREADMECommands$", "-test.v", "-test.timeout=10m")
			cmd.Env = append(os.Environ(), "MDAG_README_NETNS=1")
			out, err := cmd.CombinedOutput()
			t.Logf("in a network namespace:\n%s", out)
			if err != nil {
				t.Fatalf("the walk failed: %v", err)
			}
			return
		}
		t.Log("no network namespace (not root, no unshare or ip, or not allowed here): the commands run on this machine's loopback, and need their default ports free")
	} else if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("bringing up the namespace's loopback: %v: %s", err, out)
	}
	w := &walk{t: t, root: root, dir: t.TempDir()}
	for _, name := range []string{"bin", "examples", "build", "tools"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(w.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	var last string
	for _, b := range readme(t) {
		switch b.Annot.Mode {
		case "run":
			last = w.runBlock(b)
		case "output":
			got := last
			if b.Annot.Run != "" {
				got = w.foreground(b, b.Annot.Run)
			}
			if msg := Match(b.Body, got); msg != "" {
				t.Errorf("README.md:%d: %s\nthe whole output:\n%s", b.Line, msg, got)
			}
		case "synopsis":
			w.synopsis(b)
		}
	}
}

type walk struct {
	t    *testing.T
	root string
	dir  string
}

// rewrite is cmd as the walk runs it: make runs in the checkout; durations
// above maxDuration and client counts above maxClients are capped; skip
// says why a command is not run at all.
func (w *walk) rewrite(cmd string) (_ string, skip string) {
	cmd = stripComment(cmd)
	f := strings.Fields(cmd)
	if len(f) > 1 && f[0] == "make" {
		switch f[1] {
		case "build":
			return "", "bin/mdag is built already (make test builds it first)"
		case "test":
			return "", "make test is what runs this"
		case "demo":
			if !strings.Contains(cmd, "DURATION=") {
				cmd += " DURATION=" + maxDuration.String()
			}
		}
		cmd = "make -C " + w.root + " --no-print-directory" + strings.TrimPrefix(cmd, "make")
	}
	cmd = regexp.MustCompile(`(--duration[ =]|DURATION=)(\S+)`).ReplaceAllStringFunc(cmd, func(m string) string {
		i := strings.IndexAny(m, " =") + 1
		if d, err := time.ParseDuration(m[i:]); err == nil && d > maxDuration {
			return m[:i] + maxDuration.String()
		}
		return m
	})
	if (slices.Contains(f, "client") || slices.Contains(f, "source")) && !strings.Contains(cmd, "--duration") {
		cmd += " --duration " + streamFor.String()
	}
	cmd = regexp.MustCompile(`--clients[ =](\d+)`).ReplaceAllStringFunc(cmd, func(m string) string {
		var n int
		fmt.Sscanf(m[len("--clients "):], "%d", &n)
		return fmt.Sprintf("--clients %d", min(n, maxClients))
	})
	return cmd, ""
}

// stripComment drops a shell comment (# after a space, outside quotes)
// from the end of a command.
func stripComment(cmd string) string {
	var q byte
	for i := 0; i < len(cmd); i++ {
		switch c := cmd[i]; {
		case q != 0:
			if c == q {
				q = 0
			}
		case c == '\'' || c == '"':
			q = c
		case c == '#' && (i == 0 || cmd[i-1] == ' ' || cmd[i-1] == '\t'):
			return strings.TrimSpace(cmd[:i])
		}
	}
	return strings.TrimSpace(cmd)
}

// server reports whether cmd runs until stopped, and the TCP addresses it
// listens on that the walk waits for.
func server(cmd string) (bool, []string) {
	f := strings.Fields(cmd)
	i := slices.IndexFunc(f, func(s string) bool { return s == "bin/mdag" || s == "mdag" })
	if i < 0 || i+1 >= len(f) {
		return false, nil
	}
	flag := func(name, def string) string {
		for j, s := range f {
			if s == name && j+1 < len(f) {
				return f[j+1]
			}
			if v, ok := strings.CutPrefix(s, name+"="); ok {
				return v
			}
		}
		return def
	}
	switch f[i+1] {
	case "coordinator":
		return true, []string{flag("--grpc", "127.0.0.1:7070"), flag("--listen", "127.0.0.1:8080")}
	case "serve":
		if strings.Contains(cmd, "--duration") {
			return false, nil
		}
		return true, []string{flag("--listen", "127.0.0.1:8080")}
	case "infer-server":
		return true, []string{flag("--listen", "127.0.0.1:8001")}
	case "worker":
		return true, nil
	}
	return false, nil
}

type proc struct {
	cmd  string
	c    *exec.Cmd
	out  *syncBuf
	done chan struct{}
	err  error
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (w *walk) command(ctx context.Context, cmd string) *exec.Cmd {
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Dir = w.dir
	c.Env = append(os.Environ(), "PATH="+filepath.Join(w.dir, "bin")+":"+os.Getenv("PATH"))
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 5 * time.Second
	return c
}

// start runs a server in the background and waits for its addresses.
func (w *walk) start(b Block, cmd string, addrs []string) *proc {
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			w.t.Fatalf("README.md:%d: %s: %s is taken already, by an earlier command of the walk (give the block `each` if its lines are alternatives)", b.Line, cmd, a)
		}
	}
	p := &proc{cmd: cmd, out: &syncBuf{}, done: make(chan struct{})}
	p.c = w.command(context.Background(), cmd)
	p.c.Stdout, p.c.Stderr = p.out, p.out
	if err := p.c.Start(); err != nil {
		w.t.Fatalf("README.md:%d: %s: %v", b.Line, cmd, err)
	}
	go func() { p.err = p.c.Wait(); close(p.done) }()
	fail := func(format string, a ...any) {
		_ = syscall.Kill(-p.c.Process.Pid, syscall.SIGKILL) // not left holding its ports
		<-p.done
		w.t.Fatalf(format, a...)
	}
	deadline := time.Now().Add(time.Minute)
	for _, a := range addrs {
		for {
			if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
				c.Close()
				break
			}
			select {
			case <-p.done:
				w.t.Fatalf("README.md:%d: %s exited before listening on %s: %v\n%s", b.Line, cmd, a, p.err, p.out)
			case <-time.After(100 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				fail("README.md:%d: %s: not listening on %s after a minute\n%s", b.Line, cmd, a, p.out)
			}
		}
	}
	return p
}

// stop ends a server (SIGINT, then SIGKILL after 10 s); it must still
// have been running.
func (w *walk) stop(b Block, p *proc) {
	select {
	case <-p.done:
		w.t.Errorf("README.md:%d: %s exited before its block ended: %v\n%s", b.Line, p.cmd, p.err, p.out)
		return
	default:
	}
	_ = syscall.Kill(-p.c.Process.Pid, syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.c.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// foreground runs cmd (rewritten) to its end: it must exit 0.
func (w *walk) foreground(b Block, cmd string) string {
	cmd, skip := w.rewrite(cmd)
	if skip != "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	c := w.command(ctx, cmd)
	var out syncBuf
	c.Stdout, c.Stderr = &out, &out
	start := time.Now()
	err := c.Run()
	w.t.Logf("README.md:%d: %s (%.1f s)", b.Line, cmd, time.Since(start).Seconds())
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("still running after %v", cmdTimeout)
		}
		w.t.Errorf("README.md:%d: %s: %v\n%s", b.Line, cmd, err, out.String())
	}
	return out.String()
}

// runBlock runs a run block's commands (its with= server first) and
// returns what the foreground ones printed.
func (w *walk) runBlock(b Block) string {
	var servers []*proc
	defer func() {
		for _, p := range slices.Backward(servers) {
			w.stop(b, p)
		}
	}()
	if b.Annot.With != "" {
		cmd, _ := w.rewrite(b.Annot.With)
		_, addrs := server(cmd)
		servers = append(servers, w.start(b, cmd, addrs))
	}
	var out strings.Builder
	for i, cmd := range Commands(b.Body) {
		if b.Annot.Lines != nil && !slices.Contains(b.Annot.Lines, i+1) {
			continue
		}
		if bg, addrs := server(cmd); bg {
			rc, skip := w.rewrite(cmd)
			if skip == "" {
				p := w.start(b, rc, addrs)
				if b.Annot.Each {
					w.stop(b, p)
				} else {
					servers = append(servers, p)
				}
			}
			continue
		}
		out.WriteString(w.foreground(b, cmd))
	}
	return out.String()
}

// synopsis checks that each --flag of a usage block is one of its
// command's (`mdag CMD -h`).
func (w *walk) synopsis(b Block) {
	text := strings.Join(b.Body, "\n")
	f := strings.Fields(text)
	if len(f) < 2 || f[0] != "mdag" {
		w.t.Errorf("README.md:%d: a synopsis starts with mdag CMD", b.Line)
		return
	}
	help, _ := w.command(context.Background(), "bin/mdag "+f[1]+" -h").CombinedOutput()
	for _, fl := range Flags(text) {
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(fl[2:]) + `\b`).Match(help) {
			w.t.Errorf("README.md:%d: mdag %s has no flag %s (mdag %s -h)", b.Line, f[1], fl, f[1])
		}
	}
}

func TestStripComment(t *testing.T) {
	for in, want := range map[string]string{
		"make demo    # build, run": "make demo",
		`mdag x --p 'a # b' # c`:    `mdag x --p 'a # b'`,
		"mdag x --color=#fff":       "mdag x --color=#fff",
		"# all":                     "",
	} {
		if got := stripComment(in); got != want {
			t.Errorf("stripComment(%q) = %q, want %q", in, got, want)
		}
	}
}
