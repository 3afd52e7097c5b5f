#!/usr/bin/python3
"""tiny.py OUTDIR: the onnx executor's test models (gpu/onnx/testdata), deterministic.

tiny-classifier.onnx: a small CNN classifier with deterministic random weights (numpy seed 20), made
to test batching, not to classify anything: input "input" float32[N,3,64,64] (N symbolic, "batch"),
Conv 3->16 3x3 stride 2, Relu, Conv 16->32 3x3 stride 2, Relu, GlobalAveragePool, Flatten,
Gemm 32->10, Softmax; output "probs" float32[N,10].
tiny-fixed.onnx: the same graph with the batch dimension fixed at 1 (the executor refuses it for
max_batch > 1).
tiny-half.onnx: the same weights with float16 input and output (Cast at both ends).
tiny-reshape.onnx: symbolic height and width that only 16x16 satisfies (reshape_model).
Needs python3-onnx (Debian) and numpy; run by `make testmodels`.
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(batch, half=False):
    rng = np.random.default_rng(20)

    def w(name, *shape):
        scale = 1.0 / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [w("c1w", 16, 3, 3, 3), w("c1b", 16), w("c2w", 32, 16, 3, 3), w("c2b", 32),
             w("fcw", 10, 32), w("fcb", 10)]
    nodes = [
        helper.make_node("Conv", ["input", "c1w", "c1b"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2w", "c2b"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    io = TensorProto.FLOAT
    if half:  # float16 at the edges, float32 inside
        io = TensorProto.FLOAT16
        nodes[0].input[0] = "input32"
        nodes[-1].output[0] = "probs32"
        nodes = ([helper.make_node("Cast", ["input"], ["input32"], to=TensorProto.FLOAT)] + nodes +
                 [helper.make_node("Cast", ["probs32"], ["probs"], to=TensorProto.FLOAT16)])
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("input", io, [batch, 3, 64, 64])],
        [helper.make_tensor_value_info("probs", io, [batch, 10])],
        initializer=inits)
    m = helper.make_model(graph, producer_name="mdag tools/models/tiny.py",
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def reshape_model():
    """tiny-reshape.onnx: input float32[batch,3,h,w] with h and w symbolic, flattened by a Reshape
    to [-1, 768] and a MatMul to [*, 10]: only 16x16 inputs give the batch back, other sizes fail
    inside ONNX Runtime's Reshape at run time (the executor's run-time error test)."""
    rng = np.random.default_rng(21)
    w = numpy_helper.from_array((rng.standard_normal((768, 10)) * 0.03).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 768], dtype=np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "w"], ["probs"])]
    graph = helper.make_graph(
        nodes, "tiny-reshape",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        initializer=[w, shape])
    m = helper.make_model(graph, producer_name="mdag tools/models/tiny.py",
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu/onnx/testdata"
    onnx.save(build("batch"), f"{out}/tiny-classifier.onnx")
    onnx.save(build(1), f"{out}/tiny-fixed.onnx")
    onnx.save(build("batch", half=True), f"{out}/tiny-half.onnx")
    onnx.save(reshape_model(), f"{out}/tiny-reshape.onnx")


if __name__ == "__main__":
    main()
