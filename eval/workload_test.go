package eval

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/examples"
)

func TestParseTrace(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		counts   []int
		period   time.Duration
		err      string
	}{
		{name: "ok", in: "# made by\nt_s,objects\n0.000,2\n0.100,0\n0.200,5\n", counts: []int{2, 0, 5}, period: 100 * time.Millisecond},
		{name: "crlf and blank lines", in: "t_s,objects\r\n\r\n0,1\r\n0.5,3\r\n", counts: []int{1, 3}, period: 500 * time.Millisecond},
		{name: "no header", in: "0,1\n0.1,2\n", err: "x.csv:1: header"},
		{name: "bad count", in: "t_s,objects\n0,1\n0.1,-2\n", err: "x.csv:3: objects"},
		{name: "bad time", in: "t_s,objects\n0,1\nsoon,2\n", err: "x.csv:3: time"},
		{name: "backwards", in: "t_s,objects\n0.2,1\n0.1,2\n", err: "x.csv:3: time 0.1 does not follow 0.2"},
		{name: "no comma", in: "t_s,objects\n0 1\n", err: "x.csv:2:"},
		{name: "one sample", in: "t_s,objects\n0,1\n", err: "1 samples"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ParseTrace("x.csv", []byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tr.Period != tc.period || len(tr.Counts) != len(tc.counts) {
				t.Fatalf("period %v counts %v, want %v %v", tr.Period, tr.Counts, tc.period, tc.counts)
			}
			for i, c := range tc.counts {
				if tr.Counts[i] != c {
					t.Fatalf("counts %v, want %v", tr.Counts, tc.counts)
				}
			}
			if got := tr.At(tc.period * time.Duration(len(tc.counts))); got != tc.counts[0] {
				t.Fatalf("At one length in: %d, want the first count (the trace loops)", got)
			}
		})
	}
}

// Every committed trace parses, at 10 samples per second.
func TestCommittedTracesParse(t *testing.T) {
	names := examples.Traces()
	if len(names) < 5 {
		t.Fatalf("traces %v", names)
	}
	for _, n := range names {
		tr, err := LoadTrace(n)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Period != 100*time.Millisecond || tr.Mean() <= 0 {
			t.Fatalf("%s: period %v, mean %v", n, tr.Period, tr.Mean())
		}
	}
	if _, err := LoadTrace("nope"); err == nil || !strings.Contains(err.Error(), "vtest-hog") {
		t.Fatalf("unknown trace: %v", err)
	}
}

func FuzzParseTrace(f *testing.F) {
	f.Add([]byte("t_s,objects\n0,1\n0.1,2\n"))
	f.Add([]byte("# c\nt_s,objects\n0.000,2\n0.100,1\n0.200,0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ParseTrace("fuzz.csv", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.csv") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		if len(tr.Counts) < 2 || tr.Period <= 0 {
			t.Fatalf("accepted %d samples at period %v", len(tr.Counts), tr.Period)
		}
		_ = tr.At(time.Hour)
	})
}

// Draw keeps to its spec, and a seed draws the same workload every time.
func TestDraw(t *testing.T) {
	setup, err := Setup("tracker")
	if err != nil {
		t.Fatal(err)
	}
	_, _, w, err := setup.Load(1000*time.Second, 12, 5)
	if err != nil {
		t.Fatal(err)
	}
	_, _, again, _ := setup.Load(1000*time.Second, 12, 5)
	_, _, other, _ := setup.Load(1000*time.Second, 12, 6)
	if len(w.Clients) != 12 {
		t.Fatalf("%d clients", len(w.Clients))
	}
	same := true
	for i, c := range w.Clients {
		if c.FPS < 15 || c.FPS > 40 || c.Join < 0 || c.Join >= 500*time.Second || c.Leave <= c.Join || c.Leave > 1000*time.Second ||
			c.Leave-c.Join < 250*time.Second && c.Leave != 1000*time.Second {
			t.Fatalf("client %+v out of the spec", c)
		}
		if again.Clients[i] != c {
			t.Fatalf("the same seed drew %+v and %+v", c, again.Clients[i])
		}
		same = same && other.Clients[i] == c
	}
	if same {
		t.Fatal("seeds 5 and 6 drew the same workload")
	}
}
