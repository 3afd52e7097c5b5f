package main

import (
	"bytes"
	"maps"
	"strings"
	"testing"

	"github.com/mdag/mdag/profile"
)

func TestParseMaxWorkers(t *testing.T) {
	cases := []struct {
		in   string
		want map[profile.WorkerTypeID]int
		err  string
	}{
		{"", nil, ""},
		{"P100=8,CPU=4", map[profile.WorkerTypeID]int{"P100": 8, "CPU": 4}, ""},
		{" V100=0 ", map[profile.WorkerTypeID]int{"V100": 0}, ""},
		{"P100", nil, `"P100": want TYPE=N`},
		{"=3", nil, `"=3": want TYPE=N`},
		{"CPU=-1", nil, `"CPU=-1": want a count >= 0`},
		{"CPU=x", nil, `"CPU=x": want a count >= 0`},
		{"CPU=1,CPU=2", nil, "type CPU named twice"},
	}
	for _, c := range cases {
		got, err := parseMaxWorkers(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseMaxWorkers(%q): %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, c.want) {
			t.Errorf("parseMaxWorkers(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

// The provisioner flags are checked before anything starts.
func TestCoordinatorProvisionerFlags(t *testing.T) {
	cases := []struct{ args, want string }{
		{"--provisioner docker", `--provisioner "docker": want none or kubernetes`},
		{"--max-workers CPU=2", "--max-workers needs --provisioner kubernetes"},
		{"--namespace x", "--namespace needs --provisioner kubernetes"},
		{"--provisioner kubernetes --max-workers CPU", `--max-workers "CPU": "CPU": want TYPE=N`},
		{"--provisioner kubernetes --start-timeout 0s", "--start-timeout 0s: want > 0"},
		{"--provisioner kubernetes --kubeconfig /nonexistent/kubeconfig", `kubernetes client config (--kubeconfig "/nonexistent/kubeconfig")`},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		args := append([]string{"coordinator", "--example", "traffic", "--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, strings.Fields(c.args)...)
		code := run(args, &out, &errb)
		if code != exitInvalid || !strings.Contains(errb.String(), c.want) {
			t.Errorf("mdag %s: exit %d, stderr %q; want exit %d and %q", strings.Join(args, " "), code, errb.String(), exitInvalid, c.want)
		}
	}
}
