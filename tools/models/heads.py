#!/usr/bin/python3
"""heads.py OUTDIR: detector and pose heads as tiny ONNX models, with the boxes expected of them.

Each model ignores its picture: input "input" float32[N,3,H,W] (N symbolic), every output is
ReduceMean(input)*0 reshaped to [N,1,..] plus a constant, so it is float32[N,...] with known values
whatever the frame. The constants lay out the heads users bring (Ultralytics YOLOv8/YOLO11 and
pose, YOLOv5, YOLOX's raw export, TF Object Detection API, DETR, RT-DETR, YOLOv10-style end-to-end,
SSD): a few planted detections among low-scoring noise, chosen to exercise the layout (transposed or
not, grid cells, fractions or pixels, corner orders), the class-aware suppression, thresholds and
the letterbox or stretch geometry.

The expected boxes in OUTDIR/heads.json are computed here with numpy, independently of mdag's Go
decoders, from the formats' published definitions (Ultralytics', YOLOX's demo_postprocess, the TF
Object Detection API's, DETR's PostProcess), then mapped to the frame the way decode.Geometry
documents (floor the corner, round the size, clip to the frame) and suppressed per class at IoU > nms
(best score first, then top, then left; boxes of no area dropped).

Values are multiples of 1/256, so JSON, float32 and float64 agree exactly. Deterministic (numpy
seed 37). Needs python3-onnx (Debian) and numpy:
    /usr/bin/python3 tools/models/heads.py gpu/decode/testdata/heads
Read by gpu/decode (the decoders on the tensors), gpu/onnx (the same through ONNX Runtime) and
gpu/registry (Check and Infer on the graphs).
"""
import json
import math
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(37)


def q(a):
    """Round to a multiple of 1/256 (exact in float32 and in JSON)."""
    return np.round(np.asarray(a, dtype=np.float64) * 256) / 256


def noise(shape, hi=0.1):
    return q(RNG.uniform(0, hi, size=shape))


def model(name, w, h, outputs):
    """outputs: [(name, np.ndarray without the batch)]"""
    nodes = [helper.make_node("ReduceMean", ["input"], ["mean"], axes=[1, 2, 3], keepdims=0),
             helper.make_node("Mul", ["mean", "zero"], ["z"])]
    inits = [numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")]
    vis = []
    for oname, arr in outputs:
        arr = arr.astype(np.float32)
        shape = np.array([-1] + [1] * arr.ndim, dtype=np.int64)
        inits += [numpy_helper.from_array(shape, oname + "_shape"), numpy_helper.from_array(arr, oname + "_value")]
        nodes += [helper.make_node("Reshape", ["z", oname + "_shape"], [oname + "_z"]),
                  helper.make_node("Add", [oname + "_z", oname + "_value"], [oname])]
        vis.append(helper.make_tensor_value_info(oname, TensorProto.FLOAT, ["N"] + list(arr.shape)))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, h, w])],
                              vis, initializer=inits)
    m = helper.make_model(graph, producer_name="mdag tools/models/heads.py", opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


# --- the frame mapping and suppression, as decode.Geometry and decode.NMS document them


def go_round(x):  # math.Round: half away from zero
    return math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)


class Geo:
    def __init__(self, in_w, in_h, fw, fh, letterbox):
        self.in_w, self.in_h, self.fw, self.fh = in_w, in_h, fw, fh
        sx, sy = in_w / fw, in_h / fh
        if letterbox:
            s = min(sx, sy)
            self.fit = (s, s, (in_w - fw * s) / 2, (in_h - fh * s) / 2)
        else:
            self.fit = (sx, sy, 0.0, 0.0)

    def box(self, x1, y1, x2, y2):
        sx, sy, px, py = self.fit
        fx1, fy1, fx2, fy2 = (x1 - px) / sx, (y1 - py) / sy, (x2 - px) / sx, (y2 - py) / sy
        x, y, w, h = math.floor(fx1), math.floor(fy1), go_round(fx2 - fx1), go_round(fy2 - fy1)
        ax0, ay0, ax1, ay1 = max(x, 0), max(y, 0), min(x + w, self.fw), min(y + h, self.fh)
        if ax0 >= ax1 or ay0 >= ay1:
            return 0, 0, 0, 0
        return ax0, ay0, ax1 - ax0, ay1 - ay0

    def point(self, x, y):
        sx, sy, px, py = self.fit
        return min(max((x - px) / sx, 0), self.fw), min(max((y - py) / sy, 0), self.fh)


