package plot

import (
	"bytes"
	"encoding/binary"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"testing"
)

// FuzzCharts: any values (huge, tiny, equal, negative, NaN, Inf) and sizes
// give an error or a well-formed SVG from every chart kind, never a panic
// (gonum's axes panic on an empty range; the package must not reach one).
func FuzzCharts(f *testing.F) {
	enc := func(v ...float64) []byte {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
		}
		return b
	}
	f.Add(enc(0, 1, 2, 3), uint8(2), false)
	f.Add(enc(1, 1, 1, 1), uint8(1), true)
	f.Add(enc(-1e308, 1e308, 5e-324, 0), uint8(3), true)
	f.Add(enc(math.NaN(), math.Inf(1)), uint8(1), false)
	f.Add(enc(1, 1+1e-15, 1, 1+2e-15), uint8(2), false)
	f.Fuzz(func(t *testing.T, data []byte, split uint8, logX bool) {
		var v []float64
		for i := 0; i+8 <= len(data) && len(v) < 64; i += 8 {
			v = append(v, math.Float64frombits(binary.LittleEndian.Uint64(data[i:])))
		}
		n := len(v) / 2
		xs, ys := v[:n], v[n:2*n]
		k := min(int(split), len(v))
		check := func(what string, draw func(w io.Writer) error) {
			var b bytes.Buffer
			if err := draw(&b); err != nil {
				return
			}
			dec := xml.NewDecoder(&b)
			for {
				if _, err := dec.Token(); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("%s: no error, but not XML: %v", what, err)
				}
			}
		}
		check("lines", func(w io.Writer) error {
			return Lines(w, "t", "x", []Panel{{YLabel: "y", Series: []Series{{Name: "a", X: xs, Y: ys}}}}, 10, 8)
		})
		check("bars", func(w io.Writer) error {
			groups := make([]string, k)
			for i := range groups {
				groups[i] = string(rune('a' + i%26))
			}
			return Bars(w, "t", "y", groups, []BarSeries{{Name: "s", Values: v[:k]}, {Name: "r", Values: v[len(v)-k:]}}, 10, 8)
		})
		check("cdf", func(w io.Writer) error {
			return CDF(w, "t", "x", []Sample{{Name: "a", Values: v[:k]}, {Name: "b", Values: v[k:]}}, logX, 10, 8)
		})
	})
}
