// Package opencv is the GPU executor that runs real ONNX models through
// OpenCV's DNN module (gocv) on the CPU target, batch by item (OpenCV 4.6),
// with decoders that turn output tensors into detections (BlazeFace so
// far). It is an edge package: only the full binary links it.
package opencv

import (
	"context"
	"errors"
	"fmt"
	"image"
	"slices"
	"sort"
	"strings"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/gpu"
	"github.com/mdag/mdag/gpu/decode"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/modules/cv"
)

// Decoders lists the output decoders the OpenCV executor knows.
func Decoders() []string { return []string{"blazeface"} }

// OpenCV runs ONNX models with OpenCV's DNN module (gocv) on the CPU
// target. OpenCV 4.6 runs these models at batch 1 only, so a batch is run
// item by item on one network; `instances` networks per model let that
// many batches run at once (the worker's concurrency level). Inputs are
// built by the decoder at exactly the network's input shape, and the
// output shapes are checked when the model loads, because a shape mismatch
// inside Forward aborts the process (a C++ exception through cgo).
type OpenCV struct {
	models map[string]*cvModel
}

type cvModel struct {
	file gpu.ModelFile
	nets chan *gocv.Net
	all  []*gocv.Net
}

// NewOpenCV loads every model, instances networks each (>= 1).
func NewOpenCV(files []gpu.ModelFile, instances int) (*OpenCV, error) {
	instances = max(1, instances)
	x := &OpenCV{models: map[string]*cvModel{}}
	var errs []error
	for _, f := range files {
		if _, dup := x.models[f.Name]; dup {
			errs = append(errs, fmt.Errorf("model %s: given twice", f.Name))
			continue
		}
		if !slices.Contains(Decoders(), f.Decoder) {
			errs = append(errs, fmt.Errorf("model %s: decoder %q unknown (known: %s)", f.Name, f.Decoder, strings.Join(Decoders(), ", ")))
			continue
		}
		if err := gpu.CheckONNX(f.Path); err != nil {
			errs = append(errs, fmt.Errorf("model %s: %w", f.Name, err))
			continue
		}
		m := &cvModel{file: f, nets: make(chan *gocv.Net, instances)}
		for range instances {
			n := gocv.ReadNetFromONNX(f.Path)
			if n.Empty() {
				n.Close()
				errs = append(errs, fmt.Errorf("model %s: %s is not an ONNX model OpenCV can read", f.Name, f.Path))
				break
			}
			net := &n
			if err := checkBlazeFace(net); err != nil {
				net.Close()
				errs = append(errs, fmt.Errorf("model %s (%s): %w", f.Name, f.Path, err))
				break
			}
			m.all = append(m.all, net)
			m.nets <- net
		}
		x.models[f.Name] = m
	}
	if len(errs) > 0 {
		x.Close()
		return nil, errors.Join(errs...)
	}
	return x, nil
}

// Kind implements gpu.Executor.
func (x *OpenCV) Kind() string { return "opencv" }

