#!/usr/bin/python3
"""Generate ONNX models of realistic architecture and cost with deterministic random weights.

The weights are drawn from numpy's PCG64 generator seeded per model, so the same seed writes the
same bytes (tools/models/check_models.py tests it). They MEASURE COST, NOT ACCURACY: the outputs are
well-formed (finite, probabilities in [0, 1], boxes inside the image) but mean nothing. Every model
takes NCHW float32 "input" with a symbolic batch dimension "N", uses opset 13 (IR 7: ONNX Runtime
1.30 and python3-onnx 1.12 both take it) and folds batch normalisation into the convolutions, as an
inference export does.

  resnet50-random.onnx        ResNet-50 v1.5 (torchvision layout), 224x224, 1000 classes -> "probs" [N, 1000]
  mobilenetv2-random.onnx     MobileNetV2 (width 1.0), 224x224, 1000 classes -> "probs" [N, 1000]
  ssd-mobilenetv2-random.onnx SSDLite-style detector, MobileNetV2 backbone, 320x320, 80 classes,
                              2034 anchors, anchors decoded in the graph ->
                              "boxes" [N, 2034, 4] (x1, y1, x2, y2 in [0, 1]), "scores" [N, 2034, 80]

usage: gen_models.py OUTDIR [NAME...]   (names: the files without .onnx; default all)
"""
import math
import os
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 7
BATCH = "N"


class Graph:
    """A tiny builder: every node and initializer gets a stable name, the weights come from rng."""

    def __init__(self, name, seed):
        self.name = name
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = {}
        self.relu6 = None  # the Clip bounds, made on first use

    def uid(self, kind):
        self.count[kind] = self.count.get(kind, 0) + 1
        return f"{kind}{self.count[kind]}"

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type, inputs, name=None, **attrs):
        name = name or self.uid(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x, cin, cout, k, stride=1, groups=1, act="relu", gain=1.0, bias_value=None):
        """Conv (batch norm folded: weight and bias) + optional ReLU / ReLU6."""
        name = self.uid("conv")
        fan_in = cin // groups * k * k
        std = gain * math.sqrt(2.0 / fan_in)
        w = (self.rng.standard_normal((cout, cin // groups, k, k), dtype=np.float32) * np.float32(std)).astype(np.float32)
        if bias_value is None:
            b = (self.rng.standard_normal(cout, dtype=np.float32) * np.float32(0.01)).astype(np.float32)
        else:
            b = np.full(cout, bias_value, dtype=np.float32)
        pad = (k - 1) // 2
        y = self.op("Conv", [x, self.const(name + ".weight", w), self.const(name + ".bias", b)], name=name,
                    kernel_shape=[k, k], strides=[stride, stride], pads=[pad, pad, pad, pad], group=groups)
        if act == "relu":
            y = self.op("Relu", [y])
        elif act == "relu6":
            if not self.relu6:
                self.relu6 = [self.const("relu6.min", np.array(0, dtype=np.float32)),
                              self.const("relu6.max", np.array(6, dtype=np.float32))]
            y = self.op("Clip", [y] + self.relu6)
        return y

    def classifier(self, x, cin, classes):
        """GlobalAveragePool -> Flatten -> Gemm -> Softmax ("probs")."""
        x = self.op("GlobalAveragePool", [x])
        x = self.op("Flatten", [x], axis=1)
        w = (self.rng.standard_normal((classes, cin), dtype=np.float32) * np.float32(math.sqrt(1.0 / cin))).astype(np.float32)
        b = np.zeros(classes, dtype=np.float32)
        x = self.op("Gemm", [x, self.const("fc.weight", w), self.const("fc.bias", b)], name="fc", transB=1)
        return self.op("Softmax", [x], name="probs", axis=1)

    def model(self, size, outputs, doc, props):
        inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, 3, size, size])
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [BATCH] + dims) for n, dims in outputs]
        graph = helper.make_graph(self.nodes, self.name, [inp], outs, self.inits)
        m = helper.make_model(graph, producer_name="mdag tools/models/gen_models.py", producer_version="1",
                              opset_imports=[helper.make_opsetid("", OPSET)], doc_string=doc)
        m.ir_version = IR_VERSION
        for k, v in [("mdag.weights", f"random (numpy PCG64 seed {self.seed}): measures cost, not accuracy")] + props:
            m.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
        return m


