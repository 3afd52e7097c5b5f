package registry

import (
	"fmt"
	"strings"

	"github.com/mdag/mdag/gpu/decode"
)

// checkHead checks the outputs a boxes or keypoints decoder reads with
// decode.CheckShapes (their number, rank, layout and fixed sizes, the
// input's size for grid heads, the labels against the classes) and says
// a mismatch with both views: what the decoder and format read, what the
// file gives and why they differ, e.g. "model det: the boxes decoder
// (format yolov5) reads one output [K,5+C] (...); yolo11n.onnx gives
// 'output0' float32[N,84,8400]: output 'output0' [84,8400] looks
// transposed, [4+C,K] with K = 8400 candidates (format: yolov8)".
func (m *Model) checkHead(outs []Tensor, file string) error {
	d := m.Decoder
	err := decode.CheckShapes(d.Name, d.Format, Shapes(outs), decode.Input{W: m.Input.Width, H: m.Input.Height}, len(m.Labels))
	if err == nil {
		return nil
	}
	hint := ""
	if len(m.Outputs) == 0 && strings.Contains(err.Error(), "outputs given") {
		hint = "; name the ones it reads, in order, in outputs:"
	}
	return fmt.Errorf("model %s: the %s decoder (format %s) reads %s; %s gives %s: %v%s", m.Name, d.Name, d.Format, decode.Layout(d.Name, d.Format), file, list(outs), err, hint)
}

// Shapes are the tensors' shapes without the batch dimension, -1 where
// symbolic: what decode.CheckShapes and decode.Infer read (`mdag models
// inspect` proposes a decoder from a graph with decode.Infer(Shapes(g.Outputs),
// decode.Input{W: ..., H: ...})).
func Shapes(ts []Tensor) []decode.Shape {
	out := make([]decode.Shape, len(ts))
	for i, t := range ts {
		dims := make([]int64, 0, max(0, len(t.Dims)-1))
		for _, dm := range t.Dims[min(1, len(t.Dims)):] {
			v := int64(-1)
			if dm.Fixed {
				v = dm.Value
			}
			dims = append(dims, v)
		}
		out[i] = decode.Shape{Name: t.Name, Dims: dims}
	}
	return out
}
