//go:build !lean

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The live tests here check behaviour with bounds that hold under -race
// on a busy machine; their speed figures are these benchmarks, each
// iteration one run of the test's workload on the real clock. Run one on
// demand, e.g.
//
//	go test -run '^$' -bench BenchmarkClientServe -benchtime 1x -count 5 ./cmd/mdag

// BenchmarkDemo is TestDemo's figure without the browser: the finish rate
// in the summary of `make demo DURATION=30s` (the README says >= 95%).
func BenchmarkDemo(b *testing.B) {
	for range b.N {
		cmd := exec.Command("make", "-C", repoRoot(), "--no-print-directory", "demo", "DURATION=30s", "DEMO_FLAGS=--listen 127.0.0.1:0")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			b.Fatalf("make demo: %v\n%s\n%s", err, out.String(), lastLines(errb.String(), 20))
		}
		rate, err := demoFinishRate(out.String())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(rate, "finish-%")
	}
}

// BenchmarkClientServe is TestClientServe's figures: `mdag serve` and
// `mdag client` (two WHIP streams of the test pattern at 10 fps for 4 s)
// as separate processes; the clients' finish rate (>= 90% on an idle
// machine) and the share of ingested frames answered before the client
// stopped waiting (>= 90%).
func BenchmarkClientServe(b *testing.B) {
	dir := b.TempDir()
	bin := filepath.Join(dir, "mdag")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("t0ken-1-abcdefghij\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		url, stop := benchServe(b, bin, tokens)
		cmd := exec.Command(bin, "client", "--server", url, "--app", "traffic", "--clients", "2", "--fps", "10", "--size", "320x240", "--duration", "4s", "-o", "json")
		cmd.Env = append(os.Environ(), "MDAG_TOKEN=t0ken-1-abcdefghij")
		out, err := cmd.Output()
		stop()
		var sum struct {
			Total clientSummary `json:"total"`
		}
		if err != nil || json.Unmarshal(out, &sum) != nil || sum.Total.Ingested == 0 {
			b.Fatalf("client: %v, output %q", err, out)
		}
		b.ReportMetric(100*sum.Total.FinishRate, "finish-%")
		b.ReportMetric(100*float64(sum.Total.Results)/float64(sum.Total.Ingested), "answered-%")
	}
}

// benchServe starts `mdag serve` as TestClientServe does and returns its
// URL and a func that kills it (idempotent; also run when the benchmark
// ends).
func benchServe(b *testing.B, bin, tokens string) (string, func()) {
	b.Helper()
	cmd := exec.Command(bin, "serve", "--example", "traffic", "--listen", "127.0.0.1:0", "--token-file", tokens, "--cpu-machine=false")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	se, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	addr := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		re := regexp.MustCompile(`status=http://(\S+)/v1/status`)
		sc := bufio.NewScanner(se)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
	}()
	stop := sync.OnceFunc(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-read
		_ = cmd.Wait()
	})
	b.Cleanup(stop)
	select {
	case a := <-addr:
		return "http://" + a, stop
	case <-time.After(20 * time.Second):
		b.Fatal("serve did not start")
		return "", stop
	}
}
