"""Tests of the PyTorch runner over its gRPC protocol, on CPU.

Run: cd runners/torch && /usr/bin/python3 -m unittest -v test_runner
(go test ./runners/torch runs this too.)
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import types
import unittest

import grpc
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import engine  # noqa: E402
import runner  # noqa: E402

pb, pb_grpc = runner.pb, runner.pb_grpc

SIZE = 32
MAXB = 4
MEAN = np.array(engine.IMAGENET_MEAN, dtype=np.float32)
STD = np.array(engine.IMAGENET_STD, dtype=np.float32)


def infer_request(model, data, shape, dtype="UINT8", name="input"):
    r = pb.ModelInferRequest(model_name=model)
    r.inputs.add(name=name, datatype=dtype, shape=list(shape))
    if data is not None:
        r.raw_input_contents.append(data)
    return r


def out_array(resp, i=0):
    return np.frombuffer(resp.raw_output_contents[i], dtype=np.float32).reshape(list(resp.outputs[i].shape))


class RunnerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(1)
        cls.tmp = tempfile.TemporaryDirectory()
        cat = os.path.join(cls.tmp.name, "catalog")
        with open(cat, "w") as f:
            f.write("# name=spec\ncat = torchvision:mobilenet_v3_small\nbroken=torchvision:no_such_net  # fails at load\n")
        cls.logs = []
        args = runner.parse_args(["--listen", "127.0.0.1:0", "--device", "cpu", "--model", "tiny=torchvision:resnet18",
                                  "--size", str(SIZE), "--max-batch", str(MAXB), "--batches", "1,2,4", "--slots", "2",
                                  "--catalog", cat])
        cls.server, cls.runner, port = runner.serve(args, log=cls.logs.append)
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop(None).wait()
        cls.runner.close()
        cls.tmp.cleanup()

    def expect(self, code, fn, *args, contains=""):
        with self.assertRaises(grpc.RpcError) as cm:
            fn(*args)
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        self.assertIn(contains, cm.exception.details())
        return cm.exception.details()

    def reference(self, name, pixels):
        """The eager fp32 model on the same pixels, normalised here in numpy."""
        x = (pixels.astype(np.float32) / 255.0 - MEAN) / STD
        x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
        with torch.inference_mode():
            return self.runner.models[name].model.model(x).numpy()

    def pixels(self, n, seed=0):
        return np.random.default_rng(seed).integers(0, 256, size=(n, SIZE, SIZE, 3), dtype=np.uint8)

    # ---- health and metadata

    def test_health_and_server_metadata(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest()).ready)
        for name, version, ready in [("tiny", "", True), ("tiny", "1", True), ("tiny", "2", False), ("nope", "", False)]:
            with self.subTest(name=name, version=version):
                self.assertEqual(self.stub.ModelReady(pb.ModelReadyRequest(name=name, version=version)).ready, ready)
        md = self.stub.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual(md.name, "mdag-torch-runner")
        self.assertEqual(sorted(md.extensions), ["model_repository", "system_shared_memory"])
        self.assertIn("cpu-eager", md.version)
        self.assertIn("input=uint8-nhwc", md.version)

    def test_model_metadata(self):
        md = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="tiny"))
        self.assertEqual(md.name, "tiny")
        self.assertEqual(md.platform, "pytorch_torchvision")
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in md.inputs], [("input", "UINT8", [-1, SIZE, SIZE, 3])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in md.outputs], [("output", "FP32", [-1, 1000])])
        self.expect(grpc.StatusCode.NOT_FOUND, self.stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"),
                    contains="'nope' is not loaded")

    # ---- inference

    def test_infer_equals_eager_model(self):
        for n in [1, 3, MAXB]:
            with self.subTest(batch=n):
                px = self.pixels(n, seed=n)
                req = infer_request("tiny", px.tobytes(), px.shape)
                req.id = "req-%d" % n
                resp = self.stub.ModelInfer(req)
                self.assertEqual(resp.id, req.id)
                self.assertEqual(resp.model_name, "tiny")
                self.assertEqual([(o.name, o.datatype, list(o.shape)) for o in resp.outputs], [("output", "FP32", [n, 1000])])
                got = out_array(resp)
                np.testing.assert_allclose(got, self.reference("tiny", px), rtol=1e-4, atol=1e-4)
                # batch = leading dimension: row i is item i alone
                one = out_array(self.stub.ModelInfer(infer_request("tiny", px[-1:].tobytes(), px[-1:].shape)))
                np.testing.assert_allclose(got[-1:], one, rtol=1e-4, atol=1e-4)

    def test_stats_per_model_and_batch(self):
        before = self.runner.stats_snapshot().get("tiny", {}).get("3", {}).get("requests", 0)
        px = self.pixels(3, seed=9)
        for _ in range(2):
            self.stub.ModelInfer(infer_request("tiny", px.tobytes(), px.shape))
        self.expect(grpc.StatusCode.INVALID_ARGUMENT, self.stub.ModelInfer, infer_request("tiny", px.tobytes()[:-1], px.shape))
        row = self.runner.stats_snapshot()["tiny"]["3"]
        self.assertEqual(row["requests"], before + 2)  # the refused request is not counted
        self.assertEqual(sorted(row), sorted(["requests"] + [p + "_ms" for p in runner.Runner.STAT_PARTS]))
        self.assertGreater(row["run_ms"], 0)
        self.assertTrue(all(v >= 0 for v in row.values()))
        path = os.path.join(self.tmp.name, "stats.json")
        self.runner.write_stats(path)
        with open(path) as f:
            self.assertEqual(json.load(f)["tiny"]["3"]["requests"], row["requests"])

    def test_concurrent_requests(self):
        px = [self.pixels(2, seed=100 + i) for i in range(6)]
        want = [self.reference("tiny", p) for p in px]
        got = [None] * len(px)
        errs = []

        def call(i):
            try:
                got[i] = out_array(self.stub.ModelInfer(infer_request("tiny", px[i].tobytes(), px[i].shape)))
            except Exception as e:  # reported below
                errs.append(e)

        ts = [threading.Thread(target=call, args=(i,)) for i in range(len(px))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertEqual(errs, [])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)

    def test_infer_errors(self):
        ok = self.pixels(2).tobytes()
        two = infer_request("tiny", ok, [2, SIZE, SIZE, 3])
        two.inputs.add(name="input2", datatype="UINT8", shape=[2, SIZE, SIZE, 3])
        wrong_out = infer_request("tiny", ok, [2, SIZE, SIZE, 3])
        wrong_out.outputs.add(name="logits")
        both = infer_request("tiny", ok, [2, SIZE, SIZE, 3])
        both.inputs[0].parameters["shared_memory_region"].string_param = "nope"
        version = infer_request("tiny", ok, [2, SIZE, SIZE, 3])
        version.model_version = "7"
        big = self.pixels(MAXB + 1).tobytes()
        cases = [
            ("unknown model", infer_request("nope", ok, [2, SIZE, SIZE, 3]), grpc.StatusCode.NOT_FOUND, "'nope' is not loaded"),
            ("unknown version", version, grpc.StatusCode.NOT_FOUND, "version '7'"),
            ("dtype", infer_request("tiny", ok, [2, SIZE, SIZE, 3], dtype="FP32"), grpc.StatusCode.INVALID_ARGUMENT, "datatype FP32, want UINT8"),
            ("shape nchw", infer_request("tiny", ok, [2, 3, SIZE, SIZE]), grpc.StatusCode.INVALID_ARGUMENT, "shape [2, 3, 32, 32], want [-1, 32, 32, 3]"),
            ("shape rank", infer_request("tiny", ok, [2, SIZE, SIZE]), grpc.StatusCode.INVALID_ARGUMENT, "shape [2, 32, 32]"),
            ("bytes short", infer_request("tiny", ok[:-1], [2, SIZE, SIZE, 3]), grpc.StatusCode.INVALID_ARGUMENT, "6143 bytes, shape [2, 32, 32, 3] of UINT8 takes 6144"),
            ("bytes vs batch", infer_request("tiny", ok, [3, SIZE, SIZE, 3]), grpc.StatusCode.INVALID_ARGUMENT, "takes 9216"),
            ("batch above max", infer_request("tiny", big, [MAXB + 1, SIZE, SIZE, 3]), grpc.StatusCode.INVALID_ARGUMENT, "batch 5 is above max batch 4"),
            ("batch zero", infer_request("tiny", b"", [0, SIZE, SIZE, 3]), grpc.StatusCode.INVALID_ARGUMENT, "batch 0"),
            ("no contents", infer_request("tiny", None, [2, SIZE, SIZE, 3]), grpc.StatusCode.INVALID_ARGUMENT, "want 1 raw_input_contents entry (or shared memory; typed contents are not read), request has 0"),
            ("input name", infer_request("tiny", ok, [2, SIZE, SIZE, 3], name="images"), grpc.StatusCode.INVALID_ARGUMENT, "has input 'input', request names 'images'"),
            ("two inputs", two, grpc.StatusCode.INVALID_ARGUMENT, "takes 1 input"),
            ("output name", wrong_out, grpc.StatusCode.INVALID_ARGUMENT, "asks for 'logits'"),
            ("unknown region", both, grpc.StatusCode.INVALID_ARGUMENT, "region 'nope' is not registered"),
            ("no inputs", pb.ModelInferRequest(model_name="tiny"), grpc.StatusCode.INVALID_ARGUMENT, "request has 0"),
        ]
        for name, req, code, msg in cases:
            with self.subTest(name):
                self.expect(code, self.stub.ModelInfer, req, contains=msg)
        # the server is still serving
        self.assertEqual(out_array(self.stub.ModelInfer(infer_request("tiny", ok, [2, SIZE, SIZE, 3]))).shape, (2, 1000))

    def test_caller_strings_not_echoed_whole(self):
        """A caller's names are cut in error messages: a 100 kB name gets its error
        (not gRPC's metadata limit) and a message of bounded size."""
        huge = "m" * 100000
        ok = self.pixels(1).tobytes()
        named = infer_request("tiny", ok, [1, SIZE, SIZE, 3], name=huge)
        out = infer_request("tiny", ok, [1, SIZE, SIZE, 3])
        out.outputs.add(name=huge)
        for what, req, code in [("model", infer_request(huge, ok, [1, SIZE, SIZE, 3]), grpc.StatusCode.NOT_FOUND),
                                ("input", named, grpc.StatusCode.INVALID_ARGUMENT),
                                ("output", out, grpc.StatusCode.INVALID_ARGUMENT)]:
            with self.subTest(what):
                msg = self.expect(code, self.stub.ModelInfer, req, contains="(100000 characters)")
                self.assertLess(len(msg), 1000)

    def test_fuzz_requests_never_crash(self):
        """Random requests (a valid one with 0 to 3 random mutations: shapes,
        datatypes, byte counts, names, counts, parameters of any type) get OK
        or a client error, never INTERNAL or an exception."""
        rng = np.random.default_rng(21)
        region_values = [("string_param", "nope"), ("int64_param", 3), ("int64_param", -5), ("bool_param", True),
                         ("double_param", 1.5), ("uint64_param", 1 << 63)]

        def pick(xs):
            return xs[int(rng.integers(len(xs)))]

        def mutate(req):
            t = req.inputs[0] if req.inputs else None
            m = int(rng.integers(11))
            if m == 0:
                req.model_name = pick(["nope", "", "TINY", "tiny\x00"])
            elif m == 1 and t is not None:
                t.datatype = pick(["FP32", "FP16", "INT8", "", "BYTES", "uint8"])
            elif m == 2 and t is not None:
                del t.shape[:]
                t.shape.extend([int(pick([-1, 0, 1, 2, 3, MAXB, MAXB + 1, SIZE, 1 << 40, -(1 << 40)]))
                                for _ in range(int(rng.integers(0, 6)))])
            elif m == 3 and t is not None:
                t.shape[int(rng.integers(len(t.shape)))] = int(pick([0, -1, 1, 7, MAXB + 1, 1 << 62])) if len(t.shape) else 0
            elif m == 4 and t is not None:
                t.name = pick(["", "output", "x", "input "])
            elif m == 5:
                req.inputs.add(name="input", datatype="UINT8", shape=[1, SIZE, SIZE, 3])
            elif m == 6:
                del req.inputs[:]
            elif m == 7 and len(req.raw_input_contents):
                raw = req.raw_input_contents[0]
                req.raw_input_contents[0] = pick([raw[:-1], raw + b"\0", b"", raw[: len(raw) // 2]])
            elif m == 8:
                req.raw_input_contents.append(b"\0" * int(rng.integers(0, 100)))
            elif m == 9 and t is not None:
                for key in ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"]:
                    if rng.random() < 0.7:
                        kind, val = pick(region_values)
                        setattr(t.parameters[key], kind, val)
            elif m == 10:
                o = req.outputs.add(name=pick(["output", "output", "", "x"]))
                for key in ["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"]:
                    if rng.random() < 0.5:
                        kind, val = pick(region_values)
                        setattr(o.parameters[key], kind, val)

        ok = client = 0
        for i in range(300):
            n = int(rng.integers(1, MAXB + 1))
            req = infer_request("tiny", rng.integers(0, 256, size=n * SIZE * SIZE * 3, dtype=np.uint8).tobytes(),
                                [n, SIZE, SIZE, 3])
            for _ in range(int(rng.integers(0, 4))):
                mutate(req)
            try:
                resp = self.runner._infer(req)
                ok += 1
                self.assertEqual(len(resp.raw_output_contents[0]), resp.outputs[0].shape[0] * 1000 * 4)
            except runner.Abort as a:
                client += 1
                self.assertIn(a.code, (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), "case %d: %s" % (i, a.msg))
        self.assertGreater(ok, 30)      # the generator reaches valid requests
        self.assertGreater(client, 100)  # and invalid ones

    # ---- shared memory

    def test_shared_memory_round_trip(self):
        n = 3
        in_bytes = n * SIZE * SIZE * 3
        out_bytes = n * 1000 * 4
        key = "/mdag-runner-test-%d" % os.getpid()
        path = "/dev/shm" + key
        in_off, out_off = 100, 8192 + 4096  # an input offset off the page, an output region at an offset
        with open(path, "wb") as f:
            f.truncate(out_off + out_bytes + 64)
        self.addCleanup(os.remove, path)
        px = self.pixels(n, seed=7)
        with open(path, "r+b") as f:
            f.seek(in_off)
            f.write(px.tobytes())
        reg = self.stub.SystemSharedMemoryRegister
        reg(pb.SystemSharedMemoryRegisterRequest(name="in", key=key, offset=0, byte_size=in_off + in_bytes))
        reg(pb.SystemSharedMemoryRegisterRequest(name="out", key=key, offset=out_off, byte_size=out_bytes))
        self.addCleanup(self.stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest(name=""))

        for name, req, code, msg in [
            ("duplicate", pb.SystemSharedMemoryRegisterRequest(name="in", key=key, byte_size=8), grpc.StatusCode.ALREADY_EXISTS, "already registered"),
            ("missing key", pb.SystemSharedMemoryRegisterRequest(name="x", key="/mdag-no-such-key", byte_size=8), grpc.StatusCode.NOT_FOUND, "No such file"),
            ("bad key", pb.SystemSharedMemoryRegisterRequest(name="x", key="../etc/passwd", byte_size=8), grpc.StatusCode.INVALID_ARGUMENT, "want /NAME"),
            ("too big", pb.SystemSharedMemoryRegisterRequest(name="x", key=key, offset=out_off, byte_size=out_bytes + 65), grpc.StatusCode.INVALID_ARGUMENT, "is outside"),
            ("empty name", pb.SystemSharedMemoryRegisterRequest(name="", key=key, byte_size=8), grpc.StatusCode.INVALID_ARGUMENT, "name is empty"),
        ]:
            with self.subTest(name):
                self.expect(code, reg, req, contains=msg)

        st = self.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
        self.assertEqual({k: (v.key, v.offset, v.byte_size) for k, v in st.regions.items()},
                         {"in": (key, 0, in_off + in_bytes), "out": (key, out_off, out_bytes)})
        self.assertEqual(list(self.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(name="out")).regions), ["out"])
        self.expect(grpc.StatusCode.NOT_FOUND, self.stub.SystemSharedMemoryStatus,
                    pb.SystemSharedMemoryStatusRequest(name="nope"), contains="'nope' is not registered")

        req = infer_request("tiny", None, px.shape)
        p = req.inputs[0].parameters
        p["shared_memory_region"].string_param = "in"
        p["shared_memory_byte_size"].int64_param = in_bytes
        p["shared_memory_offset"].int64_param = in_off
        o = req.outputs.add(name="output")
        o.parameters["shared_memory_region"].string_param = "out"
        o.parameters["shared_memory_byte_size"].int64_param = out_bytes
        resp = self.stub.ModelInfer(req)
        self.assertEqual(len(resp.raw_output_contents), 0)
        self.assertEqual(resp.outputs[0].parameters["shared_memory_region"].string_param, "out")
        self.assertEqual(list(resp.outputs[0].shape), [n, 1000])
        with open(path, "rb") as f:
            f.seek(out_off)
            got = np.frombuffer(f.read(out_bytes), dtype=np.float32).reshape(n, 1000)
        np.testing.assert_allclose(got, self.reference("tiny", px), rtol=1e-4, atol=1e-4)
        # the same through raw contents gives the same bytes
        raw = out_array(self.stub.ModelInfer(infer_request("tiny", px.tobytes(), px.shape)))
        np.testing.assert_allclose(got, raw, rtol=1e-5, atol=1e-5)

        # a region too small for the request
        bad = infer_request("tiny", None, [MAXB, SIZE, SIZE, 3])
        bad.inputs[0].parameters["shared_memory_region"].string_param = "in"
        bad.inputs[0].parameters["shared_memory_offset"].int64_param = in_off
        self.expect(grpc.StatusCode.INVALID_ARGUMENT, self.stub.ModelInfer, bad, contains="is outside its")
        wrong_size = infer_request("tiny", None, px.shape)
        wrong_size.inputs[0].parameters["shared_memory_region"].string_param = "in"
        wrong_size.inputs[0].parameters["shared_memory_byte_size"].int64_param = in_bytes - 1
        self.expect(grpc.StatusCode.INVALID_ARGUMENT, self.stub.ModelInfer, wrong_size, contains="shared_memory_byte_size 9215")

        # unregistered while a request holds it: unmapped when that request ends
        held = []
        r = self.runner.region("in", "test", held)
        self.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="in"))
        self.assertFalse(r.map.closed)
        self.assertEqual(bytes(r.view("test", in_off, 4).numpy()), px.tobytes()[:4])
        self.runner.release_region(held[0])
        self.assertTrue(r.map.closed)
        self.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="in"))  # idempotent
        self.assertEqual(list(self.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions), ["out"])
        self.expect(grpc.StatusCode.INVALID_ARGUMENT, self.stub.ModelInfer, req, contains="region 'in' is not registered")

    # ---- repository

    def test_repository_load_unload(self):
        def index(ready=False):
            return {m.name: (m.state, m.reason) for m in self.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready)).models}

        idx = index()
        self.assertEqual(idx["tiny"][0], "READY")
        self.assertIn("spec=torchvision:resnet18 device=cpu input=uint8-nhwc max_batch=4 eager gpu_bytes=0", idx["tiny"][1])
        self.assertEqual(idx["cat"], ("UNAVAILABLE", "unloaded; spec=torchvision:mobilenet_v3_small"))
        self.assertNotIn("cat", index(ready=True))

        load, unload = self.stub.RepositoryModelLoad, self.stub.RepositoryModelUnload
        # by name from the catalog
        load(pb.RepositoryModelLoadRequest(model_name="cat"))
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="cat")).ready)
        px = self.pixels(2, seed=3)
        np.testing.assert_allclose(out_array(self.stub.ModelInfer(infer_request("cat", px.tobytes(), px.shape))),
                                   self.reference("cat", px), rtol=1e-4, atol=1e-4)
        load(pb.RepositoryModelLoadRequest(model_name="cat"))  # loaded already: no-op
        unload(pb.RepositoryModelUnloadRequest(model_name="cat"))
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="cat")).ready)
        self.assertEqual(index()["cat"][0], "UNAVAILABLE")
        self.expect(grpc.StatusCode.NOT_FOUND, self.stub.ModelInfer, infer_request("cat", px.tobytes(), px.shape),
                    contains="'cat' is not loaded")

        # a caller's config equal to the catalog's spec is the catalog's load
        same = pb.RepositoryModelLoadRequest(model_name="cat")
        same.parameters["config"].string_param = "torchvision:mobilenet_v3_small"
        load(same)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="cat")).ready)
        unload(pb.RepositoryModelUnloadRequest(model_name="cat"))

        for name, fn, req, code, msg in [
            ("not in catalog", load, pb.RepositoryModelLoadRequest(model_name="ghost"), grpc.StatusCode.NOT_FOUND, "not in this runner's catalog"),
            ("empty name", load, pb.RepositoryModelLoadRequest(), grpc.StatusCode.INVALID_ARGUMENT, "model_name is empty"),
            ("bad spec", load, pb.RepositoryModelLoadRequest(model_name="broken"), grpc.StatusCode.INVALID_ARGUMENT, "no_such_net"),
            ("unload unknown", unload, pb.RepositoryModelUnloadRequest(model_name="ghost"), grpc.StatusCode.NOT_FOUND, "'ghost' is not in this runner's catalog"),
            ("unload unloaded", unload, pb.RepositoryModelUnloadRequest(model_name="cat"), grpc.StatusCode.NOT_FOUND, "'cat' is not loaded"),
        ]:
            with self.subTest(name):
                self.expect(code, fn, req, contains=msg)
        self.assertNotIn("ghost", index())
        self.assertEqual(index()["broken"][0], "UNAVAILABLE")
        self.assertIn("load failed", index()["broken"][1])

    def test_load_spec_from_caller_refused(self):
        """Issue 36 finding 1: a caller's parameters["config"] never names what the
        runner loads (TorchScript is code); only the operator's catalog does."""
        def index():
            return {m.name: (m.state, m.reason) for m in self.stub.RepositoryIndex(pb.RepositoryIndexRequest()).models}

        script = os.path.join(self.tmp.name, "hostile.pt")
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5))
        torch.jit.script(net).save(script)
        before = index()
        for name, spec in [("tiny", "torchscript:" + script),         # replace the model workers use
                           ("tiny", "torchvision:mobilenet_v3_small"),  # any other spec, too
                           ("cat", "torchscript:" + script),          # a catalog name, another spec
                           ("cat", "torchvision:mobilenet_v3_small@16"),
                           ("evil", "torchscript:" + script),         # a name of the caller's
                           ("evil", "x" * 100000)]:
            with self.subTest(name=name, spec=spec[:40]):
                req = pb.RepositoryModelLoadRequest(model_name=name)
                req.parameters["config"].string_param = spec
                msg = self.expect(grpc.StatusCode.PERMISSION_DENIED, self.stub.RepositoryModelLoad, req,
                                  contains="--allow-load-spec")
                self.assertLess(len(msg), 1000)  # the caller's spec is not echoed whole
                breq = pb.RepositoryModelLoadRequest(model_name=name)
                breq.parameters["config"].bytes_param = spec.encode()
                self.expect(grpc.StatusCode.PERMISSION_DENIED, self.stub.RepositoryModelLoad, breq, contains="catalog")
        self.assertEqual(index(), before)  # nothing loaded, replaced or recorded
        self.assertEqual(self.runner.models["tiny"].spec, "torchvision:resnet18")
        px = self.pixels(2, seed=5)
        np.testing.assert_allclose(out_array(self.stub.ModelInfer(infer_request("tiny", px.tobytes(), px.shape))),
                                   self.reference("tiny", px), rtol=1e-4, atol=1e-4)

    # ---- shared memory: what a register may map

    def shm_file(self, tag, size=8192):
        """A regular file /dev/shm/mdag-rt-<tag>-<pid> of size bytes, removed at cleanup; its key."""
        key = "/mdag-rt-%s-%d" % (tag, os.getpid())
        path = runner.SHM_DIR + key
        with open(path, "wb") as f:
            f.truncate(size)
        self.addCleanup(lambda: os.path.lexists(path) and os.remove(path))
        return key, path

    def test_shared_memory_refuses_links_and_strangers(self):
        """Issue 36 finding 2: a register maps read-write only a regular file of the
        runner's own uid with one link; never a link, a FIFO, a directory or
        another user's object."""
        outside = os.path.join(self.tmp.name, "victim")
        with open(outside, "wb") as f:
            f.write(b"v" * 64)
        key_link = "/mdag-rt-link-%d" % os.getpid()
        os.symlink(outside, runner.SHM_DIR + key_link)
        self.addCleanup(os.remove, runner.SHM_DIR + key_link)
        key_fifo = "/mdag-rt-fifo-%d" % os.getpid()
        os.mkfifo(runner.SHM_DIR + key_fifo)
        self.addCleanup(os.remove, runner.SHM_DIR + key_fifo)
        key_dir = "/mdag-rt-dir-%d" % os.getpid()
        os.mkdir(runner.SHM_DIR + key_dir)
        self.addCleanup(os.rmdir, runner.SHM_DIR + key_dir)
        key_hard, path_hard = self.shm_file("hard")
        os.link(path_hard, path_hard + "-2")
        self.addCleanup(os.remove, path_hard + "-2")
        cases = [("symlink", key_link, "symbolic link"), ("fifo", key_fifo, "a FIFO"),
                 ("directory", key_dir, "a directory"), ("hard link", key_hard, "2 links")]
        if os.geteuid() == 0:  # chown to another uid needs root (the tests run as root)
            key_other, path_other = self.shm_file("other")
            os.chown(path_other, 4242, 4242)
            cases.append(("another uid", key_other, "owned by uid 4242"))
        else:
            self.logs.append("test: not root, the other-uid case is not run")
        reg = self.stub.SystemSharedMemoryRegister
        for name, key, msg in cases:
            with self.subTest(name):
                self.expect(grpc.StatusCode.PERMISSION_DENIED, reg,
                            pb.SystemSharedMemoryRegisterRequest(name="bad-" + name, key=key, byte_size=32), contains=msg)
        self.expect(grpc.StatusCode.NOT_FOUND, reg, pb.SystemSharedMemoryRegisterRequest(
            name="x", key="/mdag-rt-none-%d" % os.getpid(), byte_size=8), contains="No such file")
        st = self.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
        self.assertEqual([n for n in st.regions if n.startswith("bad-")], [])
        with open(outside, "rb") as f:
            self.assertEqual(f.read(), b"v" * 64)
        # the runner's own regular file with one link maps
        key_ok, _ = self.shm_file("ok")
        reg(pb.SystemSharedMemoryRegisterRequest(name="rt-ok", key=key_ok, byte_size=32))
        self.stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="rt-ok"))

    def test_shared_memory_output_stays_in_its_region(self):
        """An output's offset is the caller's: the write must fit the region, and
        bytes past it (in the same file) stay untouched."""
        n, out_bytes = 1, 1000 * 4
        key, path = self.shm_file("out", size=2 * out_bytes + 4096)
        with open(path, "r+b") as f:
            f.write(b"\xab" * (2 * out_bytes + 4096))
        self.stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="rt-out", key=key, offset=0, byte_size=out_bytes + 8))
        self.addCleanup(self.stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest(name="rt-out"))
        px = self.pixels(n, seed=4)
        for offset, msg in [(16, "offset 16 + byte_size 4000 is outside its 4008 bytes"), (-8, "offset -8"),
                            (1 << 62, "is outside its 4008 bytes")]:
            with self.subTest(offset=offset):
                req = infer_request("tiny", px.tobytes(), px.shape)
                o = req.outputs.add(name="output")
                o.parameters["shared_memory_region"].string_param = "rt-out"
                o.parameters["shared_memory_offset"].int64_param = offset
                self.expect(grpc.StatusCode.INVALID_ARGUMENT, self.stub.ModelInfer, req, contains=msg)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"\xab" * (2 * out_bytes + 4096))
        req = infer_request("tiny", px.tobytes(), px.shape)
        o = req.outputs.add(name="output")
        o.parameters["shared_memory_region"].string_param = "rt-out"
        o.parameters["shared_memory_offset"].int64_param = 8
        self.stub.ModelInfer(req)
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"\xab" * 8)
        np.testing.assert_allclose(np.frombuffer(data[8:8 + out_bytes], dtype=np.float32).reshape(1, 1000),
                                   self.reference("tiny", px), rtol=1e-4, atol=1e-4)
        self.assertEqual(data[8 + out_bytes:], b"\xab" * (len(data) - 8 - out_bytes))