def iou(a, b):
    ix0, iy0 = max(a["x"], b["x"]), max(a["y"], b["y"])
    ix1, iy1 = min(a["x"] + a["w"], b["x"] + b["w"]), min(a["y"] + a["h"], b["y"] + b["h"])
    if ix0 >= ix1 or iy0 >= iy1:
        return 0.0
    i = (ix1 - ix0) * (iy1 - iy0)
    return i / (a["w"] * a["h"] + b["w"] * b["h"] - i)


def finish(dets, geo, nms, labels):
    """dets: (x1, y1, x2, y2 in input pixels, class index, score[, points])"""
    boxes = []
    for d in dets:
        x, y, w, h = geo.box(*d[:4])
        b = {"x": x, "y": y, "w": w, "h": h, "class": label(labels, d[4]), "score": float(np.float32(d[5]))}
        if len(d) > 6:
            b["keypoints"] = [[*geo.point(px, py), float(np.float32(s))] for px, py, s in d[6]]
        boxes.append(b)
    boxes.sort(key=lambda b: (-b["score"], b["y"], b["x"]))  # stable, like slices.SortStableFunc
    iou_max = nms if nms > 0 else 1.0
    keep = []
    for b in boxes:
        if b["w"] <= 0 or b["h"] <= 0:
            continue
        if all(k["class"] != b["class"] or iou(b, k) <= iou_max for k in keep):
            keep.append(b)
    return keep


def label(labels, i):
    if 0 <= i < len(labels) and labels[i]:
        return labels[i]
    return f"class{i}"


def grid(in_w, in_h, strides):
    cells = []
    for s in strides:
        gw, gh = -(-in_w // s), -(-in_h // s)
        for y in range(gh):
            for x in range(gw):
                cells.append((x, y, s))
    return cells


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --- the heads

CASES = []


def case(name, file, decoder, fmt, in_wh, frame, letterbox, threshold, nms, outputs, dets, labels=()):
    geo = Geo(in_wh[0], in_wh[1], frame[0], frame[1], letterbox)
    CASES.append({
        "name": name, "file": file, "decoder": decoder, "format": fmt,
        "input": {"w": in_wh[0], "h": in_wh[1]}, "frame": {"w": frame[0], "h": frame[1]}, "letterbox": letterbox,
        "threshold": threshold, "nms": nms, "labels": list(labels),
        "outputs": [{"name": n, "shape": list(a.shape), "data": [float(v) for v in a.astype(np.float32).ravel()]} for n, a in outputs],
        "want": finish(dets, geo, nms, list(labels)),
    })
    return outputs


def yolov5():
    """[K,5+C]: K = 3 anchors x 84 cells (64x64, strides 8, 16, 32), C = 3."""
    k, c = 3 * 84, 3
    t = noise((k, 5 + c))
    t[:, :4] = q(RNG.uniform(4, 60, size=(k, 4)))
    # planted: (row, cx, cy, w, h, obj, class scores)
    for i, r in [(10, [20, 24, 16, 20, 0.9375, 0.0625, 0.875, 0.03125]),   # class 1, 0.8203
                 (11, [21, 24, 16, 20, 0.875, 0.0625, 0.75, 0.03125]),     # same class, overlaps: suppressed
                 (12, [21, 25, 16, 20, 0.875, 0.8125, 0.0625, 0.0]),       # class 0 over it: kept
                 (200, [50, 40, 10, 12, 0.5, 0.0, 0.0, 0.5625]),           # class 2, 0.28125
                 (201, [40, 10, 8, 8, 0.25, 0.0, 0.0, 0.9375])]:           # 0.234: under the threshold
        t[i] = r
    dets = []
    for row in t.astype(np.float64):
        s = row[4] * row[5:]
        j = int(np.argmax(s))
        if s[j] >= 0.25:
            cx, cy, w, h = row[:4]
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, s[j]))
    outs = [("output0", t)]
    case("yolov5", "yolov5.onnx", "boxes", "yolov5", (64, 64), (128, 96), True, 0.25, 0.45, outs, dets, ["person", "car", "dog"])
    case("yolo alias", "yolov5.onnx", "boxes", "yolo", (64, 64), (128, 96), True, 0.25, 0.45, outs, dets, ["person", "car", "dog"])
    return model("yolov5", 64, 64, outs)


