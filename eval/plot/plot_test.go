package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

// chart is one call of the package, named for the test tables.
type chart struct {
	name  string
	draw  func(w io.Writer) error
	names []string // what the legend must hold
}

func f64(x float64) *float64 { return &x }

func charts() []chart {
	return []chart{
		{"lines, two panels", func(w io.Writer) error {
			return Lines(w, "traffic: cost and finish rate", "time (s)", []Panel{
				{YLabel: "cost ($/h)", Series: []Series{
					{Name: "mdag", X: []float64{0, 10, 20, 30}, Y: []float64{1.5, 2.25, 2.25, 1.75}},
					{Name: "nexus-style", X: []float64{0, 15, 30}, Y: []float64{2, 3, 2.5}, Dashed: true},
				}},
				{YLabel: "finish rate", YMin: f64(0.8), YMax: f64(1), Series: []Series{
					{Name: "mdag finish", X: []float64{0, 10, 20, 30}, Y: []float64{1, 0.99, 0.97, 1}},
					{Name: "nexus finish", X: []float64{0, 10, 20, 30}, Y: []float64{1, 0.93, 0.95, 0.96}, Dashed: true},
				}},
			}, 16, 12)
		}, []string{"mdag", "nexus-style", "mdag finish", "nexus finish", "traffic: cost and finish rate", "time (s)", "cost ($/h)"}},
		{"lines, one point, names to escape", func(w io.Writer) error {
			return Lines(w, "a<b & c", "x", []Panel{{YLabel: "y", Series: []Series{{Name: `"q" <r>`, X: []float64{5}, Y: []float64{5}}}}}, 10, 6)
		}, []string{"a&lt;b &amp; c", "&lt;r&gt;"}},
		{"lines, values equal to 12 digits", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "y", Series: []Series{{Name: "flat", X: []float64{0, 1e-250}, Y: []float64{1, 1 + 1e-12}}}}}, 10, 6)
		}, []string{"flat"}},
		{"bars", func(w io.Writer) error {
			return Bars(w, "cost per app", "cost ($/h)", []string{"traffic", "face", "tracker"}, []BarSeries{
				{Name: "mdag", Values: []float64{1, 2, 3}},
				{Name: "nexus-style", Values: []float64{1.3, 2.4, 3.9}},
			}, 14, 8)
		}, []string{"mdag", "nexus-style", "traffic", "face", "tracker", "cost per app"}},
		{"cdf, linear", func(w io.Writer) error {
			return CDF(w, "cost ratio", "ratio", []Sample{
				{Name: "greedy/MILP", Values: []float64{1, 1, 1.02, 1.05, 1}},
				{Name: "MILP/brute force", Values: []float64{1, 1, 1}},
			}, false, 12, 8)
		}, []string{"greedy/MILP", "MILP/brute force", "cost ratio", "CDF"}},
		{"cdf, log x", func(w io.Writer) error {
			return CDF(w, "solve time", "ms", []Sample{
				{Name: "milp", Values: []float64{3.5, 12, 40, 0.8}},
				{Name: "greedy", Values: []float64{0.01, 0.02}},
			}, true, 12, 8)
		}, []string{"milp", "greedy", "solve time"}},
	}
}

// TestChartsAreValidDeterministicSVG: every chart kind gives well-formed
// XML with an <svg> root, holds its legend names and labels (escaped), is
// byte-identical when drawn twice, and stays small (no embedded fonts).
func TestChartsAreValidDeterministicSVG(t *testing.T) {
	for _, c := range charts() {
		t.Run(c.name, func(t *testing.T) {
			var a, b bytes.Buffer
			if err := c.draw(&a); err != nil {
				t.Fatal(err)
			}
			if err := c.draw(&b); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				t.Fatalf("two draws differ (%d and %d bytes): output is not deterministic", a.Len(), b.Len())
			}
			dec := xml.NewDecoder(bytes.NewReader(a.Bytes()))
			root := ""
			for {
				tok, err := dec.Token()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("not valid XML: %v", err)
				}
				if se, ok := tok.(xml.StartElement); ok && root == "" {
					root = se.Name.Local
				}
			}
			if root != "svg" {
				t.Fatalf("root element %q, want svg", root)
			}
			for _, n := range c.names {
				if !strings.Contains(a.String(), n) {
					t.Errorf("the SVG does not hold %q", n)
				}
			}
			if a.Len() > 60<<10 {
				t.Errorf("%d bytes: a figure should stay under 60 KB", a.Len())
			}
			if strings.Contains(a.String(), "@font-face") {
				t.Error("fonts are embedded")
			}
		})
	}
}