class ShmLimitsTest(unittest.TestCase):
    """The shared memory extension's bounds (issue 36 finding 2): regions and
    registered bytes, and the names it keeps; refused before anything is opened."""

    def setUp(self):
        self.logs = []
        args = runner.parse_args(["--device", "cpu", "--shm-max-regions", "2", "--shm-max-bytes", "10000"])
        self.runner = runner.Runner(args, log=self.logs.append)
        self.addCleanup(self.runner.close)
        self.keys = []
        for i in range(3):
            key = "/mdag-rt-lim%d-%d" % (i, os.getpid())
            with open(runner.SHM_DIR + key, "wb") as f:
                f.truncate(16384)
            self.addCleanup(os.remove, runner.SHM_DIR + key)
            self.keys.append(key)

    def register(self, name, key, size, code=None, contains=""):
        req = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=size)
        if code is None:
            return self.runner._register(req)
        with self.assertRaises(runner.Abort) as cm:
            self.runner._register(req)
        self.assertEqual(cm.exception.code, code, cm.exception.msg)
        self.assertIn(contains, cm.exception.msg)
        return cm.exception.msg

    def test_defaults(self):
        a = runner.parse_args(["--device", "cpu"])
        self.assertEqual((a.shm_max_regions, a.shm_max_bytes), (1024, 4 << 30))
        for argv in [["--shm-max-regions", "0"], ["--shm-max-bytes", "0"], ["--shm-max-bytes", "-1"]]:
            with self.subTest(argv=argv):
                with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                    runner.parse_args(["--device", "cpu"] + argv)

    def test_regions_and_bytes_bounded(self):
        self.register("a", self.keys[0], 4096)
        self.register("b", self.keys[1], 4096)
        full = "2 regions of 8192 bytes are registered, and the runner holds at most 2 regions of 10000 bytes"
        self.register("c", self.keys[2], 1, grpc.StatusCode.RESOURCE_EXHAUSTED, full)
        # refused before the key is opened: a missing key is not even looked at
        self.register("c", "/mdag-rt-none-%d" % os.getpid(), 1, grpc.StatusCode.RESOURCE_EXHAUSTED, "at most 2 regions")
        self.runner._unregister(pb.SystemSharedMemoryUnregisterRequest(name="a"))
        self.register("c", self.keys[2], 8192, grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "region 'c' of 8192 bytes: 1 regions of 4096 bytes are registered")
        self.register("c", self.keys[2], 1 << 62, grpc.StatusCode.RESOURCE_EXHAUSTED, "of 10000 bytes")
        self.register("c", self.keys[2], 5904)  # exactly to the byte limit
        self.register("d", self.keys[0], 1, grpc.StatusCode.RESOURCE_EXHAUSTED, "2 regions of 10000 bytes are registered")
        # a failed open gives its reservation back
        self.runner._unregister(pb.SystemSharedMemoryUnregisterRequest(name="c"))
        self.register("e", "/mdag-rt-none-%d" % os.getpid(), 4096, grpc.StatusCode.NOT_FOUND, "No such file")
        self.register("e", self.keys[2], 16384, grpc.StatusCode.RESOURCE_EXHAUSTED, "1 regions of 4096 bytes")
        self.register("e", self.keys[2], 4096)
        self.assertEqual(sorted(self.runner.regions), ["b", "e"])
        self.assertEqual(self.runner.shm_bytes, 8192)
        # an empty name unregisters every region (the protocol's), and frees the bounds
        self.runner._unregister(pb.SystemSharedMemoryUnregisterRequest(name=""))
        self.assertEqual((self.runner.regions, self.runner.shm_bytes), ({}, 0))
        self.register("f", self.keys[0], 10000)

    def test_names_bounded_and_not_echoed(self):
        huge = "n" * (1 << 20)
        msg = self.register(huge, self.keys[0], 8, grpc.StatusCode.INVALID_ARGUMENT, "a region name of 1048576 bytes: at most 256")
        self.assertLess(len(msg), 1000)
        msg = self.register("k", "/" + "k" * 300, 8, grpc.StatusCode.INVALID_ARGUMENT, "key of 301 bytes")
        self.assertLess(len(msg), 1000)
        self.assertEqual(self.runner.regions, {})
        self.assertEqual(self.runner.shm_bytes, 0)
        with self.assertRaises(runner.Abort) as cm:
            self.runner._shm_status(pb.SystemSharedMemoryStatusRequest(name=huge))
        self.assertLess(len(cm.exception.msg), 1000)
        with self.assertRaises(runner.Abort) as cm:
            self.runner.region(huge, "test", [])
        self.assertLess(len(cm.exception.msg), 1000)


