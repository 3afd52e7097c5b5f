package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// TestWorkerIngestFlags: the worker's ingest flags, each problem said
// with the flag's name; --udp-ports and --public-ip parsed for the WHIP
// streams the coordinator hands an ingest worker.
func TestWorkerIngestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // in the error; "" none
		net  whipNet
	}{
		{[]string{"--ingest-listen", "127.0.0.1:0"}, "", whipNet{}},
		{[]string{"--ingest-listen", "127.0.0.1:0", "--udp-ports", "40000-40100", "--public-ip", "203.0.113.7"}, "", whipNet{40000, 40100, "203.0.113.7"}},
		{[]string{"--udp-ports", "40000-40100"}, "give --ingest-listen", whipNet{}},
		{[]string{"--ingest-listen", "127.0.0.1:0", "--udp-ports", "40100-40000"}, `--udp-ports "40100-40000": want MIN-MAX`, whipNet{}},
		{[]string{"--ingest-listen", "127.0.0.1:0", "--udp-ports", "0-10"}, "want MIN-MAX", whipNet{}},
		{[]string{"--ingest-listen", "127.0.0.1:0", "--public-ip", "example.com"}, `--public-ip "example.com": not an IP address`, whipNet{}},
		{[]string{"--ingest-advertise", "127.0.0.1:9"}, "--ingest-advertise without --ingest-listen", whipNet{}},
	} {
		if !workerTakesWhip && c.net != (whipNet{}) {
			continue // the lean build refuses them
		}
		fs := flag.NewFlagSet("worker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f := addPeerFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		errs := f.check("127.0.0.1:7070", false)
		var got []string
		for _, e := range errs {
			got = append(got, e.Error())
		}
		all := strings.Join(got, "; ")
		switch {
		case c.want == "" && len(errs) > 0:
			t.Errorf("%v: %s", c.args, all)
		case c.want != "" && !strings.Contains(all, c.want):
			t.Errorf("%v: %q, want %q", c.args, all, c.want)
		case c.want == "" && f.whipNet != c.net:
			t.Errorf("%v: %+v, want %+v", c.args, f.whipNet, c.net)
		}
	}
}