// TestChartsRejectBadInput: each kind of bad input is an error naming what
// and where, never a panic or a silent figure.
func TestChartsRejectBadInput(t *testing.T) {
	ok := []Series{{Name: "ok", X: []float64{0, 1}, Y: []float64{0, 1}}}
	cases := []struct {
		name string
		draw func(w io.Writer) error
		want string
	}{
		{"lines: no panels", func(w io.Writer) error { return Lines(w, "t", "x", nil, 10, 10) }, "at least one panel"},
		{"lines: panel without series", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: ok}, {YLabel: "rate"}}, 10, 10)
		}, `panel 1 ("rate") has no series`},
		{"lines: mismatched lengths", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: []Series{{Name: "s", X: []float64{1, 2, 3}, Y: []float64{1, 2}}}}}, 10, 10)
		}, `series "s": 3 x values but 2 y values`},
		{"lines: empty series", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: []Series{{Name: "s"}}}}, 10, 10)
		}, `series "s" has no points`},
		{"lines: NaN y", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: append(ok, Series{Name: "bad", X: []float64{0, 1, 2}, Y: []float64{1, 2, math.NaN()}})}}, 10, 10)
		}, `series "bad" y[2] is NaN`},
		{"lines: Inf x", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: []Series{{Name: "bad", X: []float64{math.Inf(1)}, Y: []float64{1}}}}}, 10, 10)
		}, `series "bad" x[0] is +Inf`},
		{"lines: YMin above YMax", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: ok, YMin: f64(2), YMax: f64(1)}}, 10, 10)
		}, "YMin 2 must be below YMax 1"},
		{"lines: NaN bound", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: ok, YMax: f64(math.NaN())}}, 10, 10)
		}, "not a finite number"},
		{"lines: a range wider than float64 (gonum's tick search never ended)", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "cost", Series: []Series{{Name: "s", X: []float64{-1e308, 1e308}, Y: []float64{1, 2}}}}}, 10, 10)
		}, "x values up to 1e+308 are too large to plot"},
		{"bars: a huge value", func(w io.Writer) error {
			return Bars(w, "t", "y", []string{"a"}, []BarSeries{{Name: "s", Values: []float64{-1e301}}}, 10, 10)
		}, "too large to plot"},
		{"cdf: a subnormal on a log axis", func(w io.Writer) error {
			return CDF(w, "t", "x", []Sample{{Name: "a", Values: []float64{5e-324, 1}}}, true, 10, 10)
		}, "too small for a log axis"},
		{"lines: zero size", func(w io.Writer) error { return Lines(w, "t", "x", []Panel{{Series: ok}}, 0, 10) }, "figure size"},
		{"bars: NaN size", func(w io.Writer) error {
			return Bars(w, "t", "y", []string{"a"}, []BarSeries{{Name: "s", Values: []float64{1}}}, 10, math.NaN())
		}, "figure size"},
		{"bars: no groups", func(w io.Writer) error { return Bars(w, "t", "y", nil, []BarSeries{{Name: "s"}}, 10, 10) }, "at least one group"},
		{"bars: no series", func(w io.Writer) error { return Bars(w, "t", "y", []string{"a"}, nil, 10, 10) }, "at least one series"},
		{"bars: values do not match groups", func(w io.Writer) error {
			return Bars(w, "t", "y", []string{"a", "b"}, []BarSeries{{Name: "s", Values: []float64{1}}}, 10, 10)
		}, `bar series "s": 1 values for 2 groups`},
		{"bars: NaN value", func(w io.Writer) error {
			return Bars(w, "t", "y", []string{"a", "b"}, []BarSeries{{Name: "s", Values: []float64{1, math.NaN()}}}, 10, 10)
		}, `bar series "s"[1] is NaN`},
		{"cdf: no samples", func(w io.Writer) error { return CDF(w, "t", "x", nil, false, 10, 10) }, "at least one sample"},
		{"cdf: empty sample", func(w io.Writer) error {
			return CDF(w, "t", "x", []Sample{{Name: "a", Values: []float64{1}}, {Name: "e"}}, false, 10, 10)
		}, `sample "e" has no values`},
		{"cdf: NaN value", func(w io.Writer) error {
			return CDF(w, "t", "x", []Sample{{Name: "a", Values: []float64{1, 2, 3, math.NaN()}}}, false, 10, 10)
		}, `sample "a"[3] is NaN`},
		{"cdf: zero on a log axis", func(w io.Writer) error {
			return CDF(w, "t", "x", []Sample{{Name: "a", Values: []float64{1, 0}}}, true, 10, 10)
		}, `sample "a": value [1] = 0 is not positive`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			err := c.draw(&b)
			if err == nil {
				t.Fatalf("no error; want one holding %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not hold %q", err, c.want)
			}
			if b.Len() != 0 {
				t.Errorf("%d bytes written before the error", b.Len())
			}
		})
	}
}

