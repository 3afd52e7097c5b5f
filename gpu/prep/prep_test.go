package prep

import (
	"math"
	"testing"

	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

func solid(w, h int, b, g, r byte) *media.Frame {
	f := media.NewFrame(w, h)
	for i := 0; i < len(f.Pix); i += 3 {
		f.Pix[i], f.Pix[i+1], f.Pix[i+2] = b, g, r
	}
	return f
}

func TestFill(t *testing.T) {
	in := func(layout, colour, resize, dtype string, w, h int) *registry.Input {
		return &registry.Input{Width: w, Height: h, Layout: layout, Colour: colour, Resize: resize, DType: dtype,
			Scale: 1.0 / 255, Mean: []float64{0, 0.5, 0}, Std: []float64{1, 1, 0.5}}
	}
	// B=10, G=20, R=30
	const b, g, r = 10.0 / 255, 20.0/255 - 0.5, 30.0 / 255 / 0.5
	for _, tc := range []struct {
		name  string
		in    *registry.Input
		frame *media.Frame
		at    func(c, y, x int) int // index of channel c at (y, x)
		want  [3]float64            // per model channel
		pad   bool                  // row 0 is letterbox padding
	}{
		{"NCHW rgb", in("NCHW", "rgb", "stretch", "float32", 4, 4), solid(9, 7, 10, 20, 30), func(c, y, x int) int { return c*16 + y*4 + x }, [3]float64{30.0 / 255, 20.0/255 - 0.5, 10.0 / 255 / 0.5}, false},
		{"NHWC bgr", in("NHWC", "bgr", "stretch", "float32", 4, 4), solid(3, 5, 10, 20, 30), func(c, y, x int) int { return (y*4+x)*3 + c }, [3]float64{b, g, r}, false},
		{"letterbox", in("NCHW", "bgr", "letterbox", "float32", 4, 4), solid(8, 4, 10, 20, 30), func(c, y, x int) int { return c*16 + y*4 + x }, [3]float64{b, g, r}, true},
		{"uint8", &registry.Input{Width: 2, Height: 2, Layout: "NHWC", Colour: "rgb", Resize: "stretch", DType: "uint8", Scale: 1, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}},
			solid(5, 5, 10, 20, 30), func(c, y, x int) int { return (y*2+x)*3 + c }, [3]float64{30, 20, 10}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, tc.in.Width*tc.in.Height*3)
			for i := range dst {
				dst[i] = 99 // letterbox must clear it
			}
			Fill(dst, tc.frame, tc.in)
			for y := range tc.in.Height {
				for x := range tc.in.Width {
					for c := range 3 {
						want := tc.want[c]
						if tc.pad && (y == 0 || y == 3) {
							want = 0
						}
						if got := float64(dst[tc.at(c, y, x)]); math.Abs(got-want) > 1e-6 {
							t.Fatalf("channel %d at (%d,%d): %g, want %g", c, y, x, got, want)
						}
					}
				}
			}
		})
	}
}

func TestHalf(t *testing.T) {
	for _, v := range []float64{0, 1, -1, 0.5, 2.5, -0.1, 65504, 1e-5, 6e-8, 1e-9} {
		h := ToHalf(v)
		got := float64(FromHalf(h))
		if tol := math.Max(math.Abs(v)*1e-3, 6e-8); math.Abs(got-v) > tol {
			t.Errorf("%g -> %#04x -> %g", v, h, got)
		}
	}
	if ToHalf(1e6) != 0x7c00 || ToHalf(-1e6) != 0xfc00 {
		t.Errorf("overflow: %#04x %#04x, want +-inf", ToHalf(1e6), ToHalf(-1e6))
	}
}

// Pack writes what Fill computes, in the dtype's bytes, and Floats reads
// it back.
func TestPackFloats(t *testing.T) {
	f := solid(7, 5, 10, 20, 30)
	for _, dtype := range []string{"float32", "float16", "uint8"} {
		in := &registry.Input{Width: 3, Height: 2, Layout: "NCHW", Colour: "rgb", Resize: "stretch", DType: dtype,
			Scale: 1, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}}
		if dtype != "uint8" {
			in.Scale = 1.0 / 255
		}
		want := make([]float32, 18)
		Fill(want, f, in)
		b, err := Pack(make([]byte, 2*ItemBytes(in)), in, []*media.Frame{f, f}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 2*ItemBytes(in) {
			t.Fatalf("%s: %d bytes, want %d", dtype, len(b), 2*ItemBytes(in))
		}
		got, err := Floats(dtype, b)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if d := math.Abs(float64(v - want[i%18])); d > 1e-3 {
				t.Fatalf("%s: value %d = %g, want %g", dtype, i, v, want[i%18])
			}
		}
	}
	if _, err := Pack(make([]byte, 3), &registry.Input{Width: 1, Height: 1, DType: "float32"}, []*media.Frame{f}, nil); err == nil {
		t.Error("Pack into a short buffer: no error")
	}
	if _, err := Floats("float32", make([]byte, 5)); err == nil {
		t.Error("Floats of 5 bytes as float32: no error")
	}
}
