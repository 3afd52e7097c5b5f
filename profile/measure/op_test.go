package measure

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
)

// slowOp takes per for every item (on the bubble's clock) and records the
// streams and sequence numbers it saw.
type slowOp struct {
	per  time.Duration
	fail error

	mu   sync.Mutex
	seen map[string][]uint64
}

func (o *slowOp) Process(it *media.Item) ([]*media.Item, error) {
	if o.fail != nil {
		return nil, o.fail
	}
	o.mu.Lock()
	if o.seen == nil {
		o.seen = map[string][]uint64{}
	}
	o.seen[it.Stream] = append(o.seen[it.Stream], it.Seq)
	o.mu.Unlock()
	it.Labels = append(it.Labels, "x") // writes to its input: each call starts from the same item
	if len(it.Labels) != 1 {
		return nil, errors.New("the input item was not a fresh copy")
	}
	time.Sleep(o.per) // the op's work, on the bubble's clock
	return []*media.Item{it}, nil
}

// TestSweepOp: a batch's items run one after another on each slot (batch
// b takes b items' time), each slot is its own stream with increasing
// sequence numbers, and the op's error names the point.
func TestSweepOp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		op := &slowOp{per: 300 * time.Microsecond}
		res, err := SweepOp(context.Background(), op, Options{Model: "count", Batches: []int{1, 3}, Concurrency: []int{1, 2}, Iterations: 4, Items: tinyItems})
		if err != nil {
			t.Fatal(err)
		}
		if res.Executor != "op" || res.Model != "count" || len(res.Points) != 4 {
			t.Fatalf("result %+v", res)
		}
		for _, p := range res.Points {
			want := time.Duration(p.Batch) * op.per
			if p.P50 != want || p.P99 != want {
				t.Errorf("b=%d c=%d: p50 %v p99 %v, want %v", p.Batch, p.Concurrency, p.P50, p.P99, want)
			}
		}
		if len(op.seen) != 2 {
			t.Errorf("streams %v, want profile-0 and profile-1", op.seen)
		}
		for s, seqs := range op.seen {
			for i := 1; i < len(seqs); i++ {
				if seqs[i] != seqs[i-1]+1 {
					t.Errorf("%s: sequence %v is not 1, 2, 3, ...", s, seqs)
					break
				}
			}
		}
	})
	_, err := SweepOp(context.Background(), &slowOp{fail: errors.New("boom")}, Options{Model: "count", Batches: []int{1}, Concurrency: []int{1}, Items: tinyItems})
	if err == nil || !strings.Contains(err.Error(), "count on op, batch 1, concurrency 1: boom") {
		t.Errorf("error %v", err)
	}
}

func TestDetections(t *testing.T) {
	tests := []struct {
		w, h, n int
		want    []media.Box
	}{
		{640, 480, 0, nil},
		{640, 480, 1, []media.Box{{X: 160, Y: 120, W: 320, H: 240, Class: "object", Score: 0.9}}},
		{100, 100, 3, []media.Box{
			{X: 12, Y: 12, W: 25, H: 25, Class: "object", Score: 0.9},
			{X: 62, Y: 12, W: 25, H: 25, Class: "object", Score: 0.9},
			{X: 12, Y: 62, W: 25, H: 25, Class: "object", Score: 0.9}}},
		{2, 2, 9, nil}, // checked below: inside the frame, non-empty
	}
	for _, tt := range tests {
		got := Detections(tt.w, tt.h, tt.n)
		if len(got) != tt.n {
			t.Errorf("Detections(%d, %d, %d): %d boxes", tt.w, tt.h, tt.n, len(got))
		}
		for _, b := range got {
			if b.W < 1 || b.H < 1 || b.X < 0 || b.Y < 0 || b.X+b.W > tt.w+1 || b.Y+b.H > tt.h+1 {
				t.Errorf("Detections(%d, %d, %d): box %+v outside the frame", tt.w, tt.h, tt.n, b)
			}
		}
		if tt.want != nil || tt.n == 0 {
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Detections(%d, %d, %d) (-want +got):\n%s", tt.w, tt.h, tt.n, d)
			}
		}
	}
}

func TestDur(t *testing.T) {
	for in, want := range map[time.Duration]string{
		0:                         "10ns",
		4:                         "10ns",
		187:                       "190ns",
		27863:                     "27.86µs",
		99_994:                    "99.99µs",
		100_400:                   "100µs",
		5_329_400:                 "5.329ms",
		1234 * time.Millisecond:   "1.234s",
		1234*time.Millisecond + 7: "1.234s",
	} {
		if got := dur(in).String(); got != want {
			t.Errorf("dur(%d) = %s, want %s", int64(in), got, want)
		}
	}
}

