package kserve

import "fmt"

// The protocol's datatypes of the registry's dtypes.
var (
	toWire   = map[string]string{"float32": "FP32", "float16": "FP16", "uint8": "UINT8"}
	fromWire = map[string]string{"FP32": "float32", "FP16": "float16", "UINT8": "uint8"}
)

// WireDType is the protocol's name of a registry dtype (float32: FP32).
func WireDType(dtype string) (string, error) {
	if w, ok := toWire[dtype]; ok {
		return w, nil
	}
	return "", fmt.Errorf("dtype %q has no Open Inference Protocol datatype here (float32, float16, uint8)", dtype)
}

// RegistryDType is the registry's name of a protocol datatype (FP32:
// float32).
func RegistryDType(wire string) (string, error) {
	if d, ok := fromWire[wire]; ok {
		return d, nil
	}
	return "", fmt.Errorf("datatype %q: mdag reads FP32, FP16 and UINT8 tensors", wire)
}

// The parameters of the system shared memory extension, on an input or a
// requested output.
const (
	ParamRegion   = "shared_memory_region"
	ParamByteSize = "shared_memory_byte_size"
	ParamOffset   = "shared_memory_offset"
)