def yolov8():
    """[4+C,K]: K = 84 cells (64x64), C = 3, transposed."""
    k, c = 84, 3
    t = noise((4 + c, k))
    t[:4] = q(RNG.uniform(4, 60, size=(4, k)))
    for i, col in [(5, [12, 30, 10, 30, 0.0, 0.0, 0.90625]),
                   (6, [13, 30, 10, 30, 0.0, 0.0, 0.6875]),   # suppressed by 5
                   (40, [48, 16, 20, 12, 0.75, 0.125, 0.0]),
                   (83, [60, 60, 12, 12, 0.0, 0.5, 0.0])]:    # partly outside: clipped
        t[:, i] = col
    dets = []
    for col in t.T.astype(np.float64):
        j = int(np.argmax(col[4:]))
        if col[4 + j] >= 0.3:
            cx, cy, w, h = col[:4]
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, col[4 + j]))
    outs = [("output0", t)]
    case("yolov8", "yolov8.onnx", "boxes", "yolov8", (64, 64), (160, 120), False, 0.3, 0.45, outs, dets)
    return model("yolov8", 64, 64, outs)


def yolox():
    """YOLOX's raw export [K,5+C] on a 64x32 input: 8x4 + 4x2 + 2x1 = 42 cells, C = 2."""
    w_in, h_in, c = 64, 32, 2
    cells = grid(w_in, h_in, [8, 16, 32])
    k = len(cells)
    t = noise((k, 5 + c))
    t[:, :4] = q(RNG.uniform(-0.5, 0.5, size=(k, 4)))
    # planted: row (x offset, y offset, log w, log h in strides, obj, scores)
    for i, r in [(13, [0.5, 0.25, 0.5, 0.75, 0.875, 0.9375, 0.0]),      # stride 8, cell (5, 1)
                 (35, [0.25, 0.5, 0.0, -0.25, 0.9375, 0.0, 0.75]),       # stride 16, cell (3, 0)
                 (41, [0.75, 0.5, 0.25, 0.5, 0.6875, 0.875, 0.0])]:      # stride 32, cell (1, 0)
        t[i] = r
    dets = []
    for (gx, gy, s), row in zip(cells, t.astype(np.float64)):
        sc = row[4] * row[5:]
        j = int(np.argmax(sc))
        if sc[j] >= 0.3:
            cx, cy = (row[0] + gx) * s, (row[1] + gy) * s
            w, h = math.exp(row[2]) * s, math.exp(row[3]) * s
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, sc[j]))
    outs = [("output", t)]
    case("yolox", "yolox.onnx", "boxes", "yolox", (w_in, h_in), (200, 100), True, 0.3, 0.45, outs, dets)
    return model("yolox", w_in, h_in, outs)


def ssd_tf():
    """TF Object Detection API: boxes [10,4] ymin,xmin,ymax,xmax; classes [10]; scores [10]; num []."""
    k = 10
    boxes = q(RNG.uniform(0, 1, size=(k, 4)))
    boxes[:, 2:] = np.maximum(boxes[:, :2], boxes[:, 2:])
    classes = np.zeros(k)
    scores = np.zeros(k)
    for i, (b, c, s) in enumerate([([0.125, 0.25, 0.5, 0.5], 1, 0.9375), ([0.5, 0.5, 0.75, 0.875], 2, 0.625),
                                   ([0.125, 0.25, 0.5, 0.5], 1, 0.5), ([0.0, 0.0, 0.25, 0.25], 2, 0.25),
                                   ([0.75, 0.0, 1.0, 0.25], 1, 0.875)]):   # the 5th is past num_detections
        boxes[i], classes[i], scores[i] = b, c, s
    num = np.array(4.0)
    dets = []
    for i in range(int(num)):
        if scores[i] >= 0.4:
            y1, x1, y2, x2 = boxes[i]
            dets.append((x1 * 300, y1 * 300, x2 * 300, y2 * 300, int(classes[i]), scores[i]))
    outs = [("detection_boxes", boxes), ("detection_classes", classes), ("detection_scores", scores), ("num_detections", num)]
    case("ssd-tf", "ssd-tf.onnx", "boxes", "ssd-tf", (300, 300), (640, 480), False, 0.4, 0.0, outs, dets, ["background", "person", "car"])
    return model("ssd-tf", 300, 300, outs)


