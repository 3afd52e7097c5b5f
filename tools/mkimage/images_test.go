package main

// TestImages (make image-test; MDAG_IMAGE_TEST=1) runs the images make
// images built: each image's layers unpacked (mutate.Extract) into a
// rootfs, each process started in it as Kubernetes would with the
// manifests' securityContext: uid and gid 65532, a read-only root
// filesystem, an empty tmpfs at /tmp. Without a container runtime: a
// mount and PID namespace (unshare), the rootfs bind-mounted read-only,
// /proc, /tmp and /dev mounted, then chroot --userspec. It needs root.

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/mdag/mdag/api/kserve"
)

// imageDir is where make images put the archives.
func imageDir() string {
	if d := os.Getenv("MDAG_IMAGE_DIR"); d != "" {
		return d
	}
	return "../../build/images"
}

func TestImages(t *testing.T) {
	if os.Getenv("MDAG_IMAGE_TEST") == "" {
		t.Skip("MDAG_IMAGE_TEST=1 runs the images make images built (make image-test)")
	}
	if os.Getuid() != 0 {
		t.Fatal("TestImages needs root: it mounts (unshare --mount) and chroots")
	}
	for _, tool := range []string{"unshare", "mount", "chroot"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s: %v (util-linux, coreutils)", tool, err)
		}
		if tool == "chroot" {
			chrootPath = p
		}
	}
	digests, err := os.ReadFile(filepath.Join(imageDir(), "digests.txt"))
	if err != nil {
		t.Fatalf("%v: make images first", err)
	}
	d, err := parseDigests(digests)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("mdag-lean", func(t *testing.T) {
		root, label := unpack(t, "mdag-lean", d)
		checkVersion(t, root, label, "lean")
		// the onnx executor's test app and model, mounted read-only at
		// /models as the manifests mount the models
		dir := t.TempDir()
		copyFile(t, "../../cmd/mdag/testdata/onnx/app.yaml", filepath.Join(dir, "app.yaml"))
		copyFile(t, "../../cmd/mdag/testdata/onnx/profiles.yaml", filepath.Join(dir, "profiles.yaml"))
		copyFile(t, "../../gpu/onnx/testdata/tiny-classifier.onnx", filepath.Join(dir, "tiny-classifier.onnx"))
		b, err := os.ReadFile("../../cmd/mdag/testdata/onnx/models.yaml")
		if err != nil {
			t.Fatal(err)
		}
		models := regexp.MustCompile(`file: .*`).ReplaceAll(b, []byte("file: /models/tiny-classifier.onnx"))
		if err := os.WriteFile(filepath.Join(dir, "models.yaml"), models, 0o644); err != nil {
			t.Fatal(err)
		}
		mounts := []mount{mountAt(t, root, "/models", dir)}
		loopback(t, root, mounts, []string{"-f", "/models/app.yaml", "-p", "/models/profiles.yaml"},
			[][]string{{"--type", "ORT", "--executor", "onnx", "--models", "/models/models.yaml", "--intra-threads", "1"}}, "tiny-onnx")
	})
	t.Run("mdag", func(t *testing.T) {
		root, label := unpack(t, "mdag", d)
		checkVersion(t, root, label, "full")
		loopback(t, root, nil, []string{"--example", "traffic"},
			[][]string{{"--type", "V100"}, {"--type", "CPU"}}, "traffic")
		// an OpenCV op (resize) on a CPU module, served in one process
		b, err := os.ReadFile("../../examples/face/app.yaml")
		if err != nil {
			t.Fatal(err)
		}
		resize := strings.NewReplacer("op: crop", "op: resize", "params: {pad: 16}", "params: {width: 64, height: 64}").Replace(string(b))
		if !strings.Contains(resize, "op: resize") {
			t.Fatal("examples/face/app.yaml has no crop op to replace with resize")
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "app.yaml"), []byte(resize), 0o644); err != nil {
			t.Fatal(err)
		}
		copyFile(t, "../../examples/face/profiles.yaml", filepath.Join(dir, "profiles.yaml"))
		app := []mount{mountAt(t, root, "/app", dir)}
		out := runIn(t, root, app, 60*time.Second, binPath, "serve", "-f", "/app/app.yaml", "-p", "/app/profiles.yaml",
			"--synthetic", "2", "--duration", "3s", "--listen", "127.0.0.1:0")
		if n := finished(out); n == 0 {
			t.Fatalf("serve with the OpenCV op resize finished no frame:\n%s", out)
		} else {
			t.Logf("serve with the OpenCV op resize: %d frames finished", n)
		}
	})
	t.Run("mdag-whip", func(t *testing.T) {
		// WHIP ingest in the image: VP8 from the host's client (the same
		// full build), decoded by the image's libvpx
		root, _ := unpack(t, "mdag", d)
		srv := start(t, root, nil, "serve", binPath, "serve", "--example", "traffic", "--listen", "127.0.0.1:0", "--duration", "120s")
		line := srv.waitFor(t, regexp.MustCompile(`msg=serving .* status=(http://\S+)/v1/status`), 60*time.Second)
		server := line[1]
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(imageDir(), "bin", "mdag"), "client", "--app", "traffic", "--server", server, "--duration", "4s").CombinedOutput()
		if err != nil {
			t.Fatalf("mdag client into the image's WHIP endpoint: %v\n%s", err, out)
		}
		poll(t, "WHIP frames finished", 60*time.Second, func() (bool, string) {
			st, err := exec.Command(filepath.Join(imageDir(), "bin", "mdag-lean"), "status", "--server", server).CombinedOutput()
			return err == nil && regexp.MustCompile(`(?m)^ *frames sent [0-9]+, finished [1-9][0-9]*,`).Match(st), string(st)
		})
		srv.checkCreds(t)
		t.Logf("WHIP: mdag client streamed VP8 into serve in the image; frames finished")
	})
	t.Run("mdag-torch-runner", func(t *testing.T) {
		root, _ := unpack(t, "mdag-torch-runner", d)
		// uid, groups, read-only root, writable /tmp, as the runner sees them
		out := runIn(t, root, nil, 60*time.Second, "python3", "-c",
			"import os, sys\nprint('uid', os.getuid(), os.getgid(), os.getgroups())\n"+
				"try:\n  open('/etc/x', 'w')\nexcept OSError as e:\n  print('root', e.strerror)\n"+
				"open('/tmp/x', 'w').write('x'); print('tmp ok', os.environ['HOME'])\n"+
				"import torch, torchvision, grpc, google.protobuf, numpy; print('imports ok', torch.__version__)")
		for _, want := range []string{"uid 65532 65532 [", "root Read-only file system", "tmp ok /tmp", "imports ok"} {
			if !strings.Contains(out, want) {
				t.Errorf("python3 in mdag-torch-runner: no %q in\n%s", want, out)
			}
		}
		if g := regexp.MustCompile(`uid 65532 65532 \[([^\]]*)\]`).FindStringSubmatch(out); g != nil && g[1] != "" && g[1] != "65532" {
			t.Errorf("supplementary groups %s, want none or 65532", g[1])
		}
		p := start(t, root, nil, "runner", "python3", runnerEntry, "--listen", "127.0.0.1:0", "--device", "cpu")
		line := p.waitFor(t, regexp.MustCompile(`runner: listening on (127\.0\.0\.1:\d+)`), 120*time.Second)
		cc, err := grpc.NewClient(line[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := kserve.NewGRPCInferenceServiceClient(cc)
		ready, err := c.ServerReady(ctx, &kserve.ServerReadyRequest{})
		if err != nil || !ready.Ready {
			t.Fatalf("the runner's ServerReady: %v, %v", ready, err)
		}
		live, err := c.ServerLive(ctx, &kserve.ServerLiveRequest{})
		if err != nil || !live.Live {
			t.Fatalf("the runner's ServerLive: %v, %v", live, err)
		}
		p.checkCreds(t)
		t.Logf("runner at %s: ready and live, as uid 65532", line[1])
	})
}

// rootfs is an unpacked image: its directory and its config's Env, the
// environment its processes get.
type rootfs struct {
	dir string
	env []string
}

// unpack extracts an image into a fresh rootfs and returns it with the
// image's version label.
func unpack(t *testing.T, name string, digests map[string]string) (rootfs, string) {
	t.Helper()
	img, err := readArchive(filepath.Join(imageDir(), name+".oci.tar"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d.String() != digests[name] {
		t.Fatalf("%s.oci.tar holds %s, digests.txt says %s", name, d, digests[name])
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532", name, cf.Config.User)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := extract(rc, root); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	checkWritable(t, root)
	return rootfs{dir: root, env: cf.Config.Env}, cf.Config.Labels["org.opencontainers.image.version"]
}

// extract writes a flattened image tar (mutate.Extract) under root.
func extract(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q leaves the rootfs", h.Name)
		}
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode).Perm()
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		if h.Mode&0o4000 != 0 {
			mode |= os.ModeSetuid
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
			continue
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %c", h.Name, h.Typeflag)
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
}

// checkWritable: no world-writable path in the rootfs but /tmp (1777, empty).
func checkWritable(t *testing.T, root string) {
	t.Helper()
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if fi.Mode().Perm()&0o002 == 0 {
			return nil
		}
		if rel != "tmp" {
			t.Errorf("/%s is world-writable (%s)", rel, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "tmp"))
	if err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp: %v %v, want drwxrwxrwt", fi, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) > 0 {
		t.Errorf("/tmp holds %d entries, want none", len(ents))
	}
}

// mount is a host directory bound read-only into the rootfs.
type mount struct{ src, dst string }

// mountAt makes the mount point dst in the rootfs for host directory src.
func mountAt(t *testing.T, root rootfs, dst, src string) mount {
	t.Helper()
	abs, err := filepath.Abs(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root.dir, dst), 0o755); err != nil {
		t.Fatal(err)
	}
	return mount{abs, dst}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// inImageScript is run by sh in a new mount and PID namespace:
// $1 the rootfs, $2 the read-only binds ("src:dst ..."), $3 the host's
// chroot (the image's PATH lacks /usr/sbin), then the command.
const inImageScript = `set -e
r=$1; binds=$2; chroot=$3; shift 3
mount --bind "$r" "$r"
mount -o remount,bind,ro "$r"
mount -t proc proc "$r/proc"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
mount --rbind /dev "$r/dev"
for b in $binds; do mount --bind "${b%%:*}" "$r${b#*:}"; mount -o remount,bind,ro "$r${b#*:}"; done
exec "$chroot" --userspec=65532:65532 "$r" "$@"
`

// chrootPath is the host's chroot, found by TestImages.
var chrootPath = "/usr/sbin/chroot"

func command(root rootfs, mounts []mount, args ...string) *exec.Cmd {
	var binds []string
	for _, m := range mounts {
		binds = append(binds, m.src+":"+m.dst)
	}
	cmd := exec.Command("unshare", append([]string{"--mount", "--pid", "--fork", "--propagation", "private",
		"sh", "-c", inImageScript, "sh", root.dir, strings.Join(binds, " "), chrootPath}, args...)...)
	cmd.Env = root.env
	return cmd
}

// runIn runs a command in the image to its end, returning its output.
func runIn(t *testing.T, root rootfs, mounts []mount, limit time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := command(root, mounts, args...)
	env := cmd.Env
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", args, root, err, out)
	}
	return string(out)
}

// proc is a process running in an image.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	line chan string
	done chan error
}

