// Package plot draws the evaluation's figures as SVG with gonum.org/v1/plot:
// line charts of time series in panels stacked over one shared x axis
// (Scrooge Figures 7-9: cost and finish rate over time), grouped bar charts
// (Figure 6: per app, one bar per system) and empirical CDFs (Figures 10 and
// 11: cost ratios, solve times). The legend sits under the chart, in one or
// two columns, so it never hides data; tick labels carry as many decimals
// as tell them apart.
//
// Output is deterministic: the same input gives byte-identical SVG (no
// timestamps, no random ids, fonts referenced by name and not embedded), so
// committed figures do not churn when regenerated. Every input is checked
// first: empty charts, mismatched lengths and NaN or infinite values are
// errors that name the panel, series and index.
package plot

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Series is one named line: X and Y of equal length.
type Series struct {
	Name   string
	X, Y   []float64
	Dashed bool
}

// Panel is one chart of a Lines figure: its y axis label, its lines and,
// optionally, fixed y bounds (nil: from the data).
type Panel struct {
	YLabel     string
	Series     []Series
	YMin, YMax *float64
}

// BarSeries is one bar per group, named in the legend.
type BarSeries struct {
	Name   string
	Values []float64
}

// Sample is a set of observations drawn as one empirical CDF.
type Sample struct {
	Name   string
	Values []float64
}

