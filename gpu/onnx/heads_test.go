package onnx

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdag/mdag/media"
)

// TestHeads runs the detector and pose heads of gpu/decode/testdata/heads
// (tools/models/heads.py: constant outputs, a symbolic batch) through ONNX
// Runtime, the registry's defaults and the entry's decoder, a batch of
// two frames, and compares each item's boxes with those numpy computed.
func TestHeads(t *testing.T) {
	requireLib(t)
	dir, err := filepath.Abs("../decode/testdata/heads")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "heads.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Cases []struct {
			Name, File, Decoder, Format string
			Input                       struct{ W, H int }
			Frame                       struct{ W, H int }
			Letterbox                   bool
			Threshold, NMS              float64
			Labels                      []string
			Want                        []struct {
				X, Y, W, H int
				Class      string
				Score      float32
				Keypoints  [][3]float32
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	var entries []string
	for i, c := range d.Cases {
		resize, labels := "stretch", ""
		if c.Letterbox {
			resize = "letterbox"
		}
		if len(c.Labels) > 0 {
			p := filepath.Join(tmp, fmt.Sprintf("labels%d.txt", i))
			if err := os.WriteFile(p, []byte(strings.Join(c.Labels, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			labels = ", labels: " + p
		}
		entries = append(entries, fmt.Sprintf(`
  m%d:
    format: onnx
    file: %s
    input: {name: input, dtype: float32, layout: NCHW, width: %d, height: %d, resize: %s}
    max_batch: 4
    decoder: {name: %s, format: %s, threshold: %g%s}
`, i, filepath.Join(dir, c.File), c.Input.W, c.Input.H, resize, c.Decoder, c.Format, c.Threshold, labels))
	}
	r := writeRegistry(t, entries...)
	x, err := New(r, Config{Sessions: 1, IntraThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	for i, c := range d.Cases {
		t.Run(c.Name, func(t *testing.T) {
			name := fmt.Sprintf("m%d", i)
			if nms := r.Models[name].Decoder.NMS; nms != c.NMS {
				t.Fatalf("the registry's NMS for %s %s is %g, the case's %g", c.Decoder, c.Format, nms, c.NMS)
			}
			items := []*media.Item{{Stream: "a", Frame: frame(1, c.Frame.W, c.Frame.H)}, {Stream: "b", Frame: frame(2, c.Frame.W, c.Frame.H)}}
			out, err := x.Run(context.Background(), name, items)
			if err != nil {
				t.Fatal(err)
			}
			for k, o := range out {
				got := o[0].Boxes
				if len(got) != len(c.Want) {
					t.Fatalf("item %d: %d boxes %v, want %d %+v", k, len(got), got, len(c.Want), c.Want)
				}
				for j, g := range got {
					w := c.Want[j]
					if g.X != w.X || g.Y != w.Y || g.W != w.W || g.H != w.H || g.Class != w.Class || math.Abs(float64(g.Score-w.Score)) > 1e-5 ||
						(g.Keypoints == nil) != (w.Keypoints == nil) {
						t.Fatalf("item %d box %d: %v, want %+v", k, j, g, w)
					}
					if g.Keypoints == nil {
						continue
					}
					if len(g.Keypoints.Points) != len(w.Keypoints) {
						t.Fatalf("item %d box %d: %d points, want %d", k, j, len(g.Keypoints.Points), len(w.Keypoints))
					}
					for pi, p := range g.Keypoints.Points {
						q := w.Keypoints[pi]
						if math.Abs(float64(p.X-q[0])) > 1e-3 || math.Abs(float64(p.Y-q[1])) > 1e-3 || math.Abs(float64(p.Score-q[2])) > 1e-5 {
							t.Fatalf("item %d box %d point %d: %+v, want %v", k, j, pi, p, q)
						}
					}
				}
			}
		})
	}
}
