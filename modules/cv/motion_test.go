package cv

import (
	"testing"

	"github.com/mdag/mdag/media"
)

// scene is a grey textured background with a bright w x h block at (x, y).
func scene(x, y, w, h int) *media.Frame {
	f := media.NewFrame(320, 240)
	for py := range 240 {
		for px := range 320 {
			i := (py*320 + px) * 3
			v := byte(60 + (px/16+py/16)%2*20)
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = v, v, v
		}
	}
	for py := y; py < y+h; py++ {
		for px := x; px < x+w; px++ {
			i := (py*320 + px) * 3
			f.Pix[i], f.Pix[i+1], f.Pix[i+2] = 230, 210, 40
		}
	}
	return f
}

// TestMotion: after learning the background, a moving tall block is one
// "person" near where it is, a wide one a "car"; nothing during the warm-up;
// a new frame size starts over.
func TestMotion(t *testing.T) {
	m := NewMotion()
	defer m.Close()
	for i := range motionWarmup {
		if got := m.Boxes(scene(0, 0, 0, 0)); got != nil {
			t.Fatalf("frame %d of the warm-up reported %v", i, got)
		}
	}
	for _, c := range []struct {
		x, y, w, h int
		class      string
	}{{40, 60, 30, 80, "person"}, {150, 100, 90, 40, "car"}} {
		got := m.Boxes(scene(c.x, c.y, c.w, c.h))
		if len(got) != 1 {
			t.Fatalf("block %+v: %d regions %v", c, len(got), got)
		}
		b := got[0]
		if b.Class != c.class || abs(b.X-c.x) > 8 || abs(b.Y-c.y) > 8 || abs(b.W-c.w) > 16 || abs(b.H-c.h) > 16 {
			t.Errorf("block %+v: got %+v", c, b)
		}
	}
	if got := m.Boxes(media.NewFrame(64, 48)); got != nil {
		t.Errorf("a new size reported %v before learning", got)
	}
	if got := m.Boxes(&media.Frame{W: 10, H: 10}); got != nil {
		t.Errorf("an invalid frame reported %v", got)
	}
}

func abs(x int) int { return max(x, -x) }

func BenchmarkMotion(b *testing.B) {
	m := NewMotion()
	defer m.Close()
	f := [2]*media.Frame{scene(40, 60, 30, 80), scene(60, 60, 30, 80)}
	i := 0
	for b.Loop() {
		m.Boxes(f[i%2])
		i++
	}
}