class LoadSpecOptInTest(unittest.TestCase):
    """--allow-load-spec (dangerous, off by default): a caller's config names the spec."""

    def test_caller_spec_loads_with_the_flag(self):
        args = runner.parse_args(["--device", "cpu", "--size", str(SIZE), "--max-batch", "2", "--batches", "1,2",
                                  "--slots", "1", "--allow-load-spec"])
        r = runner.Runner(args, log=lambda m: None)
        self.addCleanup(r.close)
        req = pb.RepositoryModelLoadRequest(model_name="dyn")
        req.parameters["config"].string_param = "torchvision:mobilenet_v3_small"
        r._load(req)
        self.assertEqual(r.models["dyn"].spec, "torchvision:mobilenet_v3_small")
        # another spec under the same name: reloaded
        req.parameters["config"].string_param = "torchvision:resnet18"
        r._load(req)
        self.assertEqual(r.models["dyn"].spec, "torchvision:resnet18")
        r._unload(pb.RepositoryModelUnloadRequest(model_name="dyn"))
        # and by name alone afterwards, with the spec it was last loaded with
        r._load(pb.RepositoryModelLoadRequest(model_name="dyn"))
        self.assertEqual(r.models["dyn"].spec, "torchvision:resnet18")
        bad = pb.RepositoryModelLoadRequest(model_name="bad")
        bad.parameters["config"].string_param = "torchvision:no_such_net"
        with self.assertRaises(runner.Abort) as cm:
            r._load(bad)
        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("no_such_net", cm.exception.msg)
        self.assertIn("bad", r.failed)