def detr():
    """DETR (Hugging Face export order): logits [6,4] (3 classes + no object), pred_boxes [6,4]."""
    qn, c = 6, 3
    logits = q(RNG.uniform(-2, 0, size=(qn, c + 1)))
    logits[:, c] = 3  # no object
    boxes = q(RNG.uniform(0.2, 0.6, size=(qn, 4)))
    logits[1] = [4, 0, 0, 0.5]
    boxes[1] = [0.25, 0.5, 0.25, 0.5]
    logits[4] = [0, 0, 3, 2.5]
    boxes[4] = [0.75, 0.25, 0.375, 0.25]
    logits[5] = [0, 2.5, 0, 3]  # no object wins, but class 1 has 0.36: kept at 0.3 (DETR's PostProcess takes the best real class)
    boxes[5] = [0.5, 0.75, 0.25, 0.25]
    dets = []
    for lg, b in zip(logits.astype(np.float64), boxes.astype(np.float64)):
        p = np.exp(lg - lg.max())
        p /= p.sum()
        j = int(np.argmax(p[:c]))
        if p[j] >= 0.3:
            cx, cy, w, h = b[0] * 640, b[1] * 480, b[2] * 640, b[3] * 480
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, p[j]))
    outs = [("logits", logits), ("pred_boxes", boxes)]
    case("detr", "detr.onnx", "boxes", "detr", (640, 480), (640, 480), False, 0.3, 0.0, outs, dets)
    return model("detr", 640, 480, outs)


def rtdetr():
    """RT-DETR: Ultralytics' one output [300,4+C] (scores after sigmoid), and two outputs
    (pred_logits [300,C] before sigmoid, pred_boxes [300,4]); 300 queries as RT-DETR has."""
    qn, c = 300, 3
    boxes = q(RNG.uniform(0.2, 0.6, size=(qn, 4)))
    scores = noise((qn, c))
    scores[0] = [0.0, 0.875, 0.125]
    boxes[0] = [0.5, 0.5, 0.25, 0.5]
    scores[3] = [0.625, 0.0, 0.0]
    boxes[3] = [0.5, 0.5, 0.25, 0.5]  # the same box, another class: kept
    one = np.concatenate([boxes, scores], axis=1)
    dets = []
    for b, s in zip(boxes.astype(np.float64), scores.astype(np.float64)):
        j = int(np.argmax(s))
        if s[j] >= 0.5:
            cx, cy, w, h = b[0] * 64, b[1] * 64, b[2] * 64, b[3] * 64
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, s[j]))
    outs1 = [("output0", one)]
    case("rtdetr", "rtdetr.onnx", "boxes", "rtdetr", (64, 64), (64, 128), True, 0.5, 0.0, outs1, dets)
    logits = q(RNG.uniform(-6, -1, size=(qn, c)))
    logits[2] = [-1, 1.5, 0]
    logits[4] = [0.25, -3, -3]
    dets = []
    for b, lg in zip(boxes.astype(np.float64), logits.astype(np.float64)):
        s = sigmoid(lg)
        j = int(np.argmax(s))
        if s[j] >= 0.5:
            cx, cy, w, h = b[0] * 64, b[1] * 64, b[2] * 64, b[3] * 64
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, j, s[j]))
    outs2 = [("pred_logits", logits), ("pred_boxes", boxes)]
    case("rtdetr two outputs", "rtdetr-logits.onnx", "boxes", "rtdetr", (64, 64), (128, 128), False, 0.5, 0.0, outs2, dets)
    return model("rtdetr", 64, 64, outs1), model("rtdetr-logits", 64, 64, outs2)


