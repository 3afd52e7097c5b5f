package egress

import (
	"fmt"
	"image"
	"image/color"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/mdag/mdag/media"
)

// Line is the outline's thickness in pixels: centred on the box's edge
// (one pixel outside it, one on it, one inside), so that after VP8's 4:2:0
// chroma subsampling at least one aligned pixel pair of every edge is
// wholly the colour.
const Line = 3

// palette: saturated colours, each with a channel at 0 and one at 255, so
// none is near a synthetic pattern's fill (its channels are all >= 64) or
// the black background.
var palette = []color.RGBA{
	{0, 255, 0, 255},   // green
	{255, 0, 255, 255}, // magenta
	{0, 255, 255, 255}, // cyan
	{255, 255, 0, 255}, // yellow
	{255, 0, 0, 255},   // red
	{0, 128, 255, 255}, // azure
	{255, 128, 0, 255}, // orange
	{128, 0, 255, 255}, // violet
}

// ClassColor is the colour boxes of class are drawn in (a class's colour
// is the same on every frame and every run).
func ClassColor(class string) color.RGBA {
	var h uint32 = 2166136261
	for i := 0; i < len(class); i++ {
		h = (h ^ uint32(class[i])) * 16777619
	}
	return palette[h%uint32(len(palette))]
}

// Annotate returns a copy of f with r drawn on it: each box's outline in
// its class's colour with its class above it, each track's outline and
// id (#N), and the frame's labels at the top left.
func Annotate(f *media.Frame, r Result) *media.Frame {
	out := &media.Frame{W: f.W, H: f.H, Pix: append([]byte(nil), f.Pix...)}
	Draw(out, r)
	return out
}

// Draw draws r on f in place.
func Draw(f *media.Frame, r Result) {
	if f.Valid() != nil {
		return
	}
	for _, b := range r.Boxes {
		c := ClassColor(b.Class)
		outline(f, b, c)
		if b.Class != "" {
			text(f, b.X, b.Y-Line, b.Class, c)
		}
	}
	for _, t := range r.Tracks {
		c := ClassColor(t.Box.Class)
		outline(f, t.Box, c)
		text(f, t.Box.X, t.Box.Y+t.Box.H+13+Line, fmt.Sprintf("#%d", t.ID), c)
	}
	if len(r.Labels) > 0 {
		s := strings.Join(r.Labels, " ")
		fill(f, image.Rect(0, 0, 7*len(s)+4, 16), color.RGBA{A: 255})
		text(f, 2, 13, s, color.RGBA{255, 255, 255, 255})
	}
}

// outline draws b's edges Line pixels thick, centred on them.
func outline(f *media.Frame, b media.Box, c color.RGBA) {
	lo, hi := Line/2, Line-Line/2
	x0, y0, x1, y1 := b.X, b.Y, b.X+b.W-1, b.Y+b.H-1
	fill(f, image.Rect(x0-lo, y0-lo, x1+hi, y0+hi), c) // top
	fill(f, image.Rect(x0-lo, y1-lo, x1+hi, y1+hi), c) // bottom
	fill(f, image.Rect(x0-lo, y0-lo, x0+hi, y1+hi), c) // left
	fill(f, image.Rect(x1-lo, y0-lo, x1+hi, y1+hi), c) // right
}

func fill(f *media.Frame, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(image.Rect(0, 0, f.W, f.H))
	for y := r.Min.Y; y < r.Max.Y; y++ {
		row := f.Pix[(y*f.W+r.Min.X)*3 : (y*f.W+r.Max.X)*3]
		for i := 0; i < len(row); i += 3 {
			row[i], row[i+1], row[i+2] = c.B, c.G, c.R
		}
	}
}

// text draws s with its baseline at (x, y) in basicfont's 7x13 face,
// clipped to the frame.
func text(f *media.Frame, x, y int, s string, c color.RGBA) {
	if y < 10 {
		y = 10 // above the frame: just inside its top
	}
	d := font.Drawer{Dst: bgr{f}, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// bgr is a media.Frame as a draw.Image (for the font drawer; slow per
// pixel, and only labels go through it).
type bgr struct{ f *media.Frame }

func (b bgr) ColorModel() color.Model { return color.RGBAModel }
func (b bgr) Bounds() image.Rectangle { return image.Rect(0, 0, b.f.W, b.f.H) }
func (b bgr) At(x, y int) color.Color {
	if !(image.Point{x, y}.In(b.Bounds())) {
		return color.RGBA{}
	}
	i := (y*b.f.W + x) * 3
	return color.RGBA{b.f.Pix[i+2], b.f.Pix[i+1], b.f.Pix[i], 255}
}
func (b bgr) Set(x, y int, c color.Color) {
	if !(image.Point{x, y}.In(b.Bounds())) {
		return
	}
	r, g, bl, _ := c.RGBA()
	i := (y*b.f.W + x) * 3
	b.f.Pix[i], b.f.Pix[i+1], b.f.Pix[i+2] = byte(bl>>8), byte(g>>8), byte(r>>8)
}
