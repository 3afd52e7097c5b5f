// Package prep turns frames into a model's input tensor as its registry
// entry says (gpu/registry Input: size, stretch or letterbox, colour order,
// layout, scale, mean, std, dtype) and reads output tensors back: the one
// preprocessing every executor shares, so a model gives the same answer in
// process (gpu/onnx) and over the Open Inference Protocol (gpu/kserve).
// Pure Go.
package prep

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/mdag/mdag/gpu/registry"
	"github.com/mdag/mdag/media"
)

// geometry is where frame f lands in in's tensor: the source step per
// output pixel (sx, sy) and the placed area (x0, y0, w, h): the whole
// tensor when stretched, the aspect-kept area, centred, when letterboxed
// (the rest is padding).
func geometry(f *media.Frame, in *registry.Input) (sx, sy float64, x0, y0, w, h int) {
	W, H := in.Width, in.Height
	sx, sy = float64(f.W)/float64(W), float64(f.H)/float64(H)
	w, h = W, H
	if in.Resize == "letterbox" {
		s := max(sx, sy)
		sx, sy = s, s
		w, h = min(W, int(math.Round(float64(f.W)/s))), min(H, int(math.Round(float64(f.H)/s)))
		x0, y0 = (W-w)/2, (H-h)/2
	}
	return sx, sy, x0, y0, w, h
}

// channels maps the model's channels to the frame's: model channel c is
// frame channel channels(in)[c] (frames are BGR).
func channels(in *registry.Input) [3]int {
	if in.Colour == "bgr" {
		return [3]int{0, 1, 2}
	}
	return [3]int{2, 1, 0}
}

// Fill writes frame f, resized (bilinear; stretched or letterboxed) and
// normalised as the registry entry says, into one item's slot of the batch
// buffer, in its layout and colour order. Letterbox padding is 0. uint8
// and float16 inputs are filled through a float32 slot and converted.
func Fill(dst []float32, f *media.Frame, in *registry.Input) {
	W, H := in.Width, in.Height
	sx, sy, x0, y0, w, h := geometry(f, in)
	if w != W || h != H {
		clear(dst)
	}
	src := channels(in)
	var a, b [3]float32 // x = v*a + b
	for c := range 3 {
		a[c] = float32(in.Scale / in.Std[c])
		b[c] = float32(-in.Mean[c] / in.Std[c])
	}
	u8 := in.DType == "uint8"
	if u8 {
		a, b = [3]float32{1, 1, 1}, [3]float32{}
	}
	// the source columns and weights of every output column
	xs0, xs1, wx := make([]int, w), make([]int, w), make([]float32, w)
	for x := range w {
		fx := min(max((float64(x)+0.5)*sx-0.5, 0), float64(f.W-1))
		ix := int(fx)
		xs0[x], xs1[x], wx[x] = ix*3, min(ix+1, f.W-1)*3, float32(fx-float64(ix))
	}
	nhwc := in.Layout == "NHWC"
	plane := W * H
	stride := f.W * 3
	pix := f.Pix
	for y := range h {
		fy := min(max((float64(y)+0.5)*sy-0.5, 0), float64(f.H-1))
		iy := int(fy)
		r0, r1 := pix[iy*stride:(iy+1)*stride], pix[min(iy+1, f.H-1)*stride:]
		dy := float32(fy - float64(iy))
		oy := y + y0
		for x := range w {
			p0, p1, dx := xs0[x], xs1[x], wx[x]
			o := oy*W + x + x0
			for c := range 3 {
				k := src[c]
				top := float32(r0[p0+k]) + (float32(r0[p1+k])-float32(r0[p0+k]))*dx
				bot := float32(r1[p0+k]) + (float32(r1[p1+k])-float32(r1[p0+k]))*dx
				v := top + (bot-top)*dy
				if u8 {
					v = float32(math.Round(float64(v)))
				}
				v = v*a[c] + b[c]
				if nhwc {
					dst[o*3+c] = v
				} else {
					dst[c*plane+o] = v
				}
			}
		}
	}
}

