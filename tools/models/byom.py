#!/usr/bin/python3
"""byom.py OUTDIR: two small ONNX models the project never saw, for the bring-your-own-model test
(cmd/mdag/byom_test.go and tools/served-ratio.sh write them into a temporary directory; nothing is
committed, nothing is downloaded).

byom-detector.onnx (~210 KB, 0.16 GMAC/item): an SSD-style detector, input "input" float32[N,3,96,96]
(NCHW, RGB, N symbolic "batch"), seven Conv 3x3 + Relu (DETECTOR: three at 96x96, then four stride 2
down to 6x6 cells), two 1x1 heads, 2 anchors per cell (72 boxes), 3 classes, no background class;
outputs
  "boxes"  float32[N,72,4]: x1, y1, x2, y2 as fractions of the input: each anchor's corners plus
           0.02 * tanh(box head), so always inside the anchor's neighbourhood, well-formed;
  "scores" float32[N,72,3]: sigmoid(0.1 * score head + bias): the bias is +3 (score ~0.95) for class
           1 of three anchors far apart (cells (1,1), (1,4) and (4,2), first anchor) and -4 (~0.02)
           everywhere else, so the boxes decoder (ssd, threshold 0.5) finds exactly three boxes on any
           frame (the head moves a logit by well under 1) and crop -> classify gets three crops.
byom-classifier.onnx (~170 KB, 0.07 GMAC/item): input "input" float32[N,3,64,64], six Conv 3x3 + Relu
  (CLASSIFIER), GlobalAveragePool, Flatten, Gemm 32->5, Softmax; output "probs" float32[N,5].
Small files, but enough arithmetic per item (1-4 ms on one core of the 2-core VM) that ONNX Runtime,
not mdag's per-frame Go work, is most of a frame's CPU: the served/raw ratio measures the runtime.
Weights are deterministic (numpy default_rng seeds 35 and 36, He-normal): the same bytes every run.
Needs python3-onnx and python3-numpy (Debian); /usr/bin/python3 tools/models/byom.py DIR.
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CELLS = 6       # 96 / 2^4
ANCHORS = 2     # per cell
CLASSES = 3
OBJECTS = ((1, 1), (1, 4), (4, 2))  # (row, column) of the cells whose first anchor scores high
DETECTOR = [(16, 1), (32, 1), (32, 1), (32, 2), (32, 2), (32, 2), (32, 2)]  # (channels, stride): 96 -> 6 cells
CLASSIFIER = [(16, 1), (32, 1), (32, 1), (32, 2), (32, 2), (32, 2)]  # 64 -> 8


class Weights:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.inits = []

    def conv(self, name, cout, cin, k):
        std = np.sqrt(2.0 / (cin * k * k))
        self.add(name + "w", self.rng.standard_normal((cout, cin, k, k)) * std)
        self.add(name + "b", np.zeros(cout))
        return [name + "w", name + "b"]

    def add(self, name, value, dtype=np.float32):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def backbone(w, layers):
    """Conv 3x3 + Relu per (channels out, stride), from the 3 input channels."""
    nodes, x, cin = [], "input", 3
    for i, (cout, stride) in enumerate(layers):
        nodes += [helper.make_node("Conv", [x] + w.conv(f"c{i}", cout, cin, 3), [f"c{i}"], strides=[stride, stride], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, cin = f"r{i}", cout
    return nodes, x


def model(name, nodes, w, size, outputs, doc):
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch"] + shape) for o, shape in outputs],
        initializer=w.inits)
    m = helper.make_model(graph, producer_name="mdag tools/models/byom.py", doc_string=doc,
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m)
    return m


def anchors():
    """Corners (x1, y1, x2, y2) of the anchors in head order: row, column, anchor."""
    out = []
    for y in range(CELLS):
        for x in range(CELLS):
            cx, cy = (x + 0.5) / CELLS, (y + 0.5) / CELLS
            for s in (0.12, 0.2):
                out.append([cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2])
    return np.clip(np.array(out), 0, 1)


def head(w, nodes, feat, name, width, scale):
    """A 1x1 conv head to [N, CELLS*CELLS*ANCHORS, width], multiplied by scale."""
    k = ANCHORS * width
    nodes += [helper.make_node("Conv", [feat] + w.conv(name, k, DETECTOR[-1][0], 1), [name + "c"]),
              helper.make_node("Transpose", [name + "c"], [name + "t"], perm=[0, 2, 3, 1]),
              helper.make_node("Reshape", [name + "t", w.add(name + "shape", [0, -1, width], np.int64)], [name + "r"]),
              helper.make_node("Mul", [name + "r", w.add(name + "scale", scale)], [name + "s"])]
    return name + "s"


def detector():
    w = Weights(35)
    nodes, feat = backbone(w, DETECTOR)
    k = CELLS * CELLS * ANCHORS
    b = head(w, nodes, feat, "box", 4, 0.02)
    nodes += [helper.make_node("Tanh", [b], ["boxtanh"]),
              helper.make_node("Add", ["boxtanh", w.add("anchors", anchors())], ["boxes"])]
    bias = np.full((k, CLASSES), -4.0)
    for r, c in OBJECTS:
        bias[(r * CELLS + c) * ANCHORS, 1] = 3.0
    s = head(w, nodes, feat, "cls", CLASSES, 0.1)
    nodes += [helper.make_node("Add", [s, w.add("clsbias", bias)], ["logits"]),
              helper.make_node("Sigmoid", ["logits"], ["scores"])]
    return model("byom-detector", nodes, w, 96, [("boxes", [k, 4]), ("scores", [k, CLASSES])],
                 "SSD-style detector, random weights, three boxes on any frame (mdag's bring-your-own-model test)")


def classifier():
    w = Weights(36)
    nodes, feat = backbone(w, CLASSIFIER)
    fc = numpy_helper.from_array((w.rng.standard_normal((5, CLASSIFIER[-1][0])) / np.sqrt(CLASSIFIER[-1][0])).astype(np.float32), "fcw")
    w.inits += [fc, numpy_helper.from_array(np.zeros(5, np.float32), "fcb")]
    nodes += [helper.make_node("GlobalAveragePool", [feat], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    return model("byom-classifier", nodes, w, 64, [("probs", [5])],
                 "small CNN classifier, random weights (mdag's bring-your-own-model test)")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: byom.py OUTDIR")
    out = sys.argv[1]
    onnx.save(detector(), f"{out}/byom-detector.onnx")
    onnx.save(classifier(), f"{out}/byom-classifier.onnx")


if __name__ == "__main__":
    main()
