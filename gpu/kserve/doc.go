// Package kserve speaks the Open Inference Protocol (KServe v2 / Triton
// Inference Server, api/kserve) on both sides:
//
//   - the `kserve` executor (a gpu.Executor) sends each scheduler batch as
//     one ModelInfer to the endpoint its registry entry names, the batch as
//     the tensor's leading dimension, the frame deadline as the gRPC
//     deadline, preprocessed by gpu/prep and decoded by gpu/decode exactly
//     as gpu/onnx does in process;
//   - Server serves the protocol over mdag's own backends (`mdag
//     infer-server`: the onnx executor's sessions, or an emulated model), so
//     the executor is tested in CI against a real server and any KServe or
//     Triton client can use mdag's executors.
//
// When client and server share a host, tensors travel through the system
// shared memory extension (Region: a POSIX shared memory object under
// /dev/shm, mapped on both sides; the request names the region) instead of
// the request bytes.
//
// Pure Go (grpc, no cgo).
package kserve