// ToHalf converts to IEEE 754 binary16 (round to nearest even).
func ToHalf(v float64) uint16 {
	f := math.Float32bits(float32(v))
	sign := uint16(f>>16) & 0x8000
	exp := int((f>>23)&0xff) - 127 + 15
	man := f & 0x7fffff
	switch {
	case (f>>23)&0xff == 0xff: // inf, nan
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 0x1f:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		man |= 0x800000
		shift := uint(14 - exp)
		h := man >> shift
		if rem := man & (1<<shift - 1); rem > 1<<(shift-1) || (rem == 1<<(shift-1) && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | man>>13
	if rem := man & 0x1fff; rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// FromHalf converts IEEE 754 binary16 to float32.
func FromHalf(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0:
		return math.Float32frombits(sign) + float32(man)*float32(math.Ldexp(1, -24))*sgn(sign)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | man<<13)
}

func sgn(sign uint32) float32 {
	if sign != 0 {
		return -1
	}
	return 1
}

// Pack writes frames as one batch tensor of in's dtype into dst, row-major
// and little-endian (the Open Inference Protocol's raw tensor bytes), and
// returns the bytes used. dst must hold ItemBytes(in) per frame; scratch,
// one item of float32 values, is reused across calls (nil: allocated).
// A batch larger than a few small items is split over GOMAXPROCS
// goroutines, one item at a time: a GPU's batch of 32 crops is otherwise
// longer to prepare than to run.
func Pack(dst []byte, in *registry.Input, frames []*media.Frame, scratch []float32) ([]byte, error) {
	per := ItemBytes(in)
	if per == 0 {
		return nil, fmt.Errorf("prep: dtype %q: want float32, float16 or uint8", in.DType)
	}
	if len(dst) < per*len(frames) {
		return nil, fmt.Errorf("prep: %d bytes for %d items of %d", len(dst), len(frames), per)
	}
	n := in.Width * in.Height * 3
	workers := min(runtime.GOMAXPROCS(0), len(frames))
	if workers <= 1 || n*len(frames) < parallelValues {
		if len(scratch) < n {
			scratch = make([]float32, n)
		}
		for i, f := range frames {
			packOne(dst[i*per:(i+1)*per], f, in, scratch[:n])
		}
		return dst[:per*len(frames)], nil
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			s := scratchPool.Get().(*[]float32)
			if len(*s) < n {
				*s = make([]float32, n)
			}
			for i := int(next.Add(1) - 1); i < len(frames); i = int(next.Add(1) - 1) {
				packOne(dst[i*per:(i+1)*per], frames[i], in, (*s)[:n])
			}
			scratchPool.Put(s)
		})
	}
	wg.Wait()
	return dst[:per*len(frames)], nil
}

// parallelValues is the batch size, in values, from which Pack splits the
// work (about four 64x64 items: below, goroutines cost more than they save).
const parallelValues = 4 * 64 * 64 * 3

var scratchPool = sync.Pool{New: func() any { return new([]float32) }}

// packOne writes one item in the dtype's bytes (scratch: one item of
// float32, for float16 and float32). uint8 items are resized in fixed
// point straight into out (FillU8): no float pass, several times faster.
func packOne(out []byte, f *media.Frame, in *registry.Input, scratch []float32) {
	if in.DType == "uint8" {
		FillU8(out, f, in)
		return
	}
	Fill(scratch, f, in)
	switch in.DType {
	case "float16":
		for j, v := range scratch {
			binary.LittleEndian.PutUint16(out[2*j:], ToHalf(float64(v)))
		}
	default:
		for j, v := range scratch {
			binary.LittleEndian.PutUint32(out[4*j:], math.Float32bits(v))
		}
	}
}

// ItemBytes is the size of one item of in's tensor.
func ItemBytes(in *registry.Input) int {
	return in.Width * in.Height * 3 * DTypeSize(in.DType)
}

// DTypeSize is the bytes of one value of a registry dtype (float32,
// float16, uint8); 0 for another.
func DTypeSize(dtype string) int {
	switch dtype {
	case "float32":
		return 4
	case "float16":
		return 2
	case "uint8":
		return 1
	}
	return 0
}

// Floats reads little-endian raw tensor bytes of a registry dtype as
// float32 values (what the decoders read).
func Floats(dtype string, b []byte) ([]float32, error) {
	sz := DTypeSize(dtype)
	if sz == 0 {
		return nil, fmt.Errorf("prep: dtype %q: decoders read float32, float16 or uint8", dtype)
	}
	if len(b)%sz != 0 {
		return nil, fmt.Errorf("prep: %d bytes is not a whole number of %s values", len(b), dtype)
	}
	out := make([]float32, len(b)/sz)
	for i := range out {
		switch sz {
		case 4:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case 2:
			out[i] = FromHalf(binary.LittleEndian.Uint16(b[2*i:]))
		default:
			out[i] = float32(b[i])
		}
	}
	return out, nil
}

