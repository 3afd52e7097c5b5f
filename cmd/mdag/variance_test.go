package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestVarianceFlag: --variance reads a model or refuses it naming the bad
// part, defaults to realistic (the help says so, serve logs it), and is
// refused with a real executor, which varies by itself.
func TestVarianceFlag(t *testing.T) {
	for _, tc := range []struct {
		args string
		want []string // in stderr
	}{
		{"serve --example traffic --variance jitter=lots", []string{`"jitter=lots"`, "not a number"}},
		{"serve --example traffic --variance fast", []string{`"fast"`, "not a preset"}},
		{"serve --example traffic --executor onnx --variance exact", []string{"--variance", "--executor onnx"}},
		{"worker --type V100 --executor onnx --variance realistic", []string{"--variance", "--executor onnx"}},
		{"worker --type V100 --variance stall=2x2", []string{`"stall=2x2"`}},
	} {
		var out, errb bytes.Buffer
		if code := run(strings.Fields(tc.args), &out, &errb); code != exitInvalid {
			t.Errorf("%s: exit %d, want %d: %s", tc.args, code, exitInvalid, errb.String())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errb.String(), w) {
				t.Errorf("%s: stderr %q lacks %q", tc.args, errb.String(), w)
			}
		}
	}
	for _, cmd := range []string{"serve", "worker"} {
		var out, errb bytes.Buffer
		run([]string{cmd, "-h"}, &out, &errb)
		if h := errb.String(); !strings.Contains(h, "-variance") || !strings.Contains(h, "(default realistic)") {
			t.Errorf("%s -h does not show --variance defaulting to realistic:\n%s", cmd, h)
		}
	}
	if testing.Short() {
		return
	}
	var out, errb bytes.Buffer
	if code := run(strings.Fields("serve --example face --synthetic 1 --duration 1s --listen 127.0.0.1:0 --variance realistic,seed=3"), &out, &errb); code != exitOK {
		t.Fatalf("serve --variance realistic,seed=3: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), `variance="jitter=0.1,stall=0.005x3,cold=1.5@5s,shape=1.5,seed=3"`) {
		t.Errorf("serve does not log the variance it runs:\n%s", errb.String())
	}
}
