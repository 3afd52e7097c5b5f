package synth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func TestPattern(t *testing.T) {
	if _, err := NewPattern(8, 8, 1); err == nil {
		t.Fatal("accepted an 8x8 pattern")
	}
	if _, err := NewPattern(64, 64, -1); err == nil {
		t.Fatal("accepted -1 objects")
	}
	p, err := NewPattern(160, 120, 3)
	if err != nil {
		t.Fatal(err)
	}
	f, truth, err := p.Frame(0, 7)
	if err != nil || f.Valid() != nil || len(truth) != 3 {
		t.Fatalf("%v %d", err, len(truth))
	}
	// The shapes are drawn where the truth says: the centre of each box is
	// not black.
	for _, b := range truth {
		i := ((b.Y+b.H/2)*f.W + b.X + b.W/2) * 3
		if f.Pix[i] == 0 && f.Pix[i+1] == 0 && f.Pix[i+2] == 0 {
			t.Errorf("nothing drawn at %+v", b)
		}
	}
	p.SetObjects(8)
	if _, truth, _ := p.Frame(1, 0); len(truth) != 8 {
		t.Fatalf("%d objects after SetObjects(8)", len(truth))
	}
	// Generate paces frames on the injected clock and stops at count.
	clk := clock.NewFake(time.Unix(0, 0))
	var seqs []uint64
	var at []time.Time
	errc := make(chan error, 1)
	go func() {
		errc <- p.Generate(context.Background(), clk, 0, "s", 10, 3, func(_ string, seq uint64, c time.Time, _ *media.Frame, _ []media.Box) error {
			seqs, at = append(seqs, seq), append(at, c)
			return nil
		})
	}()
	for {
		select {
		case err := <-errc:
			if err != nil || len(seqs) != 3 || at[2].Sub(at[0]) != 200*time.Millisecond {
				t.Fatalf("%v %v %v", err, seqs, at)
			}
			return
		default:
			clk.Advance(10 * time.Millisecond)
			<-time.After(time.Millisecond)
		}
	}
}

// TestOrbitUnchanged: the default motion draws exactly what the pattern
// drew before motions were added (boxes recorded from that code), so
// tests and figures built on it keep their inputs.
func TestOrbitUnchanged(t *testing.T) {
	cases := []struct {
		stream int
		seq    uint64
		xy     [5][2]int
		pix    string // SHA-256 of the frame's pixels ("": not checked)
	}{
		{0, 0, [5][2]int{{145, 210}, {284, 154}, {185, 21}, {92, 58}, {16, 12}}, ""},
		{0, 7, [5][2]int{{175, 208}, {289, 135}, {148, 9}, {65, 83}, {36, 22}}, ""},
		{1, 0, [5][2]int{{230, 197}, {276, 95}, {76, 0}, {23, 136}, {90, 47}}, "cf3aee9d99512bc0c0b94cdf41a21bb33251debb793ae5381e5ae817b12d4b6d"},
		{1, 7, [5][2]int{{252, 188}, {259, 75}, {46, 3}, {9, 160}, {123, 62}}, "e45a727bf5d47c3e6132302843c9544c9111298bca1d6cbae7852c4b6bfa9245"},
		{1, 100, [5][2]int{{76, 5}, {27, 75}, {268, 209}, {254, 30}, {172, 208}}, "183c9b33ae7f6883b26551945af191c0631eadcc095144476cc2886dc8b2f265"},
	}
	classes := []string{"car", "person", "truck", "bus", "car"}
	p, err := NewPattern(320, 240, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		f, truth, err := p.Frame(c.stream, c.seq)
		if err != nil || len(truth) != 5 {
			t.Fatalf("stream %d frame %d: %v, %d boxes", c.stream, c.seq, err, len(truth))
		}
		if sum := fmt.Sprintf("%x", sha256.Sum256(f.Pix)); c.pix != "" && sum != c.pix {
			t.Errorf("stream %d frame %d: pixels changed (sha256 %s, want %s)", c.stream, c.seq, sum, c.pix)
		}
		for i, b := range truth {
			want := media.Box{X: c.xy[i][0], Y: c.xy[i][1], W: 30, H: 30, Class: classes[i], Score: 1}
			if b != want {
				t.Errorf("stream %d frame %d object %d: %+v, want %+v", c.stream, c.seq, i, b, want)
			}
		}
	}
}