class EngineTest(unittest.TestCase):
    def test_float_input_is_passed_through(self):
        for layout, dtype in [("fp32-nchw", torch.float32), ("fp16-nchw", torch.float16)]:
            with self.subTest(layout):
                torch.manual_seed(2)
                e = engine.Engine("f", "torchvision:resnet18", "cpu", layout, SIZE, 2, [1, 2], 1, log=lambda m: None)
                x = torch.randn(2, 3, SIZE, SIZE).to(dtype)
                y = e.run(0, torch.frombuffer(bytearray(x.numpy().tobytes()), dtype=torch.uint8), 2)
                with torch.inference_mode():
                    want = e.model.model(x.float())
                torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
                # a source at an odd offset (shared memory may place it so) and an odd output offset
                buf = torch.frombuffer(bytearray(b"\0" + x.numpy().tobytes()), dtype=torch.uint8)[1:]
                out = torch.zeros(1 + 2 * 1000 * 4, dtype=torch.uint8)
                e.run(0, buf, 2, out[1:])
                got = torch.frombuffer(bytearray(out[1:].numpy().tobytes()), dtype=torch.float32).view(2, 1000)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                self.assertEqual(e.shape(-1), (-1, 3, SIZE, SIZE))
                e.close()
                self.assertIsNone(e.acquire())  # closed: no more batches

    def test_close_waits_for_batches_in_flight(self):
        logs = []
        e = engine.Engine("w", "torchvision:resnet18", "cpu", "uint8-nhwc", 16, 1, [1], 2, log=logs.append)
        slot = e.acquire()
        e.close(timeout=0)  # a batch is in flight: the model stays
        self.assertIn("unloading with 1 batches still in flight", logs[-1])
        self.assertIsNotNone(e.model)
        self.assertIsNone(e.acquire())  # but no new batch starts
        y = e.run(slot, torch.zeros(16 * 16 * 3, dtype=torch.uint8), 1)
        self.assertEqual(tuple(y.shape), (1, 1000))
        e.release(slot)
        e.close(timeout=0)
        self.assertIsNone(e.model)

    def test_graph_batch_picks_smallest_captured(self):
        fake = types.SimpleNamespace(batches=[1, 2, 4, 8, 16, 32])
        for n, want in [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (32, 32)]:
            with self.subTest(n=n):
                self.assertEqual(engine.Engine.graph_batch(fake, n), want)
        with self.assertRaises(ValueError):
            engine.Engine.graph_batch(fake, 33)

    def test_bad_specs(self):
        for spec, msg in [("resnet50", "want torchvision:NAME"), ("onnx:x", "unknown format 'onnx'"),
                          ("torchvision:nope_net", "nope_net"), ("torchscript:/no/such.pt", "cannot load TorchScript")]:
            with self.subTest(spec):
                with self.assertRaises(engine.SpecError) as cm:
                    engine.build_module(spec)
                self.assertIn(msg, str(cm.exception))

    def test_spec_size_suffix(self):
        for spec, want in [("torchvision:resnet18", ("torchvision:resnet18", None)),
                           ("timm:inception_resnet_v2@299", ("timm:inception_resnet_v2", 299)),
                           ("torchscript:/m@v2.pt", ("torchscript:/m@v2.pt", None)),
                           ("torchscript:/m.pt@32", ("torchscript:/m.pt", 32))]:
            with self.subTest(spec):
                self.assertEqual(engine.split_spec(spec), want)
        with self.assertRaises(engine.SpecError):
            engine.split_spec("torchvision:resnet18@0")
        e = engine.Engine("r", "torchvision:resnet18@24", "cpu", "uint8-nhwc", 16, 2, [1, 2], 1, log=lambda m: None)
        self.assertEqual((e.spec, e.size, e.shape(2)), ("torchvision:resnet18@24", 24, (2, 24, 24, 3)))
        e.close(timeout=0)

    def test_torchscript_spec(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.pt")
            net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 5))
            torch.jit.script(net).save(path)
            e = engine.Engine("ts", "torchscript:" + path, "cpu", "uint8-nhwc", 8, 2, [1, 2], 1, log=lambda m: None)
            self.assertEqual(e.classes, 5)
            px = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
            y = e.run(0, px.reshape(-1), 2)
            x = (px.float() / 255 - torch.tensor(engine.IMAGENET_MEAN)) / torch.tensor(engine.IMAGENET_STD)
            with torch.inference_mode():
                torch.testing.assert_close(y, net(x.permute(0, 3, 1, 2)), rtol=1e-4, atol=1e-4)


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device (the GPU path: run this file on a GPU machine)")
class CudaTest(unittest.TestCase):
    """The CUDA path: graphs per batch and slot, padding, streams, pinned and
    page-locked shared memory, GPU memory report and release. Runs only where
    torch sees a GPU; everything else in this file runs on CPU."""

    S = 64

    @classmethod
    def setUpClass(cls):
        torch.manual_seed(3)
        cls.logs = []
        cls.tmp = tempfile.TemporaryDirectory()
        cat = os.path.join(cls.tmp.name, "catalog")
        with open(cat, "w") as f:
            f.write("m2=torchvision:resnet50\n")
        args = runner.parse_args(["--listen", "127.0.0.1:0", "--device", "cuda", "--model", "g=torchvision:resnet18",
                                  "--size", str(cls.S), "--max-batch", "8", "--batches", "1,2,4,8", "--slots", "2",
                                  "--catalog", cat])
        cls.server, cls.runner, port = runner.serve(args, log=cls.logs.append)
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop(None).wait()
        cls.runner.close()
        cls.tmp.cleanup()

    def px(self, n, seed):
        return np.random.default_rng(seed).integers(0, 256, size=(n, self.S, self.S, 3), dtype=np.uint8)

    def eager(self, name, px):
        """The same fp16 CUDA model, eager (no graph), on the same pixels."""
        e = self.runner.models[name]
        with torch.no_grad():
            return e.model(torch.from_numpy(px).cuda()).float().cpu().numpy()

    def test_graphs_and_padding_match_eager(self):
        e = self.runner.models["g"]
        self.assertEqual(e.batches, [1, 2, 4, 8])
        self.assertEqual(sorted(e.slots[0].graphs), [1, 2, 4, 8])
        for n in [1, 3, 5, 8]:  # 3 and 5 run the graphs of 4 and 8, padded
            with self.subTest(batch=n):
                px = self.px(n, seed=n)
                got = out_array(self.stub.ModelInfer(infer_request("g", px.tobytes(), px.shape)))
                self.assertEqual(got.shape, (n, 1000))
                np.testing.assert_allclose(got, self.eager("g", px), rtol=2e-2, atol=2e-2)

    def test_fp16_close_to_fp32(self):
        import copy
        e = self.runner.models["g"]
        ref = copy.deepcopy(e.model.model).float().cpu().to(memory_format=torch.contiguous_format)
        px = self.px(4, seed=11)
        got = out_array(self.stub.ModelInfer(infer_request("g", px.tobytes(), px.shape)))
        x = (px.astype(np.float32) / 255.0 - MEAN) / STD
        with torch.no_grad():
            want = ref(torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))).numpy()
        for g, w in zip(got, want):
            cos = float(np.dot(g, w) / (np.linalg.norm(g) * np.linalg.norm(w)))
            self.assertGreater(cos, 0.999)

    def test_concurrent_slots(self):
        px = [self.px(int(1 + i % 8), seed=50 + i) for i in range(24)]
        want = [self.eager("g", p) for p in px]
        got, errs = [None] * len(px), []

        def call(i):
            try:
                got[i] = out_array(self.stub.ModelInfer(infer_request("g", px[i].tobytes(), px[i].shape)))
            except Exception as ex:  # reported below
                errs.append(ex)

        ts = [threading.Thread(target=call, args=(i,)) for i in range(len(px))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errs, [])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2)

    def test_page_locked_shared_memory(self):
        n, S = 4, self.S
        in_bytes, out_bytes = n * S * S * 3, n * 1000 * 4
        key = "/mdag-runner-cuda-%d" % os.getpid()
        with open("/dev/shm" + key, "wb") as f:
            f.truncate(in_bytes + out_bytes)
        self.addCleanup(os.remove, "/dev/shm" + key)
        px = self.px(n, seed=9)
        with open("/dev/shm" + key, "r+b") as f:
            f.write(px.tobytes())
        self.stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="cin", key=key, byte_size=in_bytes))
        self.stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="cout", key=key, offset=in_bytes, byte_size=out_bytes))
        self.addCleanup(self.stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest())
        self.assertTrue(self.runner.regions["cin"].registered, self.logs)
        self.assertTrue(self.runner.regions["cin"].view("t", 0, 8).is_pinned())
        req = infer_request("g", None, px.shape)
        req.inputs[0].parameters["shared_memory_region"].string_param = "cin"
        o = req.outputs.add(name="output")
        o.parameters["shared_memory_region"].string_param = "cout"
        self.stub.ModelInfer(req)
        with open("/dev/shm" + key, "rb") as f:
            f.seek(in_bytes)
            got = np.frombuffer(f.read(out_bytes), dtype=np.float32).reshape(n, 1000)
        np.testing.assert_allclose(got, self.eager("g", px), rtol=2e-2, atol=2e-2)

    def test_memory_reported_and_freed(self):
        req = pb.RepositoryModelLoadRequest(model_name="m2")  # the catalog's spec
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        self.stub.RepositoryModelLoad(req)  # on the loader thread that loaded "g" (cuBLAS workspaces paid)
        idx = {m.name: m.reason for m in self.stub.RepositoryIndex(pb.RepositoryIndexRequest()).models}
        words = dict(w.split("=", 1) for w in idx["m2"].split() if "=" in w)
        self.assertEqual(words["graphs"], "1,2,4,8")
        gpu = int(words["gpu_bytes"])
        self.assertGreater(gpu, 25_000_000 * 2)  # resnet50's 25.6M parameters in fp16, at least
        self.assertGreaterEqual(int(words["gpu_reserved_bytes"]), gpu)
        self.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="m2"))
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated() - before
        if left >= gpu // 10:
            # say what stayed: the sizes of the blocks allocated now, largest first
            blocks = sorted((b["size"] for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
                             if b["state"] == "active_allocated"), reverse=True)
            self.fail("%d bytes of the model's %d stayed allocated after its unload; active blocks (bytes): %s"
                      % (left, gpu, blocks[:16]))

    def test_bench_cuda_events(self):
        res = self.runner.models["g"].bench([1, 3, 8], iters=5, warmup=2)
        self.assertEqual(res[3]["graph_batch"], 4)
        for v in res.values():
            self.assertGreater(v["median_ms"], 0)