func start(t *testing.T, root rootfs, mounts []mount, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: command(root, mounts, args...), line: make(chan string, 1024), done: make(chan error, 1)}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.line <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		err := p.cmd.Wait()
		w.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("--- %s output:\n%s", p.name, p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// waitFor waits for a line matching re and returns its submatches.
func (p *proc) waitFor(t *testing.T, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case l := <-p.line:
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited (%v) before printing %s:\n%s", p.name, err, re, p.output())
		case <-deadline:
			t.Fatalf("%s printed no %s in %s:\n%s", p.name, re, limit, p.output())
		}
	}
}

// child is the host PID of the process in the image: unshare's child.
func (p *proc) child() (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.cmd.Process.Pid, p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0, fmt.Errorf("unshare %d has children %q, want one", p.cmd.Process.Pid, f)
	}
	return strconv.Atoi(f[0])
}

// signal sends sig to the process in the image (PID 1 of its namespace;
// unshare does not forward signals).
func (p *proc) signal(sig syscall.Signal) {
	if pid, err := p.child(); err == nil {
		syscall.Kill(pid, sig)
	}
	if sig == syscall.SIGKILL {
		p.cmd.Process.Kill()
	}
}

// checkCreds reads the process's credentials from the host's /proc.
func (p *proc) checkCreds(t *testing.T) {
	t.Helper()
	pid, err := p.child()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"Uid:\t65532\t65532\t65532\t65532", "Gid:\t65532\t65532\t65532\t65532", "CapEff:\t0000000000000000"} {
		if !strings.Contains(s, want) {
			t.Errorf("%s (pid %d): no %q in its /proc status", p.name, pid, want)
		}
	}
	if g := regexp.MustCompile(`(?m)^Groups:\t(.*)$`).FindStringSubmatch(s); g != nil && strings.TrimSpace(g[1]) != "" && strings.TrimSpace(g[1]) != "65532" {
		t.Errorf("%s: supplementary groups %q, want none or 65532", p.name, g[1])
	}
}