// TestAppendTo: a document added to one mdag profile wrote keeps the old
// text, adds the header after the old header, the worker type when new and
// the entries last; what would not be one valid document is refused.
func TestAppendTo(t *testing.T) {
	golden := filepath.Join("testdata", "emulated.golden.yaml")
	old, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	w := profile.WorkerType{Type: "cpu-2", Price: 0.1, CPUs: 2}
	entry := func(target string, f profile.FrameSize) Entry {
		return Entry{Profile: profile.Profile{Target: target, Worker: w.Type, Frame: f,
			Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: 190 * time.Nanosecond, P99: 27 * time.Microsecond, Throughput: 300000}}},
			Header: []string{"op count at " + f.String()}}
	}
	p99 := &profile.Plan{Quantile: profile.P99}
	t.Run("appended", func(t *testing.T) {
		d := Document{Header: []string{"mdag profile --op count --append x"}, Plan: p99, Worker: w,
			Entries: []Entry{entry("faces", profile.FrameSize{W: 8, H: 8}), entry("m", profile.FrameSize{W: 4, H: 4})}}
		got, err := d.AppendTo(golden, old)
		if err != nil {
			t.Fatal(err)
		}
		want := "# mdag profile: model m on emulated\n# mdag profile --op count --append x\n" +
			strings.TrimPrefix(string(old), "# mdag profile: model m on emulated\n") +
			"  # op count at 8x8\n  - target: faces\n    worker: cpu-2\n    frame: 8x8\n    points:\n" +
			"      - {batch: 1, concurrency: 1, latency: 190ns, p99: 27µs, throughput: 300000.000}\n" +
			"  # op count at 4x4\n  - target: m\n    worker: cpu-2\n    frame: 4x4\n    points:\n" +
			"      - {batch: 1, concurrency: 1, latency: 190ns, p99: 27µs, throughput: 300000.000}\n"
		if d := cmp.Diff(want, string(got)); d != "" {
			t.Errorf("appended (-want +got):\n%s", d)
		}
		f, err := profile.Parse("x.yaml", got)
		if err != nil || len(f.Profiles) != 3 {
			t.Fatalf("%v %+v", err, f)
		}
	})
	t.Run("new worker type", func(t *testing.T) {
		g := profile.WorkerType{Type: "gpu", Price: 2, GPU: "T4", GPUs: 1}
		d := Document{Worker: g, Entries: []Entry{{Profile: profile.Profile{Target: "m", Worker: "gpu", Points: []profile.Point{{Batch: 1, Concurrency: 1, Latency: time.Millisecond}}}}}}
		got, err := d.AppendTo(golden, old)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(got), "  - {type: cpu-2, price: 0.1, cpus: 2}\n  - {type: gpu, price: 2, gpu: T4, gpus: 1}\nprofiles:\n") {
			t.Errorf("worker type not added after the old one:\n%s", got)
		}
	})
	refusals := []struct {
		name string
		old  string
		d    Document
		want string
	}{
		{"other price", string(old), Document{Worker: profile.WorkerType{Type: "cpu-2", Price: 0.2, CPUs: 2}, Entries: []Entry{entry("faces", profile.FrameSize{})}},
			"has worker type cpu-2 as {type: cpu-2, price: 0.1, cpus: 2}; this document says {type: cpu-2, price: 0.2, cpus: 2}"},
		{"other plan", string(old), Document{Plan: &profile.Plan{Quantile: profile.P50}, Worker: w, Entries: []Entry{entry("faces", profile.FrameSize{})}},
			"plans on plan: {quantile: p99}; this document says plan: {quantile: p50}"},
		{"same target, worker and frame", string(old), Document{Worker: w, Entries: []Entry{entry("m", profile.FrameSize{W: 8, H: 8})}},
			`second profile for target "m" on worker "cpu-2" at frame 8x8 (first at profiles[0])`},
		{"sized and unsized", string(old), Document{Worker: w, Entries: []Entry{entry("m", profile.FrameSize{})}},
			"this profile needs frame: WxH too"},
		{"flow style", "workers: [{type: cpu-2, price: 0.1}]\nprofiles: [{target: m, worker: cpu-2, points: [{batch: 1, latency: 1ms}]}]\n",
			Document{Worker: w, Entries: []Entry{entry("faces", profile.FrameSize{})}}, "no top-level workers: line followed by a profiles: line"},
		{"profiles not last", "workers:\n  - {type: cpu-2, price: 0.1, cpus: 2}\nprofiles:\n  - {target: m, worker: cpu-2, points: [{batch: 1, latency: 1ms}]}\nplan: {quantile: p50}\n",
			Document{Worker: w, Entries: []Entry{entry("faces", profile.FrameSize{})}}, "line 5: not laid out as mdag profile writes"},
		{"invalid old", "workers: []\nprofiles: []\n", Document{Worker: w}, "workers: required"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.d.AppendTo("old.yaml", []byte(tt.old))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
}