// TestCDFSteps: the CDF's line reaches 1 and starts at 0 at the smallest
// value; with one value repeated the figure still draws (zero-width x range).
func TestCDFSteps(t *testing.T) {
	for _, vals := range [][]float64{{2, 2, 2}, {1}, {3, 1, 2}} {
		var b bytes.Buffer
		if err := CDF(&b, "t", "x", []Sample{{Name: "s", Values: vals}}, false, 10, 8); err != nil {
			t.Fatalf("%v: %v", vals, err)
		}
		if err := CDF(&b, "t", "x", []Sample{{Name: "s", Values: vals}}, true, 10, 8); err != nil {
			t.Fatalf("%v, log x: %v", vals, err)
		}
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestWriteErrorsReturned: a failing writer's error comes back from every
// chart kind.
func TestWriteErrorsReturned(t *testing.T) {
	for _, c := range charts() {
		if err := c.draw(failWriter{}); err == nil || !strings.Contains(err.Error(), "disk full") {
			t.Errorf("%s: error %v, want the writer's", c.name, err)
		}
	}
}

// TestTickLabelsDistinct: labelled ticks never repeat a label and read back
// as their values (gonum's own labels gave 1, 1, 1 for 1, 1.01, 1.02).
func TestTickLabelsDistinct(t *testing.T) {
	for _, r := range [][2]float64{{1, 1.036}, {0, 1.03}, {0.001, 0.0012}, {0, 1e6}, {-5, 5}, {1.99999, 2.00001}} {
		seen := map[string]bool{}
		n := 0
		for _, tk := range (ticks{}).Ticks(r[0], r[1]) {
			if tk.Label == "" {
				continue
			}
			n++
			if seen[tk.Label] {
				t.Errorf("range %v: label %q twice", r, tk.Label)
			}
			seen[tk.Label] = true
		}
		if n < 2 {
			t.Errorf("range %v: %d labelled ticks", r, n)
		}
	}
}

// TestLinesLegendOncePerLine: a line drawn in several panels under the same
// name and style is listed once in the shared legend; another style is
// listed again.
func TestLinesLegendOncePerLine(t *testing.T) {
	xs, ys := []float64{0, 1}, []float64{1, 2}
	var b bytes.Buffer
	err := Lines(&b, "t", "x", []Panel{
		{YLabel: "cost", Series: []Series{{Name: "mdag-system", X: xs, Y: ys}, {Name: "other-system", X: xs, Y: ys, Dashed: true}}},
		{YLabel: "rate", Series: []Series{{Name: "mdag-system", X: xs, Y: ys}, {Name: "other-system", X: xs, Y: ys}}},
	}, 12, 10)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{">mdag-system<": 1, ">other-system<": 2} {
		if got := strings.Count(b.String(), name); got != want {
			t.Errorf("%s in the legend %d times, want %d", name, got, want)
		}
	}
}

// TestLegendTooTall: a legend that leaves no room for the chart is an error
// that says so, not an unreadable figure.
func TestLegendTooTall(t *testing.T) {
	var samples []Sample
	for i := range 40 {
		samples = append(samples, Sample{Name: strings.Repeat("x", i+1), Values: []float64{1}})
	}
	err := CDF(io.Discard, "t", "x", samples, false, 10, 4)
	if err == nil || !strings.Contains(err.Error(), "legend (40 entries)") {
		t.Fatalf("error %v, want one about the legend", err)
	}
}

// TestThin: points exactly on the segment between their neighbours go;
// corners, ends, and points that turn back stay.
func TestThin(t *testing.T) {
	for _, tc := range []struct {
		name       string
		x, y, want []float64 // want: the x of the points kept
	}{
		{"one point", []float64{0}, []float64{1}, []float64{0}},
		{"flat run", []float64{0, 1, 2, 3}, []float64{1, 1, 1, 1}, []float64{0, 3}},
		{"steps", []float64{0, 1, 2, 2, 3, 4}, []float64{1, 1, 1, 2, 2, 2}, []float64{0, 2, 2, 4}},
		{"straight slope", []float64{0, 1, 2}, []float64{0, 2, 4}, []float64{0, 2}},
		{"corner", []float64{0, 1, 2}, []float64{0, 1, 0}, []float64{0, 1, 2}},
		{"turns back on itself", []float64{0, 2, 1}, []float64{0, 0, 0}, []float64{0, 2, 1}},
	} {
		var got []float64
		for _, p := range thin(tc.x, tc.y) {
			got = append(got, p.X)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: kept x %v, want %v", tc.name, got, tc.want)
		}
	}
}