func checkVersion(t *testing.T, root rootfs, label, build string) {
	t.Helper()
	out := runIn(t, root, nil, 30*time.Second, binPath, "version")
	if label == "" || !strings.Contains(out, "source "+label+")") || !strings.Contains(out, "("+build+" build: ") {
		t.Fatalf("mdag version in the image: want the %s build and source %q (the image's version label):\n%s", build, label, out)
	}
	if !strings.Contains(out, ortPath) || strings.Contains(out, "not found") {
		t.Errorf("mdag version: want ONNX Runtime at %s:\n%s", ortPath, out)
	}
	t.Logf("%s", strings.SplitN(out, "\n", 2)[0])
}

var framesLine = regexp.MustCompile(`(?m)^ *frames sent [0-9]+, finished ([0-9]+),`)

func finished(out string) int {
	m := framesLine.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// loopback runs a coordinator, one worker per args given and a source in
// the image (each its own process, namespace and read-only root, talking
// over loopback TCP) and waits for the coordinator's status to show
// frames finished.
func loopback(t *testing.T, root rootfs, mounts []mount, appArgs []string, workers [][]string, app string) {
	t.Helper()
	coord := start(t, root, mounts, "coordinator", append(append([]string{binPath, "coordinator"}, appArgs...),
		"--grpc", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--heartbeat", "200ms", "--duration", "120s")...)
	line := coord.waitFor(t, regexp.MustCompile(`msg=coordinating .*`), 60*time.Second)[0]
	g := regexp.MustCompile(` grpc=(\S+)`).FindStringSubmatch(line)
	s := regexp.MustCompile(` status=(http://\S+)/v1/status`).FindStringSubmatch(line)
	if g == nil || s == nil {
		t.Fatalf("no gRPC or status address in the coordinator's log line %q", line)
	}
	grpcAddr, server := g[1], s[1]
	for i, w := range workers {
		start(t, root, mounts, fmt.Sprintf("worker-%d", i), append([]string{binPath, "worker", "--coordinator", grpcAddr,
			"--id", fmt.Sprintf("image-test-%d", i), "--duration", "120s"}, w...)...)
	}
	instances := regexp.MustCompile(`(?s)INSTANCE.*`)
	poll(t, "workers registered", 60*time.Second, func() (bool, string) {
		out, err := exec.Command(filepath.Join(imageDir(), "bin", "mdag-lean"), "status", "--server", server).CombinedOutput()
		if err != nil || !instances.Match(out) {
			return false, string(out)
		}
		n := 0
		in := false
		for _, l := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(l, "INSTANCE"):
				in = true
			case strings.HasPrefix(l, "last re-plans"):
				in = false
			case in && strings.TrimSpace(l) != "":
				n++
			}
		}
		return n >= len(workers), string(out)
	})
	src := runIn(t, root, mounts, 60*time.Second, binPath, "source", "--coordinator", grpcAddr, "--app", app,
		"--streams", "2", "--fps", "10", "--duration", "3s")
	if !strings.Contains(src, "frames accepted") {
		t.Fatalf("source: no frames accepted:\n%s", src)
	}
	done := regexp.MustCompile(`(?m)^ *frames sent [0-9]+, finished [1-9][0-9]*,.* open 0;`)
	poll(t, "frames finished", 60*time.Second, func() (bool, string) {
		out, err := exec.Command(filepath.Join(imageDir(), "bin", "mdag-lean"), "status", "--server", server).CombinedOutput()
		return err == nil && done.Match(out), string(out)
	})
	coord.checkCreds(t)
	coord.signal(syscall.SIGTERM)
	select {
	case err := <-coord.done:
		coord.done <- err
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the coordinator did not stop within 30 s of SIGTERM")
	}
	if n := finished(coord.output()); n == 0 {
		t.Fatalf("the coordinator's summary shows no frame finished:\n%s", coord.output())
	} else {
		t.Logf("%s: coordinator + %d workers + source in the image, %d frames finished", app, len(workers), n)
	}
}

// poll calls f every 100 ms until it reports true; fails after limit with
// f's last output.
func poll(t *testing.T, what string, limit time.Duration, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, out := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last:\n%s", limit, what, out)
		}
		<-tick.C
	}
}