// FillU8 is Fill for uint8 inputs (pixels as they are: no scale, mean or
// std) in fixed point: the same geometry, bilinear weights in 1/1024ths,
// one horizontal pass per source row used (kept for the next output row,
// so an upscale reads each row once) and a vertical blend, rounded to
// nearest; within 1 of Fill's value and several times faster.
func FillU8(dst []byte, f *media.Frame, in *registry.Input) {
	W, H := in.Width, in.Height
	sx, sy, x0, y0, w, h := geometry(f, in)
	if w != W || h != H {
		clear(dst)
	}
	src := channels(in)
	nhwc := in.Layout == "NHWC"
	if f.W == W && f.H == H && w == W && h == H {
		copyU8(dst[:W*H*3], f.Pix[:W*H*3], src, nhwc, W*H)
		return
	}
	c0, c1, c2 := src[0], src[1], src[2]
	const one = 1024
	xs0, xs1, wx := make([]int, w), make([]int, w), make([]int32, w)
	for x := range w {
		fx := min(max((float64(x)+0.5)*sx-0.5, 0), float64(f.W-1))
		ix := int(fx)
		xs0[x], xs1[x], wx[x] = ix*3, min(ix+1, f.W-1)*3, int32(math.Round((fx-float64(ix))*one))
	}
	// hrow resizes source row iy horizontally into out (3 values per
	// output column, model channel order, times 1024)
	stride := f.W * 3
	hrow := func(out []int32, iy int) {
		r := f.Pix[iy*stride : (iy+1)*stride]
		out = out[:3*w]
		for x := range w {
			p0, p1, dx := xs0[x], xs1[x], wx[x]
			a, b := r[p0:p0+3], r[p1:p1+3]
			o := out[3*x : 3*x+3]
			o[0] = int32(a[c0])*(one-dx) + int32(b[c0])*dx
			o[1] = int32(a[c1])*(one-dx) + int32(b[c1])*dx
			o[2] = int32(a[c2])*(one-dx) + int32(b[c2])*dx
		}
	}
	top, bot := make([]int32, 3*w), make([]int32, 3*w)
	have0, have1 := -1, -1 // the source rows in top and bot
	plane := W * H
	for y := range h {
		fy := min(max((float64(y)+0.5)*sy-0.5, 0), float64(f.H-1))
		iy := int(fy)
		iy1 := min(iy+1, f.H-1)
		dy := int32(math.Round((fy - float64(iy)) * one))
		switch {
		case have0 == iy && have1 == iy1:
		case have1 == iy:
			top, bot = bot, top
			have0 = iy
			hrow(bot, iy1)
			have1 = iy1
		default:
			hrow(top, iy)
			hrow(bot, iy1)
			have0, have1 = iy, iy1
		}
		row := (y + y0) * W
		if nhwc {
			out := dst[(row+x0)*3 : (row+x0+w)*3]
			for j := range out {
				out[j] = byte((top[j]*(one-dy) + bot[j]*dy + one*one/2) >> 20)
			}
			continue
		}
		for c := range 3 {
			out := dst[c*plane+row+x0 : c*plane+row+x0+w]
			for x := range out {
				out[x] = byte((top[3*x+c]*(one-dy) + bot[3*x+c]*dy + one*one/2) >> 20)
			}
		}
	}
}

// copyU8 is FillU8 when the frame is the input's size: its pixels in the
// model's channel order (src) and layout, n pixels.
func copyU8(dst, pix []byte, src [3]int, nhwc bool, n int) {
	c0, c1, c2 := src[0], src[1], src[2]
	if nhwc {
		if c0 == 0 && c1 == 1 && c2 == 2 {
			copy(dst, pix)
			return
		}
		for i := 0; i+2 < len(pix) && i+2 < len(dst); i += 3 {
			p := pix[i : i+3 : i+3]
			o := dst[i : i+3 : i+3]
			o[0], o[1], o[2] = p[c0], p[c1], p[c2]
		}
		return
	}
	r, g, b := dst[:n], dst[n:2*n], dst[2*n:3*n]
	for i := range r {
		p := pix[3*i : 3*i+3 : 3*i+3]
		r[i], g[i], b[i] = p[c0], p[c1], p[c2]
	}
}
