package prep

import (
	"bytes"
	"fmt"
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

// The parallel path (a batch of large items) writes the same bytes as one
// item at a time.
func TestPackParallel(t *testing.T) {
	in := &registry.Input{Width: 96, Height: 80, Layout: "NCHW", Colour: "rgb", Resize: "letterbox", DType: "float16",
		Scale: 1.0 / 255, Mean: []float64{0.1, 0.2, 0.3}, Std: []float64{0.5, 0.6, 0.7}}
	var frames []*media.Frame
	for i := range 9 {
		f := media.NewFrame(50+7*i, 40+3*i)
		for j := range f.Pix {
			f.Pix[j] = byte(j*7 + i)
		}
		frames = append(frames, f)
	}
	if 96*80*3*len(frames) < parallelValues {
		t.Fatal("the batch is too small to take the parallel path")
	}
	got, err := Pack(make([]byte, len(frames)*ItemBytes(in)), in, frames, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		one, err := Pack(make([]byte, ItemBytes(in)), in, []*media.Frame{f}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(one, got[i*ItemBytes(in):(i+1)*ItemBytes(in)]) {
			t.Fatalf("item %d differs between the batch and alone", i)
		}
	}
}

func BenchmarkPack(b *testing.B) {
	in := &registry.Input{Width: 224, Height: 224, Layout: "NHWC", Colour: "rgb", Resize: "stretch", DType: "uint8",
		Scale: 1, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}}
	for _, n := range []int{1, 8, 32} {
		frames := make([]*media.Frame, n)
		for i := range frames {
			frames[i] = media.NewFrame(160, 120)
		}
		dst := make([]byte, n*ItemBytes(in))
		b.Run(fmt.Sprintf("b%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := Pack(dst, in, frames, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FillU8 agrees with Fill to within 1 on every value, for every geometry.
func TestFillU8(t *testing.T) {
	for _, tc := range []struct {
		w, h, W, H     int
		layout, resize string
	}{
		{640, 480, 224, 224, "NHWC", "stretch"}, {37, 91, 64, 48, "NCHW", "letterbox"}, {224, 224, 224, 224, "NHWC", "stretch"},
		{5, 3, 17, 11, "NCHW", "stretch"}, {300, 100, 96, 96, "NHWC", "letterbox"},
		// the frame at the input's size: copied, not resized
		{224, 224, 224, 224, "NCHW", "stretch"}, {64, 48, 64, 48, "NHWC", "letterbox"}, {64, 48, 64, 48, "NCHW", "letterbox"},
	} {
		for _, colour := range []string{"rgb", "bgr"} {
			in := &registry.Input{Width: tc.W, Height: tc.H, Layout: tc.layout, Colour: colour, Resize: tc.resize, DType: "uint8",
				Scale: 1, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}}
			f := media.NewFrame(tc.w, tc.h)
			for j := range f.Pix {
				f.Pix[j] = byte((j*37 + j/tc.w*11) % 251)
			}
			want := make([]float32, tc.W*tc.H*3)
			Fill(want, f, in)
			got := make([]byte, len(want))
			for j := range got {
				got[j] = 77 // letterbox padding must be written
			}
			FillU8(got, f, in)
			for j, v := range got {
				if d := math.Abs(float64(v) - float64(want[j])); d > 1 {
					t.Fatalf("%dx%d -> %dx%d %s %s %s: value %d = %d, Fill says %g", tc.w, tc.h, tc.W, tc.H, tc.layout, tc.resize, colour, j, v, want[j])
				}
			}
		}
	}
}

func BenchmarkFill224(b *testing.B) {
	in := &registry.Input{Width: 224, Height: 224, Layout: "NHWC", Colour: "rgb", Resize: "stretch", DType: "uint8",
		Scale: 1, Mean: []float64{0, 0, 0}, Std: []float64{1, 1, 1}}
	f := media.NewFrame(160, 120)
	b.Run("float", func(b *testing.B) {
		dst := make([]float32, 224*224*3)
		for b.Loop() {
			Fill(dst, f, in)
		}
	})
	b.Run("u8", func(b *testing.B) {
		dst := make([]byte, 224*224*3)
		for b.Loop() {
			FillU8(dst, f, in)
		}
	})
	// a frame at the input's size: copied in the model's channel order
	same := media.NewFrame(224, 224)
	b.Run("u8-same-size", func(b *testing.B) {
		dst := make([]byte, 224*224*3)
		for b.Loop() {
			FillU8(dst, same, in)
		}
	})
}
