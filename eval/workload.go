package eval

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/mdag/mdag/examples"
	"github.com/mdag/mdag/media"
)

// Trace is an objects-per-frame series sampled at a fixed rate: what a
// detector saw in a video (examples/traces, `mdag trace`).
type Trace struct {
	Name   string
	Period time.Duration // between samples
	Counts []int
}

// At is the count at offset d into the trace, which loops.
func (t *Trace) At(d time.Duration) int {
	if len(t.Counts) == 0 {
		return 0
	}
	i := int(d / t.Period)
	return t.Counts[i%len(t.Counts)]
}

// Mean is the trace's mean count.
func (t *Trace) Mean() float64 {
	if len(t.Counts) == 0 {
		return 0
	}
	s := 0
	for _, c := range t.Counts {
		s += c
	}
	return float64(s) / float64(len(t.Counts))
}

// ParseTrace reads a trace CSV as `mdag trace` writes it: comment lines
// (#), a `t_s,objects` header, then one `seconds,count` row per sample at
// a fixed period. Errors name the line.
func ParseTrace(name string, data []byte) (*Trace, error) {
	t := &Trace{Name: name}
	sc := bufio.NewScanner(bytes.NewReader(data))
	line, header := 0, false
	var times []float64
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if !header {
			if s != "t_s,objects" {
				return nil, fmt.Errorf("%s:%d: header %q, want t_s,objects", name, line, s)
			}
			header = true
			continue
		}
		ts, cs, ok := strings.Cut(s, ",")
		if !ok {
			return nil, fmt.Errorf("%s:%d: %q: want seconds,objects", name, line, s)
		}
		at, err := strconv.ParseFloat(ts, 64)
		if err != nil || at < 0 || at > 1e6 {
			return nil, fmt.Errorf("%s:%d: time %q: want seconds >= 0", name, line, ts)
		}
		n, err := strconv.Atoi(cs)
		if err != nil || n < 0 || n > 1000 {
			return nil, fmt.Errorf("%s:%d: objects %q: want an integer 0..1000", name, line, cs)
		}
		if len(times) > 0 && at <= times[len(times)-1] {
			return nil, fmt.Errorf("%s:%d: time %v does not follow %v", name, line, at, times[len(times)-1])
		}
		times = append(times, at)
		t.Counts = append(t.Counts, n)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(t.Counts) < 2 {
		return nil, fmt.Errorf("%s: %d samples, want at least 2", name, len(t.Counts))
	}
	period := (times[len(times)-1] - times[0]) / float64(len(times)-1)
	if period <= 0 {
		return nil, fmt.Errorf("%s: no time between samples", name)
	}
	t.Period = time.Duration(period * float64(time.Second)).Round(time.Millisecond)
	return t, nil
}

// LoadTrace parses a committed trace (examples.Traces).
func LoadTrace(name string) (*Trace, error) {
	data, err := examples.Trace(name)
	if err != nil {
		return nil, fmt.Errorf("trace %q: not among the committed traces %v", name, examples.Traces())
	}
	return ParseTrace("examples/traces/"+name+".csv", data)
}

// Objects says what a client's camera sees: for each class of object, the
// trace its count per frame follows.
type Objects struct {
	Class string
	Trace *Trace
	Scale float64 // multiplies the trace's counts (1 when zero)
}

// Client is one camera of a workload: it joins at Join, leaves at Leave and
// sends FPS frames per second in between, each frame showing the objects
// its traces count at Offset plus the time since it joined.
type Client struct {
	ID     string
	FPS    float64
	Join   time.Duration // from the start of the run
	Leave  time.Duration
	Offset time.Duration // into its traces
}

// Workload is what a run feeds one app: its clients and what they see.
type Workload struct {
	Duration time.Duration
	Clients  []Client
	Objects  []Objects
	// Jump, when set, multiplies every count by JumpFactor from Jump on
	// (the adaptation experiment's objects-per-frame jump).
	Jump       time.Duration
	JumpFactor float64
}

// Spec is how to draw a workload at random (Scrooge section 4.2: 12
// clients joining and leaving at random times, each at a fixed frame rate
// drawn from a range).
type Spec struct {
	Duration       time.Duration
	Clients        int
	MinFPS, MaxFPS int
	Objects        []Objects
}

// Draw draws a workload from spec with seed: client i joins at a time
// uniform in the first half of the run and stays for a quarter of the run
// to all of it (cut at the end), at an integer frame rate uniform in
// [MinFPS, MaxFPS], starting at a random point of its traces.
func Draw(spec Spec, seed uint64) Workload {
	r := rand.New(rand.NewPCG(seed, 0x6d646167)) // "mdag"
	w := Workload{Duration: spec.Duration, Objects: spec.Objects}
	d := spec.Duration
	longest := time.Duration(0)
	for _, o := range spec.Objects {
		longest = max(longest, o.Trace.Period*time.Duration(len(o.Trace.Counts)))
	}
	for i := range spec.Clients {
		join := time.Duration(r.Int64N(int64(d / 2))).Truncate(time.Millisecond)
		stay := d/4 + time.Duration(r.Int64N(int64(d-d/4))).Truncate(time.Millisecond)
		c := Client{ID: fmt.Sprintf("c%02d", i), Join: join, Leave: min(d, join+stay),
			FPS: float64(spec.MinFPS + r.IntN(spec.MaxFPS-spec.MinFPS+1))}
		if longest > 0 {
			c.Offset = time.Duration(r.Int64N(int64(longest))).Truncate(100 * time.Millisecond)
		}
		w.Clients = append(w.Clients, c)
	}
	return w
}

// frameSize is the size of the frames the virtual cameras send: small, so
// that the real CPU ops (crop) cost little real time; their virtual time is
// the profile's.
const frameW, frameH = 64, 48

// boxes is what client c's frame at time at (since the run started) shows:
// each class's count from its trace, boxes at seeded places in the frame.
func (w *Workload) boxes(c *Client, at time.Duration, r *rand.Rand) []media.Box {
	var out []media.Box
	for _, o := range w.Objects {
		n := float64(o.Trace.At(c.Offset + at - c.Join))
		if o.Scale > 0 {
			n *= o.Scale
		}
		if w.Jump > 0 && at >= w.Jump && w.JumpFactor > 0 {
			n *= w.JumpFactor
		}
		for range int(n + 0.5) {
			bw, bh := 8+r.IntN(8), 8+r.IntN(8)
			out = append(out, media.Box{X: r.IntN(frameW - bw), Y: r.IntN(frameH - bh), W: bw, H: bh, Class: o.Class, Score: 0.9})
		}
	}
	return out
}
