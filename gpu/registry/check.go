package registry

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// InputShape is the input tensor's shape for a batch of n.
func (m *Model) InputShape(n int) []int64 {
	if m.Input.Layout == "NHWC" {
		return []int64{int64(n), int64(m.Input.Height), int64(m.Input.Width), 3}
	}
	return []int64{int64(n), 3, int64(m.Input.Height), int64(m.Input.Width)}
}

// BatchSymbolic reports whether t's leading dimension is symbolic.
func BatchSymbolic(t Tensor) bool { return len(t.Dims) > 0 && !t.Dims[0].Fixed }

// Check compares the entry with the model's graph: the input's name,
// dtype, rank, layout and size, a batch dimension that can carry max_batch
// (symbolic, or fixed at 1 with max_batch 1) and the outputs named.
// Every problem is said with the graph's and the registry's view, e.g.
// "model face: input 'input' is float32[1,3,128,128] in blazeface.onnx,
// the registry says NHWC 128x128".
func (m *Model) Check(g *Graph) error {
	file := filepath.Base(m.Path)
	say := fmt.Sprintf("%s %dx%d", m.Input.Layout, m.Input.Width, m.Input.Height)
	in, ok := g.Input(m.Input.Name)
	if !ok {
		return fmt.Errorf("model %s: no input '%s' in %s (its inputs: %s)", m.Name, m.Input.Name, file, list(g.Inputs))
	}
	var errs []error
	bad := func(why string) {
		errs = append(errs, fmt.Errorf("model %s: input '%s' is %s in %s, the registry says %s%s", m.Name, in.Name, in, file, say, why))
	}
	if len(g.Inputs) > 1 {
		errs = append(errs, fmt.Errorf("model %s: %s has %d inputs (%s); the executor feeds one", m.Name, file, len(g.Inputs), list(g.Inputs)))
	}
	if in.DType != m.Input.DType {
		say = m.Input.DType + " " + say
		bad("")
	} else if len(in.Dims) != 4 {
		bad(" (want rank 4)")
	} else {
		want := m.InputShape(1)
		for i := 1; i < 4; i++ {
			if d := in.Dims[i]; d.Fixed && d.Value != want[i] {
				bad("")
				break
			}
		}
		if d := in.Dims[0]; d.Fixed && (d.Value != 1 || m.MaxBatch > 1) {
			errs = append(errs, fmt.Errorf("model %s: input '%s' is %s in %s: its batch dimension is fixed at %d, so it cannot run batches of up to max_batch %d "+
				"(make the leading dimension symbolic, or set max_batch: 1)", m.Name, in.Name, in, file, d.Value, m.MaxBatch))
		}
	}
	outs := g.Outputs
	if len(m.Outputs) > 0 {
		outs = nil
		for _, n := range m.Outputs {
			o, ok := g.Output(n)
			if !ok {
				errs = append(errs, fmt.Errorf("model %s: no output '%s' in %s (its outputs: %s)", m.Name, n, file, list(g.Outputs)))
				continue
			}
			outs = append(outs, o)
		}
	}
	for _, o := range outs {
		if o.DType != "float32" && o.DType != "float16" {
			errs = append(errs, fmt.Errorf("model %s: output '%s' is %s in %s; decoders read float32 or float16", m.Name, o.Name, o, file))
		} else if len(o.Dims) == 0 {
			errs = append(errs, fmt.Errorf("model %s: output '%s' is a scalar in %s; want the batch as its leading dimension", m.Name, o.Name, file))
		} else if d := o.Dims[0]; d.Fixed && (d.Value != 1 || m.MaxBatch > 1) {
			errs = append(errs, fmt.Errorf("model %s: output '%s' is %s in %s: its leading dimension is fixed at %d, not the batch (max_batch %d)", m.Name, o.Name, o, file, d.Value, m.MaxBatch))
		}
	}
	if err := m.checkDecoder(outs, file); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkDecoder checks the outputs the decoder reads against what it needs:
// how many, and (where the graph fixes them) their shapes after the batch.
func (m *Model) checkDecoder(outs []Tensor, file string) error {
	var want int
	switch m.Decoder.Name {
	case "classify":
		want = 1
	case "blazeface":
		want = 4
	case "boxes", "keypoints":
		return m.checkHead(outs, file) // heads.go
	default:
		return nil
	}
	if want > 0 && len(outs) != want {
		return fmt.Errorf("model %s: the %s decoder reads %d outputs, %s gives %d (%s)%s", m.Name, m.Decoder.Name, want, file, len(outs), list(outs),
			map[bool]string{true: "; name them in outputs:", false: ""}[len(outs) > want])
	}
	switch m.Decoder.Name {
	case "classify":
		if n := classes(outs[0]); n > 0 && len(m.Labels) > 0 && n != int64(len(m.Labels)) {
			return fmt.Errorf("model %s: output '%s' is %s in %s: %d classes, the labels file has %d", m.Name, outs[0].Name, outs[0], file, n, len(m.Labels))
		}
	case "blazeface":
		have := map[string]bool{}
		for _, o := range outs {
			have[tail(o)] = true
		}
		for _, w := range []string{"[512,1]", "[384,1]", "[512,16]", "[384,16]"} {
			if !have[w] && !have["?"] {
				return fmt.Errorf("model %s: the blazeface decoder needs outputs shaped [512,1], [384,1], [512,16], [384,16] after the batch; %s gives %s", m.Name, file, list(outs))
			}
		}
	}
	return nil
}

// tail is the shape after the batch as "[a,b]", or "?" when not all fixed.
func tail(t Tensor) string {
	s := make([]string, 0, len(t.Dims))
	for _, d := range t.Dims[min(1, len(t.Dims)):] {
		if !d.Fixed {
			return "?"
		}
		s = append(s, d.String())
	}
	return "[" + strings.Join(s, ",") + "]"
}

// classes is the size of the last dimension when fixed (0 otherwise).
func classes(t Tensor) int64 {
	if len(t.Dims) < 2 || !t.Dims[len(t.Dims)-1].Fixed {
		return 0
	}
	return t.Dims[len(t.Dims)-1].Value
}

// OutputNames are the outputs the decoder reads: the entry's, or all.
func (m *Model) OutputNames(g *Graph) []string {
	if len(m.Outputs) > 0 {
		return m.Outputs
	}
	return Names(g.Outputs)
}

func list(ts []Tensor) string {
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = "'" + t.Name + "' " + t.String()
	}
	return strings.Join(s, ", ")
}