class CLITest(unittest.TestCase):
    def test_bad_flags(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        bad_catalog = os.path.join(tmp.name, "catalog")
        with open(bad_catalog, "w") as f:
            f.write("a=torchvision:resnet18\njust-a-name\n")
        for argv in [["--model", "noequals"], ["--batches", "1,x"], ["--batches", "0,2"], ["--slots", "0"],
                     ["--input", "bgr"], ["--threads", "-1"], ["--device", "cpu", "--catalog", "/no/such/catalog"],
                     ["--device", "cpu", "--catalog", bad_catalog], ["--device", "cpu", "--listen", "0.0.0.0:8001"],
                     ["--device", "cpu", "--listen", "[::]:8001"]]:
            with self.subTest(argv=argv):
                with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                    runner.parse_args(argv)

    def test_listen_loopback_or_open(self):
        for listen, ok in [("127.0.0.1:8001", True), ("localhost:0", True), ("[::1]:8001", True), ("10.0.0.5:8001", False)]:
            with self.subTest(listen=listen):
                self.assertEqual(runner.is_loopback(listen), ok)
        a = runner.parse_args(["--device", "cpu", "--listen", "0.0.0.0:8001", "--open"])
        self.assertTrue(a.open)

    def test_main_serves_until_sigterm(self):
        import queue
        import re
        import signal
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "runner.py"), "--listen", "127.0.0.1:0", "--device", "cpu",
                              "--model", "m=torchvision:mobilenet_v3_small", "--size", "32", "--max-batch", "2"],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in p.stderr], daemon=True).start()
        port = None
        while port is None:
            line = lines.get(timeout=120)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+) \(stubs: generated; CPU eager", line)
            port = m and int(m.group(1))
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            self.assertTrue(stub.ModelReady(pb.ModelReadyRequest(name="m")).ready)
            resp = stub.ModelInfer(infer_request("m", bytes(2 * 32 * 32 * 3), [2, 32, 32, 3]))
            self.assertEqual(list(resp.outputs[0].shape), [2, 1000])
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=60), 0)
        p.stderr.close()

    def test_bench_prints_json(self):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            runner.main(["--bench", "--device", "cpu", "--model", "r=torchvision:resnet18", "--size", "16",
                         "--max-batch", "2", "--batches", "1,2", "--bench-iters", "2"])
        out = json.loads(buf.getvalue())
        self.assertEqual(out["device"], "cpu")
        b = out["models"]["r"]["batches"]
        self.assertEqual(sorted(b), ["1", "2"])
        for v in b.values():
            self.assertGreater(v["median_ms"], 0)
            self.assertGreater(v["items_per_s"], 0)
            self.assertGreater(v["with_copies_median_ms"], 0)


class StubsTest(unittest.TestCase):
    def test_fallback_stubs_speak_the_same_wire(self):
        req = pb.ModelInferRequest(model_name="m", id="7")
        t = req.inputs.add(name="input", datatype="UINT8", shape=[2, 3])
        t.parameters["shared_memory_region"].string_param = "r"
        req.raw_input_contents.append(b"\x01\x02")
        code = ("import sys, pbload; pb, g, how = pbload.load(); assert how.startswith('fallback'), how; "
                "r = pb.ModelInferRequest.FromString(sys.stdin.buffer.read()); "
                "assert r.inputs[0].parameters['shared_memory_region'].string_param == 'r'; "
                "s = pb.SystemSharedMemoryStatusResponse(); s.regions['a'].byte_size = 9; "
                "assert g.GRPCInferenceServiceStub; sys.stdout.buffer.write(r.SerializeToString())")
        env = dict(os.environ, MDAG_PB_FALLBACK="1")
        p = subprocess.run([sys.executable, "-c", code], input=req.SerializeToString(), capture_output=True,
                           cwd=HERE, env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(pb.ModelInferRequest.FromString(p.stdout), req)


if __name__ == "__main__":
    unittest.main()