// Lines writes an SVG line chart to w: the panels stacked vertically, top
// to bottom, over one shared x axis (the range of every series' X), the
// title above the first panel and xlabel under the last, each panel with its
// own y label; one legend under the figure lists each line once (a series
// with the same name, place and style in several panels is one entry).
// widthCM and heightCM size the whole figure.
func Lines(w io.Writer, title, xlabel string, panels []Panel, widthCM, heightCM float64) error {
	if err := checkSize(widthCM, heightCM); err != nil {
		return err
	}
	if len(panels) == 0 {
		return errors.New("plot: Lines needs at least one panel")
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for pi, pn := range panels {
		where := fmt.Sprintf("panel %d (%q)", pi, pn.YLabel)
		if len(pn.Series) == 0 {
			return fmt.Errorf("plot: %s has no series", where)
		}
		if pn.YMin != nil && pn.YMax != nil && !(*pn.YMin < *pn.YMax) {
			return fmt.Errorf("plot: %s: YMin %v must be below YMax %v", where, *pn.YMin, *pn.YMax)
		}
		for _, b := range []*float64{pn.YMin, pn.YMax} {
			if b != nil && !finite(*b) {
				return fmt.Errorf("plot: %s: y bound %v is not a finite number", where, *b)
			}
		}
		for _, s := range pn.Series {
			if len(s.X) != len(s.Y) {
				return fmt.Errorf("plot: %s series %q: %d x values but %d y values", where, s.Name, len(s.X), len(s.Y))
			}
			if len(s.X) == 0 {
				return fmt.Errorf("plot: %s series %q has no points", where, s.Name)
			}
			if err := checkValues(where+" series "+quote(s.Name)+" x", s.X); err != nil {
				return err
			}
			if err := checkValues(where+" series "+quote(s.Name)+" y", s.Y); err != nil {
				return err
			}
			xmin, xmax = min(xmin, slices.Min(s.X)), max(xmax, slices.Max(s.X))
		}
	}
	xmin, xmax, err := span("x", xmin, xmax, false)
	if err != nil {
		return err
	}
	plots := make([][]*gplot.Plot, len(panels))
	leg := newLegend()
	type key struct {
		name   string
		index  int
		dashed bool
	}
	listed := map[key]bool{}
	for pi, pn := range panels {
		p := newPlot()
		if pi == 0 {
			p.Title.Text = title
		}
		if pi == len(panels)-1 {
			p.X.Label.Text = xlabel
		} else {
			p.X.Tick.Marker = unlabelled{} // shared axis: ticks labelled once, at the bottom
		}
		p.Y.Label.Text = pn.YLabel
		p.X.Min, p.X.Max = xmin, xmax
		for si, s := range pn.Series {
			l, err := plotter.NewLine(thin(s.X, s.Y))
			if err != nil {
				return fmt.Errorf("plot: panel %d series %q: %w", pi, s.Name, err)
			}
			l.Color = plotutil.Color(si)
			l.Width = vg.Points(1.2)
			if s.Dashed {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			p.Add(l)
			if k := (key{s.Name, si, s.Dashed}); !listed[k] { // the same line in several panels: listed once
				listed[k] = true
				leg.Add(s.Name, l)
			}
		}
		p.X.Min, p.X.Max = xmin, xmax // Add widened them to the data; keep the shared range
		if pn.YMin != nil {
			p.Y.Min = *pn.YMin
		}
		if pn.YMax != nil {
			p.Y.Max = *pn.YMax
		}
		if p.Y.Min, p.Y.Max, err = span(fmt.Sprintf("panel %d (%q) y", pi, pn.YLabel), p.Y.Min, p.Y.Max, false); err != nil {
			return err
		}
		plots[pi] = []*gplot.Plot{p}
	}
	return write(w, plots, leg, widthCM, heightCM)
}

// Bars writes a grouped bar chart to w: the groups along x (apps, say), one
// bar per series in each group (systems), side by side, with a legend.
// Every series has one value per group.
func Bars(w io.Writer, title, ylabel string, groups []string, series []BarSeries, widthCM, heightCM float64) error {
	if err := checkSize(widthCM, heightCM); err != nil {
		return err
	}
	if len(groups) == 0 {
		return errors.New("plot: Bars needs at least one group")
	}
	if len(series) == 0 {
		return errors.New("plot: Bars needs at least one series")
	}
	for _, s := range series {
		if len(s.Values) != len(groups) {
			return fmt.Errorf("plot: bar series %q: %d values for %d groups", s.Name, len(s.Values), len(groups))
		}
		if err := checkValues("bar series "+quote(s.Name), s.Values); err != nil {
			return err
		}
	}
	p := newPlot()
	leg := newLegend()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	// The bar width is a length on the page: share about 70% of each
	// group's slot of the data area (roughly 80% of the width) among the bars.
	bw := cm(widthCM) * 0.8 * 0.7 / vg.Length(len(groups)*len(series))
	for si, s := range series {
		bars, err := plotter.NewBarChart(plotter.Values(s.Values), bw)
		if err != nil {
			return fmt.Errorf("plot: bar series %q: %w", s.Name, err)
		}
		bars.Color = plotutil.Color(si)
		bars.LineStyle.Width = vg.Points(0.5)
		bars.Offset = bw * (vg.Length(si) - vg.Length(len(series)-1)/2)
		p.Add(bars)
		leg.Add(s.Name, bars)
	}
	p.NominalX(groups...)
	var err error
	if p.Y.Min, p.Y.Max, err = span("y", p.Y.Min, p.Y.Max, false); err != nil {
		return err
	}
	return write(w, [][]*gplot.Plot{{p}}, leg, widthCM, heightCM)
}

// CDF writes the empirical CDF of each sample to w: for every x, the share
// of the sample's values at most x, as a step line from 0 to 1. With logX
// the x axis is logarithmic and every value must be positive.
func CDF(w io.Writer, title, xlabel string, samples []Sample, logX bool, widthCM, heightCM float64) error {
	if err := checkSize(widthCM, heightCM); err != nil {
		return err
	}
	if len(samples) == 0 {
		return errors.New("plot: CDF needs at least one sample")
	}
	for _, s := range samples {
		if len(s.Values) == 0 {
			return fmt.Errorf("plot: CDF sample %q has no values", s.Name)
		}
		if err := checkValues("CDF sample "+quote(s.Name), s.Values); err != nil {
			return err
		}
		if logX {
			for i, v := range s.Values {
				if v <= 0 {
					return fmt.Errorf("plot: CDF sample %q: value [%d] = %v is not positive, which a log x axis cannot show", s.Name, i, v)
				}
			}
		}
	}
	p := newPlot()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "CDF"
	leg := newLegend()
	if logX {
		p.X.Scale = gplot.LogScale{}
		p.X.Tick.Marker = gplot.LogTicks{Prec: -1}
	}
	for si, s := range samples {
		v := slices.Sorted(slices.Values(s.Values))
		pts := make(plotter.XYs, 0, len(v)+1)
		pts = append(pts, plotter.XY{X: v[0], Y: 0})
		for i, x := range v {
			pts = append(pts, plotter.XY{X: x, Y: float64(i+1) / float64(len(v))})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot: CDF sample %q: %w", s.Name, err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.Color(si)
		l.Width = vg.Points(1.2)
		l.Dashes = plotutil.Dashes(si)
		p.Add(l)
		leg.Add(s.Name, l)
	}
	p.Y.Min, p.Y.Max = 0, 1.03 // headroom: a line at 1 stays off the frame
	var err error
	if p.X.Min, p.X.Max, err = span("x", p.X.Min, p.X.Max, logX); err != nil {
		return err
	}
	return write(w, [][]*gplot.Plot{{p}}, leg, widthCM, heightCM)
}

func newPlot() *gplot.Plot {
	p := gplot.New()
	p.Add(plotter.NewGrid())
	p.X.Tick.Marker = ticks{}
	p.Y.Tick.Marker = ticks{}
	return p
}

// legend collects a figure's entries; write lays them out under the chart.
type legend struct {
	names  []string
	thumbs []gplot.Thumbnailer
}

func newLegend() *legend { return &legend{} }

func (l *legend) Add(name string, t gplot.Thumbnailer) {
	l.names, l.thumbs = append(l.names, name), append(l.thumbs, t)
}

// write draws the plots (one column, stacked) over the legend, which sits
// under them in up to legendColumns columns, so that it never hides data,
// and writes the SVG.
func write(w io.Writer, plots [][]*gplot.Plot, leg *legend, widthCM, heightCM float64) error {
	c := vgsvg.New(cm(widthCM), cm(heightCM))
	dc := draw.New(c)
	cols := legendColumns(leg)
	var legH vg.Length
	for _, l := range cols {
		r := l.Rectangle(dc)
		legH = max(legH, r.Max.Y-r.Min.Y)
	}
	if legH > 0 {
		legH += 2 * vg.Millimeter
	}
	if legH > dc.Max.Y-dc.Min.Y-2*vg.Centimeter {
		return fmt.Errorf("plot: the legend (%d entries) needs %.1f cm: a figure %.1f cm high leaves too little for the chart",
			len(leg.names), float64(legH/vg.Centimeter), heightCM)
	}
	area := draw.Crop(dc, 0, 0, legH, 0)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Millimeter,
		PadTop: vg.Millimeter, PadLeft: vg.Millimeter, PadRight: 3 * vg.Millimeter}
	canvases := gplot.Align(plots, tiles, area)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if legH > 0 {
		strip := draw.Crop(dc, 0, 0, 0, -(dc.Max.Y - dc.Min.Y - legH))
		strip = draw.Crop(strip, 1.5*vg.Centimeter, 0, 0, -vg.Millimeter)
		colW := (strip.Max.X - strip.Min.X) / vg.Length(len(cols))
		for i, l := range cols {
			l.Draw(draw.Crop(strip, vg.Length(i)*colW, -(vg.Length(len(cols)-1-i) * colW), 0, 0))
		}
	}
	_, err := c.WriteTo(w)
	return err
}

// legendColumns lays a legend's entries out in columns: one for up to 3
// entries, else two, filled top to bottom, left column first.
func legendColumns(leg *legend) []*gplot.Legend {
	n := len(leg.names)
	if n == 0 {
		return nil
	}
	per := n
	if n > 3 {
		per = (n + 1) / 2
	}
	var cols []*gplot.Legend
	for start := 0; start < n; start += per {
		l := gplot.NewLegend()
		l.Top, l.Left = true, true
		l.ThumbnailWidth = vg.Points(24)
		l.Padding = vg.Points(1)
		for i := start; i < min(n, start+per); i++ {
			l.Add(leg.names[i], leg.thumbs[i])
		}
		cols = append(cols, &l)
	}
	return cols
}

// unlabelled are ticks' positions with blank labels (a space: gonum
// draws major ticks and grid lines where a label is not empty).
type unlabelled struct{}

func (unlabelled) Ticks(lo, hi float64) []gplot.Tick {
	t := ticks{}.Ticks(lo, hi)
	for i := range t {
		if t[i].Label != "" {
			t[i].Label = " "
		}
	}
	return t
}

// ticks are gonum's default tick positions, labelled with as few decimals
// as tell the labelled ticks apart exactly (gonum's own labels can repeat,
// as 1, 1, 1 for 1, 1.01, 1.02).
type ticks struct{}

func (ticks) Ticks(lo, hi float64) []gplot.Tick {
	t := gplot.DefaultTicks{}.Ticks(lo, hi)
	var step float64
	var prev *float64
	for i := range t {
		if t[i].Label == "" {
			continue
		}
		if prev != nil && step == 0 {
			step = t[i].Value - *prev
		}
		prev = &t[i].Value
	}
	d := 0
	for ; d < 10 && step > 0; d++ {
		ok := true
		for _, x := range t {
			if x.Label != "" {
				r, _ := strconv.ParseFloat(strconv.FormatFloat(x.Value, 'f', d, 64), 64)
				ok = ok && math.Abs(r-x.Value) <= step*1e-6
			}
		}
		if ok {
			break
		}
	}
	for i := range t {
		if t[i].Label != "" {
			t[i].Label = strconv.FormatFloat(t[i].Value, 'f', d, 64)
		}
	}
	return t
}

// thin returns the points of a line without those that lie exactly on the
// straight segment between their neighbours (the runs of a step-like time
// series such as cost): the same line drawn, in a smaller file.
func thin(x, y []float64) plotter.XYs {
	pts := plotter.XYs{{X: x[0], Y: y[0]}}
	for i := 1; i < len(x); i++ {
		if i+1 < len(x) {
			a, c := pts[len(pts)-1], plotter.XY{X: x[i+1], Y: y[i+1]}
			between := (x[i]-a.X)*(c.X-x[i]) >= 0 && (y[i]-a.Y)*(c.Y-y[i]) >= 0
			if between && (y[i]-a.Y)*(c.X-x[i]) == (c.Y-y[i])*(x[i]-a.X) {
				continue
			}
		}
		pts = append(pts, plotter.XY{X: x[i], Y: y[i]})
	}
	return pts
}

// span returns an axis range gonum can draw (its tick search does not end
// on a range wider than float64 holds, and needs some width): values beyond
// 1e300 in magnitude are refused; a range narrower than a millionth of its
// magnitude, one value say, is widened to 10% of the magnitude either side
// (a log axis: halved and doubled), or to -1..1 around values near 0.
func span(what string, lo, hi float64, log bool) (float64, float64, error) {
	m := max(math.Abs(lo), math.Abs(hi))
	if m > 1e300 {
		return 0, 0, fmt.Errorf("plot: %s values up to %v are too large to plot (at most 1e300)", what, m)
	}
	if log {
		if lo < 1e-300 {
			return 0, 0, fmt.Errorf("plot: %s values down to %v are too small for a log axis (at least 1e-300)", what, lo)
		}
		if hi < lo*(1+1e-6) {
			return lo / 2, hi * 2, nil
		}
		return lo, hi, nil
	}
	if hi-lo > 1e-6*m && m >= 1e-200 {
		return lo, hi, nil
	}
	c, pad := lo/2+hi/2, 1.0
	if m >= 1e-200 {
		pad = 0.1 * m
	} else {
		c = 0
	}
	return c - pad, c + pad, nil
}

func cm(x float64) vg.Length { return vg.Length(x) * vg.Centimeter }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func quote(s string) string { return fmt.Sprintf("%q", s) }

func checkSize(w, h float64) error {
	if !finite(w) || !finite(h) || w <= 0 || h <= 0 || w > 1000 || h > 1000 {
		return fmt.Errorf("plot: figure size %vx%v cm: width and height must be in (0, 1000] cm", w, h)
	}
	return nil
}

func checkValues(where string, v []float64) error {
	for i, x := range v {
		if math.IsNaN(x) {
			return fmt.Errorf("plot: %s[%d] is NaN", where, i)
		}
		if math.IsInf(x, 0) {
			return fmt.Errorf("plot: %s[%d] is %v", where, i, x)
		}
	}
	return nil
}