// Models lists the loaded model names.
func (x *OpenCV) Models() []string {
	out := make([]string, 0, len(x.models))
	for n := range x.models {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Close frees the networks.
func (x *OpenCV) Close() {
	for _, m := range x.models {
		for _, n := range m.all {
			n.Close()
		}
		m.all = nil
	}
}

// Run implements Executor.
func (x *OpenCV) Run(ctx context.Context, model string, items []*media.Item) ([][]*media.Item, error) {
	m := x.models[model]
	if m == nil {
		return nil, fmt.Errorf("opencv: model %q is not loaded here (loaded: %s)", model, strings.Join(x.Models(), ", "))
	}
	for i, it := range items {
		if err := it.Frame.Valid(); err != nil {
			return nil, fmt.Errorf("opencv: item %d: %w", i, err)
		}
	}
	var net *gocv.Net
	select {
	case net = <-m.nets:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { m.nets <- net }()
	out := make([][]*media.Item, len(items))
	for i, it := range items {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		boxes, err := blazeFace(net, it.Frame)
		if err != nil {
			return nil, err
		}
		o := it.Derive()
		o.Frame, o.Region, o.Boxes = it.Frame, it.Region, boxes
		out[i] = []*media.Item{o}
	}
	return out, nil
}

// BlazeFace (front, 128x128): input NHWC [1,128,128,3] RGB in [-1,1];
// outputs decoded by decode.BlazeFace.
const bfSize = decode.BlazeFaceSize

var bfOutputs = []string{"Identity:0", "Identity_1:0", "Identity_2:0", "Identity_3:0"}

type bfHead struct{ cells, anchors int }

var bfHeads = []bfHead{{16, 2}, {8, 6}}

// BlazeFaceThreshold is the score a detection needs; BlazeFaceNMS the IoU
// above which the weaker of two detections is suppressed. The anchor and
// suppression math is gpu/decode's, which the onnx executor shares.
const (
	BlazeFaceThreshold = decode.BlazeFaceThreshold
	BlazeFaceNMS       = decode.BlazeFaceNMS
)

// checkBlazeFace checks the output layers by name (asking Forward for a
// layer that does not exist aborts the process), then runs one blank input
// and checks the output shapes.
func checkBlazeFace(net *gocv.Net) error {
	var have []string
	for _, id := range net.GetUnconnectedOutLayers() {
		l := net.GetLayer(id)
		have = append(have, l.GetName())
		l.Close()
	}
	for _, o := range bfOutputs {
		if !slices.Contains(have, o) {
			return fmt.Errorf("not a BlazeFace model: no output %s (outputs: %s)", o, strings.Join(have, ", "))
		}
	}
	in := gocv.NewMatWithSizes([]int{1, bfSize, bfSize, 3}, gocv.MatTypeCV32F)
	defer in.Close()
	outs, err := forward(net, in)
	if err != nil {
		return err
	}
	closeAll(outs)
	return nil
}

func closeAll(ms []gocv.Mat) {
	for i := range ms {
		ms[i].Close()
	}
}

// forward runs the network and checks every output's shape.
func forward(net *gocv.Net, in gocv.Mat) ([]gocv.Mat, error) {
	net.SetInput(in, "")
	outs := net.ForwardLayers(bfOutputs)
	if len(outs) != len(bfOutputs) {
		closeAll(outs)
		return nil, fmt.Errorf("blazeface: %d outputs, want %d (%s)", len(outs), len(bfOutputs), strings.Join(bfOutputs, ", "))
	}
	for i, h := range []bfHead{bfHeads[0], bfHeads[1], bfHeads[0], bfHeads[1]} {
		want := []int{1, h.cells * h.cells * h.anchors, 1}
		if i >= 2 {
			want[2] = 16
		}
		if got := outs[i].Size(); !slices.Equal(got, want) {
			closeAll(outs)
			return nil, fmt.Errorf("blazeface: output %s has shape %v, want %v", bfOutputs[i], got, want)
		}
	}
	return outs, nil
}

// blazeFace detects faces in f, boxes in f's coordinates.
func blazeFace(net *gocv.Net, f *media.Frame) ([]media.Box, error) {
	src, err := cv.ToMat(f)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	small := gocv.NewMat()
	defer small.Close()
	gocv.Resize(src, &small, image.Pt(bfSize, bfSize), 0, 0, gocv.InterpolationLinear)
	px := small.ToBytes() // BGR, 128*128*3
	in := gocv.NewMatWithSizes([]int{1, bfSize, bfSize, 3}, gocv.MatTypeCV32F)
	defer in.Close()
	data, err := in.DataPtrFloat32()
	if err != nil {
		return nil, err
	}
	if len(data) != len(px) {
		return nil, fmt.Errorf("blazeface: input has %d values, want %d", len(data), len(px))
	}
	for i := 0; i < len(px); i += 3 { // BGR -> RGB, [0,255] -> [-1,1]
		data[i] = float32(px[i+2])/127.5 - 1
		data[i+1] = float32(px[i+1])/127.5 - 1
		data[i+2] = float32(px[i])/127.5 - 1
	}
	outs, err := forward(net, in)
	if err != nil {
		return nil, err
	}
	defer closeAll(outs)
	dec := make([]decode.Output, len(outs))
	for i, o := range outs {
		data, err := o.DataPtrFloat32()
		if err != nil {
			return nil, err
		}
		sz := o.Size()
		shape := make([]int64, 0, len(sz))
		for _, d := range sz[1:] { // drop the batch dimension
			shape = append(shape, int64(d))
		}
		dec[i] = decode.Output{Name: bfOutputs[i], Shape: shape, Data: data}
	}
	r, err := decode.BlazeFace(dec, decode.Geometry{InW: bfSize, InH: bfSize, FrameW: f.W, FrameH: f.H},
		decode.Params{Threshold: BlazeFaceThreshold, NMS: BlazeFaceNMS})
	return r.Boxes, err
}