IMAGENET = [("mdag.input", "input: float32 NCHW [N,3,224,224], RGB, (x/255 - mean) / std, mean 0.485,0.456,0.406 std 0.229,0.224,0.225, stretched")]


def resnet50(seed):
    g = Graph("resnet50-random", seed)
    x = g.conv("input", 3, 64, 7, stride=2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            cout = width * 4
            y = g.conv(x, cin, width, 1)
            y = g.conv(y, width, width, 3, stride=s)  # v1.5: the stride on the 3x3
            y = g.conv(y, width, cout, 1, act=None, gain=0.2)  # small last gain keeps the residual sum bounded
            short = x if (s == 1 and cin == cout) else g.conv(x, cin, cout, 1, stride=s, act=None)
            x = g.op("Relu", [g.op("Add", [y, short])])
            cin = cout
    g.classifier(x, cin, 1000)
    return g.model(224, [("probs", [1000])], "ResNet-50 v1.5, random weights (cost, not accuracy)", IMAGENET)


# MobileNetV2 inverted residual settings: expansion t, channels c, repeats n, first stride s.
MBV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenetv2_features(g, x, taps=()):
    """MobileNetV2 backbone up to the 1280-channel 1x1 conv; returns (last, {name: (tensor, channels)})."""
    tapped = {}
    x = g.conv(x, 3, 32, 3, stride=2, act="relu6")
    cin = 32
    for bi, (t, c, n, s) in enumerate(MBV2):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = g.conv(y, cin, hidden, 1, act="relu6")
            if (bi, i) in taps:  # SSDLite taps the expansion output of the first stride-32 block
                tapped[(bi, i)] = (y, hidden)
            y = g.conv(y, hidden, hidden, 3, stride=stride, groups=hidden, act="relu6")
            residual = stride == 1 and cin == c
            # linear projection: variance-preserving (gain 1/sqrt 2 undoes He's ReLU factor), small on a residual branch
            y = g.conv(y, hidden, c, 1, act=None, gain=0.3 if residual else math.sqrt(0.5))
            x = g.op("Add", [y, x]) if residual else y
            cin = c
    x = g.conv(x, cin, 1280, 1, act="relu6")
    return x, tapped


def mobilenetv2(seed):
    g = Graph("mobilenetv2-random", seed)
    x, _ = mobilenetv2_features(g, "input")
    g.classifier(x, 1280, 1000)
    return g.model(224, [("probs", [1000])], "MobileNetV2 1.0, random weights (cost, not accuracy)", IMAGENET)


SSD_SIZE = 320
SSD_CLASSES = 80
# (feature map side, anchors per cell, scale): 20x20 (stride 16), 10x10 (32), then the extra layers.
SSD_MAPS = ((20, 3), (10, 6), (5, 6), (3, 6), (2, 6), (1, 6))


def ssd_anchors():
    """SSD default boxes (cx, cy, w, h) normalised, in the order the heads emit them: map, y, x, anchor."""
    m = len(SSD_MAPS)
    scales = [0.2 + (0.95 - 0.2) * k / (m - 1) for k in range(m)] + [1.0]
    out = []
    for k, (side, per) in enumerate(SSD_MAPS):
        s, s_next = scales[k], scales[k + 1]
        if per == 3:
            shapes = [(0.1, 0.1), (s * math.sqrt(2), s / math.sqrt(2)), (s / math.sqrt(2), s * math.sqrt(2))]
        else:
            shapes = [(s, s), (math.sqrt(s * s_next),) * 2] + [(s * math.sqrt(r), s / math.sqrt(r)) for r in (2, 0.5, 3, 1 / 3)]
        for y in range(side):
            for x in range(side):
                for w, h in shapes:
                    out.append(((x + 0.5) / side, (y + 0.5) / side, min(w, 1.0), min(h, 1.0)))
    return np.array(out, dtype=np.float32)


def ssd(seed):
    g = Graph("ssd-mobilenetv2-random", seed)
    # the tap: expansion (576 ch) of the first block of the stride-32 stage, at stride 16 (20x20)
    last, taps = mobilenetv2_features(g, "input", taps={(5, 0)})
    maps = [taps[(5, 0)], (last, 1280)]
    x, cin = last, 1280
    for cout in (512, 256, 256, 128):  # SSDLite extra layers: 1x1 reduce, depthwise 3x3 stride 2, 1x1 expand
        y = g.conv(x, cin, cout // 2, 1, act="relu6")
        y = g.conv(y, cout // 2, cout // 2, 3, stride=2, groups=cout // 2, act="relu6")
        x = g.conv(y, cout // 2, cout, 1, act="relu6")
        cin = cout
        maps.append((x, cout))
    box_parts, score_parts = [], []
    for (t, ch), (side, per) in zip(maps, SSD_MAPS):
        for kind, width, parts, bias in (("box", 4, box_parts, None), ("cls", SSD_CLASSES, score_parts, -4.0)):
            # SSDLite head: depthwise 3x3 + 1x1; the class bias -4 makes sigmoid scores ~0.02 (few detections)
            y = g.conv(t, ch, ch, 3, groups=ch, act="relu6")
            y = g.conv(y, ch, per * width, 1, act=None, gain=0.1, bias_value=bias)
            y = g.op("Transpose", [y], perm=[0, 2, 3, 1])  # [N, H, W, A*K]: anchors in (y, x, anchor) order
            parts.append(g.op("Reshape", [y, g.const(g.uid("shape"), np.array([0, -1, width], dtype=np.int64))]))
    deltas = g.op("Concat", box_parts, axis=1)  # [N, A, 4]: (dx, dy, dw, dh)
    logits = g.op("Concat", score_parts, axis=1)  # [N, A, C]
    g.op("Sigmoid", [logits], name="scores")
    anchors = ssd_anchors()
    assert anchors.shape[0] == sum(s * s * p for s, p in SSD_MAPS)
    # decode (variances 0.1, 0.2): centre = a_c + 0.1 * d_c * a_wh; size = a_wh * exp(0.2 * d_wh)
    a_c = g.const("anchors.center", anchors[None, :, 0:2])
    a_wh = g.const("anchors.size", anchors[None, :, 2:4])
    sl = lambda lo, hi: [g.const(g.uid("slice"), np.array(v, dtype=np.int64)) for v in ([lo], [hi], [2])]
    d_c = g.op("Slice", [deltas] + sl(0, 2))
    d_wh = g.op("Slice", [deltas] + sl(2, 4))
    var_c = g.const("variance.center", np.array(0.1, dtype=np.float32))
    var_wh = g.const("variance.size", np.array(0.2, dtype=np.float32))
    half = g.const("half", np.array(0.5, dtype=np.float32))
    centre = g.op("Add", [a_c, g.op("Mul", [g.op("Mul", [d_c, var_c]), a_wh])])
    size = g.op("Mul", [a_wh, g.op("Exp", [g.op("Mul", [d_wh, var_wh])])])
    halfsize = g.op("Mul", [size, half])
    corners = g.op("Concat", [g.op("Sub", [centre, halfsize]), g.op("Add", [centre, halfsize])], axis=2)
    zero = g.const("clip.min", np.array(0, dtype=np.float32))
    one = g.const("clip.max", np.array(1, dtype=np.float32))
    g.op("Clip", [corners, zero, one], name="boxes")
    a = anchors.shape[0]
    props = [("mdag.input", f"input: float32 NCHW [N,3,{SSD_SIZE},{SSD_SIZE}], RGB, (x/255 - 0.5) / 0.5, stretched"),
             ("mdag.outputs", f"boxes [N,{a},4] (x1,y1,x2,y2) normalised to [0,1]; scores [N,{a},{SSD_CLASSES}] sigmoid per class, no background class")]
    return g.model(SSD_SIZE, [("boxes", [a, 4]), ("scores", [a, SSD_CLASSES])],
                   "SSDLite-style detector on MobileNetV2, random weights (cost, not accuracy)", props)


MODELS = {  # name (the file is NAME.onnx): (file, builder, seed)
    "resnet50-random": ("resnet50-random.onnx", resnet50, 50),
    "mobilenetv2-random": ("mobilenetv2-random.onnx", mobilenetv2, 2),
    "ssd-mobilenetv2-random": ("ssd-mobilenetv2-random.onnx", ssd, 300),
}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    outdir, names = sys.argv[1], sys.argv[2:] or list(MODELS)
    os.makedirs(outdir, exist_ok=True)
    for name in names:
        if name not in MODELS:
            sys.exit(f"gen_models: unknown model {name!r} (known: {', '.join(MODELS)})")
        file, build, seed = MODELS[name]
        t0 = time.monotonic()
        m = build(seed)
        onnx.checker.check_model(m)
        path = os.path.join(outdir, file)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(m.SerializeToString())
        os.replace(tmp, path)
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