// TestLanes: with the Lanes motion, objects up to LaneCount never overlap,
// each moves at most one step's pixels a frame (a tracker's IoU holds from
// frame to frame), keeps its lane, and crosses the vertical middle at
// least once in every LanePass+1 frames; more objects than lanes share
// lanes.
func TestLanes(t *testing.T) {
	cases := []struct {
		name    string
		w, h, n int
		lanes   int
		overlap bool // objects may overlap (more than the lanes)
	}{
		{"320x240, 3 objects", 320, 240, 3, 6, false},
		{"320x240, all lanes", 320, 240, 6, 6, false},
		{"640x480, 4 objects", 640, 480, 4, 6, false},
		{"64x64, 1 object", 64, 64, 1, 6, false},
		{"320x240, 9 objects share lanes", 320, 240, 9, 6, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewPattern(c.w, c.h, c.n)
			if err != nil {
				t.Fatal(err)
			}
			p.Motion = Lanes
			if got := p.LaneCount(); got != c.lanes {
				t.Fatalf("LaneCount %d, want %d", got, c.lanes)
			}
			size := max(8, min(c.w, c.h)/8)
			step := (c.w-size)/LanePass + 1
			anyOverlap := false
			for stream := range 2 {
				var prev []media.Box
				lastCross := make([]int, c.n)
				for seq := range 3 * LanePass {
					f, truth, err := p.Frame(stream, uint64(seq))
					if err != nil || f.Valid() != nil || len(truth) != c.n {
						t.Fatalf("frame %d: %v, %d boxes", seq, err, len(truth))
					}
					overlaps := false
					for i, b := range truth {
						if b.X < 0 || b.Y < 0 || b.X+b.W > c.w || b.Y+b.H > c.h {
							t.Fatalf("stream %d frame %d object %d: %+v outside %dx%d", stream, seq, i, b, c.w, c.h)
						}
						for j := range i {
							if b.Rect().Overlaps(truth[j].Rect()) {
								overlaps = true
							}
						}
						if prev == nil {
							continue
						}
						a := prev[i]
						if d := b.X - a.X; d > step || d < -step || b.Y != a.Y {
							t.Fatalf("stream %d frame %d object %d moved from %+v to %+v (at most %d px, in its lane)", stream, seq, i, a, b, step)
						}
						mid := 2 * c.w / 2
						if (2*a.X+a.W < mid) != (2*b.X+b.W < mid) {
							lastCross[i] = seq
						}
						if seq-lastCross[i] > LanePass+1 {
							t.Fatalf("stream %d object %d: no crossing of the middle from frame %d to %d", stream, i, lastCross[i], seq)
						}
					}
					if overlaps && !c.overlap {
						t.Fatalf("stream %d frame %d: objects overlap: %+v", stream, seq, truth)
					}
					anyOverlap = anyOverlap || overlaps
					prev = truth
				}
			}
			if c.overlap && !anyOverlap {
				t.Errorf("%d objects in %d lanes never overlapped: not sharing lanes", c.n, c.lanes)
			}
		})
	}
	// An unknown motion is an error, not a crash.
	p, _ := NewPattern(64, 64, 1)
	p.Motion = Motion(7)
	if _, _, err := p.Frame(0, 0); err == nil {
		t.Error("motion 7 drew a frame")
	}
	// No classes: objects are "object", not a crash.
	p.Motion, p.Classes = Lanes, nil
	if _, truth, err := p.Frame(0, 0); err != nil || truth[0].Class != "object" {
		t.Errorf("no classes: %v %+v", err, truth)
	}
}

// TestUpright: with Upright, people are half as wide as tall, centred
// where their square would be, and drawn as that upright ellipse (more
// rows than columns painted, the box's corners not); other classes keep
// their squares.
func TestUpright(t *testing.T) {
	cases := []struct {
		name    string
		upright bool
		motion  Motion
	}{
		{"orbit", true, Orbit},
		{"lanes", true, Lanes},
		{"off", false, Lanes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewPattern(320, 240, 4)
			if err != nil {
				t.Fatal(err)
			}
			square, _ := NewPattern(320, 240, 4)
			p.Motion, square.Motion, p.Upright = c.motion, c.motion, c.upright
			p.Classes, square.Classes = []string{"person", "car"}, []string{"person", "car"}
			for seq := range uint64(5) {
				f, truth, err := p.Frame(0, seq*11)
				if err != nil {
					t.Fatal(err)
				}
				_, sq, _ := square.Frame(0, seq*11)
				for i, b := range truth {
					if b.Class != "person" || !c.upright {
						if b != sq[i] {
							t.Fatalf("frame %d object %d: %+v, want the square %+v", seq*11, i, b, sq[i])
						}
						continue
					}
					s := sq[i]
					if b.H != s.H || b.W != s.W/2 || b.Y != s.Y || b.X != s.X+(s.W-b.W)/2 {
						t.Fatalf("frame %d person %d: %+v, want half the width of %+v, centred", seq*11, i, b, s)
					}
					rows, cols := map[int]bool{}, map[int]bool{}
					for y := b.Y; y < b.Y+b.H; y++ {
						for x := b.X; x < b.X+b.W; x++ {
							if j := (y*f.W + x) * 3; f.Pix[j] != 0 || f.Pix[j+1] != 0 || f.Pix[j+2] != 0 {
								rows[y], cols[x] = true, true
							}
						}
					}
					corner := (b.Y*f.W + b.X) * 3
					if len(rows) <= len(cols) || f.Pix[corner] != 0 {
						t.Fatalf("frame %d person %d: %d rows x %d columns painted, corner %v: not an upright ellipse", seq*11, i, len(rows), len(cols), f.Pix[corner:corner+3])
					}
				}
			}
		})
	}
}