def e2e():
    """YOLOv10-style [K,6]: x1,y1,x2,y2 in input pixels, score, class; the NMS is in the model."""
    t = np.zeros((8, 6))
    t[:5] = [[10, 10, 30, 40, 0.9375, 0], [12, 10, 32, 40, 0.8125, 0],  # overlap, same class: both kept (no NMS)
             [40, 20, 60, 30, 0.5, 2], [0, 0, 4, 4, 0.25, 1], [50, 50, 70, 70, 0.75, 1]]
    dets = [(r[0], r[1], r[2], r[3], int(r[5]), r[4]) for r in t if r[4] >= 0.3]
    outs = [("output0", t)]
    case("e2e", "e2e.onnx", "boxes", "e2e", (64, 64), (320, 240), False, 0.3, 0.0, outs, dets)
    return model("e2e", 64, 64, outs)


def ssd():
    """The existing ssd layout: boxes [8,4] corners as fractions, scores [8,3]."""
    k = 8
    boxes = q(RNG.uniform(0, 0.5, size=(k, 4)))
    boxes[:, 2:] += boxes[:, :2]
    scores = noise((k, 3))
    boxes[2], scores[2] = [0.125, 0.25, 0.5, 0.75], [0.0, 0.875, 0.0]
    boxes[5], scores[5] = [0.5, 0.5, 0.75, 0.875], [0.0, 0.0, 0.5]
    dets = []
    for b, s in zip(boxes.astype(np.float64), scores.astype(np.float64)):
        j = int(np.argmax(s))
        if s[j] >= 0.3:
            dets.append((b[0] * 64, b[1] * 64, b[2] * 64, b[3] * 64, j, s[j]))
    outs = [("boxes", boxes), ("scores", scores)]
    case("ssd", "ssd.onnx", "boxes", "ssd", (64, 64), (96, 64), True, 0.3, 0.45, outs, dets)
    return model("ssd", 64, 64, outs)


def pose():
    """YOLOv8-pose [4+1+3x17,K] = [56,84] on 64x64: person score, 17 points x, y, visibility."""
    k, np_ = 84, 17
    t = noise((56, k))
    t[:4] = q(RNG.uniform(4, 60, size=(4, k)))
    t[5:] = q(RNG.uniform(0, 64, size=(51, k)))
    t[7::3] = noise((17, k), 1.0)  # visibilities
    for i, (box, s) in [(20, ([32, 30, 16, 40], 0.875)), (21, ([33, 30, 16, 40], 0.75)), (60, ([10, 12, 12, 16], 0.5))]:
        t[:4, i], t[4, i] = box, s
        pts = q(RNG.uniform(box[0] - box[2] / 2, box[0] + box[2] / 2, size=np_))
        t[5::3, i], t[6::3, i] = pts, q(RNG.uniform(box[1] - box[3] / 2, box[1] + box[3] / 2, size=np_))
    t[5, 60] = -3  # a point left of the frame: kept inside
    dets = []
    for col in t.T.astype(np.float64):
        if col[4] >= 0.4:
            cx, cy, w, h = col[:4]
            pts = [(col[5 + 3 * j], col[6 + 3 * j], col[7 + 3 * j]) for j in range(np_)]
            dets.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, 0, col[4], pts))
    outs = [("output0", t)]
    case("yolov8-pose", "yolov8-pose.onnx", "keypoints", "yolov8", (64, 64), (96, 128), True, 0.4, 0.45, outs, dets, ["person"])
    return model("yolov8-pose", 64, 64, outs)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu/decode/testdata/heads"
    models = [yolov5(), yolov8(), yolox(), ssd_tf(), detr(), *rtdetr(), e2e(), ssd(), pose()]
    for m in models:
        onnx.save(m, f"{out}/{m.graph.name}.onnx")
    with open(f"{out}/heads.json", "w") as f:
        json.dump({"generator": "tools/models/heads.py", "cases": CASES}, f, separators=(",", ":"))
        f.write("\n")
    for c in CASES:
        print(f"{c['name']}: {len(c['want'])} boxes", file=sys.stderr)


if __name__ == "__main__":
    main()
