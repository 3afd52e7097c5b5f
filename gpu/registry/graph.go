package registry

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Graph is what an ONNX file says about its inputs and outputs, read
// without a runtime (the protobuf wire format, like gpu.CheckONNX), and
// what the model carries beside them: the operator sets it imports, the
// exporter and its metadata_props (Ultralytics exports keep their class
// names, input size, stride and task there: UltralyticsNames reads them).
type Graph struct {
	Inputs, Outputs []Tensor
	Opsets          []Opset // opset_import, in file order
	Producer        string  // producer_name and producer_version, e.g. "pytorch 2.3.0" ("" when absent)
	IRVersion       int64
	// Metadata are the model's metadata_props (key: value) in file
	// order; a key given twice keeps both.
	Metadata []Prop
}

// Opset is one operator set the model imports: its domain ("" is ONNX's
// default domain, ai.onnx) and version.
type Opset struct {
	Domain  string
	Version int64
}

func (o Opset) String() string {
	d := o.Domain
	if d == "" {
		d = "ai.onnx"
	}
	return fmt.Sprintf("%s v%d", d, o.Version)
}

// Prop is one metadata_props entry.
type Prop struct{ Key, Value string }

// Meta returns the value of the first metadata_props entry named key.
func (g *Graph) Meta(key string) (string, bool) {
	for _, p := range g.Metadata {
		if p.Key == key {
			return p.Value, true
		}
	}
	return "", false
}

// Opset returns the version of the default (ai.onnx) operator set, 0 when
// the model imports none.
func (g *Graph) Opset() int64 {
	for _, o := range g.Opsets {
		if o.Domain == "" || o.Domain == "ai.onnx" {
			return o.Version
		}
	}
	return 0
}

// Tensor is a graph input or output: name, element type and shape.
type Tensor struct {
	Name  string
	DType string // float32, float16, uint8, int64, ... ("type N" for others)
	Dims  []Dim
}

// Dim is one dimension: a fixed size, or symbolic (a name, or unnamed).
type Dim struct {
	Value int64  // when fixed (> 0)
	Param string // the symbolic name, "" if unnamed
	Fixed bool
}

func (d Dim) String() string {
	switch {
	case d.Fixed:
		return strconv.FormatInt(d.Value, 10)
	case d.Param != "":
		return d.Param
	}
	return "?"
}

// String prints the tensor as dtype[d0,d1,...].
func (t Tensor) String() string {
	s := make([]string, len(t.Dims))
	for i, d := range t.Dims {
		s[i] = d.String()
	}
	return t.DType + "[" + strings.Join(s, ",") + "]"
}

// Input returns the input named name.
func (g *Graph) Input(name string) (Tensor, bool) { return find(g.Inputs, name) }

// Output returns the output named name.
func (g *Graph) Output(name string) (Tensor, bool) { return find(g.Outputs, name) }

func find(ts []Tensor, name string) (Tensor, bool) {
	for _, t := range ts {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// Names lists the tensors' names.
func Names(ts []Tensor) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

var dtypes = map[uint64]string{1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
	8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}

// ReadGraph reads an ONNX file's graph inputs and outputs.
func ReadGraph(path string) (*Graph, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	g, err := ParseGraph(b)
	if err != nil {
		return nil, fmt.Errorf("%s is not an ONNX model: %w", path, err)
	}
	return g, nil
}

// walk calls f for each field of a protobuf message; it stops at the first
// malformed field.
func walk(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// ParseGraph reads a serialized ONNX ModelProto (field 7: GraphProto; its
// fields 11 and 12: inputs and outputs as ValueInfoProto; 5: initializers,
// which old exporters also list as inputs and are not inputs here) and the
// model's own fields: 1 ir_version, 2 producer_name, 3 producer_version,
// 8 opset_import (OperatorSetIdProto: 1 domain, 2 version) and 14
// metadata_props (StringStringEntryProto: 1 key, 2 value).
func ParseGraph(b []byte) (*Graph, error) {
	var graph []byte
	found := false
	g := &Graph{}
	var producer, producerVersion string
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 7 && typ == protowire.BytesType:
			graph, found = v, true
		case num == 1 && typ == protowire.VarintType:
			g.IRVersion = int64(x)
		case num == 2 && typ == protowire.BytesType:
			producer = string(v)
		case num == 3 && typ == protowire.BytesType:
			producerVersion = string(v)
		case num == 8 && typ == protowire.BytesType:
			var o Opset
			err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					o.Domain = string(v)
				case num == 2 && typ == protowire.VarintType:
					o.Version = int64(x)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("opset_import: %w", err)
			}
			g.Opsets = append(g.Opsets, o)
		case num == 14 && typ == protowire.BytesType:
			var p Prop
			err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					p.Key = string(v)
				case num == 2 && typ == protowire.BytesType:
					p.Value = string(v)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("metadata_props: %w", err)
			}
			g.Metadata = append(g.Metadata, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no graph")
	}
	g.Producer = strings.TrimSpace(producer + " " + producerVersion)
	inits := map[string]bool{}
	err = walk(graph, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 11, 12:
			t, err := valueInfo(v)
			if err != nil {
				return fmt.Errorf("graph %s: %w", map[protowire.Number]string{11: "input", 12: "output"}[num], err)
			}
			if num == 11 {
				g.Inputs = append(g.Inputs, t)
			} else {
				g.Outputs = append(g.Outputs, t)
			}
		case 5:
			return walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 8 && typ == protowire.BytesType {
					inits[string(v)] = true
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	in := g.Inputs[:0]
	for _, t := range g.Inputs {
		if !inits[t.Name] {
			in = append(in, t)
		}
	}
	g.Inputs = in
	if len(g.Inputs) == 0 || len(g.Outputs) == 0 {
		return nil, fmt.Errorf("graph has %d inputs and %d outputs", len(g.Inputs), len(g.Outputs))
	}
	return g, nil
}

// valueInfo reads a ValueInfoProto: 1 name, 2 TypeProto (1 tensor_type:
// 1 elem_type, 2 TensorShapeProto: 1 dim: 1 dim_value, 2 dim_param).
func valueInfo(b []byte) (Tensor, error) {
	var t Tensor
	err := walk(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			t.Name = string(v)
		case num == 2 && typ == protowire.BytesType:
			return walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != 1 || typ != protowire.BytesType {
					return nil
				}
				return walk(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
					switch {
					case num == 1 && typ == protowire.VarintType:
						t.DType = dtypes[x]
						if t.DType == "" {
							t.DType = fmt.Sprintf("type %d", x)
						}
					case num == 2 && typ == protowire.BytesType:
						return walk(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
							if num != 1 || typ != protowire.BytesType {
								return nil
							}
							var d Dim
							err := walk(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
								switch {
								case num == 1 && typ == protowire.VarintType:
									d.Value, d.Fixed = int64(x), int64(x) > 0
								case num == 2 && typ == protowire.BytesType:
									d.Param = string(v)
								}
								return nil
							})
							t.Dims = append(t.Dims, d)
							return err
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	if t.Name == "" {
		return t, fmt.Errorf("a tensor without a name")
	}
	if t.DType == "" {
		t.DType = "unknown"
	}
	return t, nil
}
