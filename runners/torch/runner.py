#!/usr/bin/env python3
"""mdag's PyTorch GPU runner: an Open Inference Protocol (KServe v2) gRPC server.

    python3 runners/torch/runner.py --listen 127.0.0.1:8001 \
        --model resnet50=torchvision:resnet50 --device cuda --max-batch 32 \
        --batches 1,2,4,8,16,32 --input uint8-nhwc --size 224 --slots 2

See README.md beside this file for the protocol as served, the memory report
and --bench.
"""

import argparse
import errno
import ipaddress
import gc
import json
import mmap
import os
import signal
import stat
import sys
import threading
import time
from concurrent import futures

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import grpc  # noqa: E402
import torch  # noqa: E402

import engine  # noqa: E402
import pbload  # noqa: E402

pb, pb_grpc, PB_HOW = pbload.load()

SERVER_NAME = "mdag-torch-runner"
SERVER_VERSION = "1"
EXTENSIONS = ["model_repository", "system_shared_memory"]
INPUT_NAME = "input"
OUTPUT_NAME = "output"
P_REGION = "shared_memory_region"
P_SIZE = "shared_memory_byte_size"
P_OFFSET = "shared_memory_offset"
SHM_DIR = "/dev/shm"
MAX_REGION_NAME = 256  # bytes: the longest region name kept (as mdag's Go server)
MAX_KEY = 256          # bytes: "/" + NAME_MAX
MAX_ECHO = 64          # characters of a caller's string an error message repeats


def _clip(s):
    """A caller's string for an error message: repr'd, cut to MAX_ECHO characters."""
    if isinstance(s, bytes):
        s = s.decode("utf-8", "replace")
    if len(s) <= MAX_ECHO:
        return repr(s)
    return "%r... (%d characters)" % (s[:MAX_ECHO], len(s))


class Abort(Exception):
    """An RPC error: a grpc status code and a message."""

    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code
        self.msg = msg


def _param(params, key):
    """The value of an InferParameter / ModelRepositoryParameter, or None."""
    if key not in params:
        return None
    p = params[key]
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def _typed_param(params, key, kind, where):
    """_param checked to be of kind (int or str): INVALID_ARGUMENT otherwise."""
    v = _param(params, key)
    if v is None:
        return None
    if kind is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind is str and isinstance(v, str):
        return v
    raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: parameter %s is %s %s, want %s"
                % (where, key, type(v).__name__, _clip(v) if isinstance(v, (str, bytes)) else repr(v),
                   "an integer" if kind is int else "a string"))


def check_key(name, key):
    """INVALID_ARGUMENT unless key is /NAME: one path element, as shm_open takes."""
    if len(key) > MAX_KEY:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                    "shared memory region %s: a key of %d bytes: at most %d" % (_clip(name), len(key), MAX_KEY))
    if not key.startswith("/") or len(key) < 2 or "/" in key[1:] or "\0" in key or key[1:] in (".", ".."):
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                    "shared memory region %s: key %r: want /NAME (one path element, as shm_open takes)" % (_clip(name), key))


def _file_type(mode):
    for test, what in [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]:
        if test(mode):
            return what
    return "not a regular file"


def open_shm(name, key):
    """Opens /dev/shm/<key> read-write and returns (fd, size), refusing what the
    runner's own user could not have made with shm_open: a symbolic link
    (/dev/shm is world-writable: a link there may lead to any file the runner
    may write), anything but a regular file (a FIFO, a directory, a device),
    an object of another uid than the runner's effective uid (another user's
    region, or a file they planted) and a hard link (st_nlink != 1): each
    PERMISSION_DENIED; a missing key NOT_FOUND."""
    check_key(name, key)
    path = os.path.join(SHM_DIR, key[1:])
    where = "shared memory region %s: key %s" % (_clip(name), key)
    try:
        # O_NONBLOCK: a FIFO or a device must not wait for a peer (its type is
        # refused below, on the open descriptor)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: refused: %s is a symbolic link, not a shared memory object" % (where, path))
        if e.errno == errno.EISDIR:
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: refused: %s is a directory, not a shared memory object" % (where, path))
        if e.errno == errno.ENOENT:
            raise Abort(grpc.StatusCode.NOT_FOUND, "%s: %s" % (where, e.strerror))
        if e.errno in (errno.EACCES, errno.EPERM):
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: %s" % (where, e.strerror))
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: %s" % (where, e.strerror))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: refused: it is %s, not a shared memory object (a regular file in %s)"
                        % (where, _file_type(st.st_mode), SHM_DIR))
        if st.st_uid != os.geteuid():
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: refused: it is owned by uid %d, and the runner maps only its own uid's (%d) objects"
                        % (where, st.st_uid, os.geteuid()))
        if st.st_nlink != 1:
            raise Abort(grpc.StatusCode.PERMISSION_DENIED, "%s: refused: it has %d links, want 1 (a hard link to another object?)"
                        % (where, st.st_nlink))
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


class Region:
    """A registered system shared memory region: /dev/shm/<key> mapped from offset
    (open_shm says which objects may be mapped)."""

    def __init__(self, name, key, offset, size, pin=False):
        if size <= 0:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "shared memory region %s: byte_size %d" % (_clip(name), size))
        fd, total = open_shm(name, key)
        try:
            if offset < 0 or offset + size > total:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "shared memory region %s: offset %d + byte_size %d is outside %s's %d bytes"
                            % (_clip(name), offset, size, key, total))
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            self.map = mmap.mmap(fd, offset + size - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                 offset=start)
        finally:
            os.close(fd)
        self.name, self.key, self.offset, self.size = name, key, offset, size
        self.skip = offset - start
        # the whole region as a uint8 tensor over the mapping (no copy)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)[self.skip:self.skip + size]
        self.users = 0        # requests using it (Runner.lock)
        self.closing = False  # unregistered: closed when users drops to 0
        self.registered = False
        if pin and torch.cuda.is_available() and hasattr(torch.cuda, "cudart"):
            # page-lock the whole (page-aligned) mapping so the H2D and D2H
            # copies use it directly; on failure requests copy through the
            # slot's pinned buffers
            try:
                base = torch.frombuffer(self.map, dtype=torch.uint8)
                err = torch.cuda.cudart().cudaHostRegister(base.data_ptr(), len(self.map), 0)
                self.registered = int(getattr(err, "value", err)) == 0
                self._base_ptr = base.data_ptr()
                del base
            except Exception:
                self.registered = False

    def view(self, what, offset, nbytes):
        """Bytes [offset, offset+nbytes) of the region: every read and write of a
        request goes through one, so none leaves the region."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                        "%s: shared memory region %r: offset %d + byte_size %d is outside its %d bytes"
                        % (what, self.name, offset, nbytes, self.size))
        v = self.tensor[offset:offset + nbytes]
        if v.numel() != nbytes:  # the mapping is shorter than the region: never write past it
            raise Abort(grpc.StatusCode.INTERNAL, "%s: shared memory region %r: a view of %d bytes at %d has %d"
                        % (what, self.name, nbytes, offset, v.numel()))
        return v

    def close(self):
        if self.registered:
            try:
                torch.cuda.cudart().cudaHostUnregister(self._base_ptr)
            except Exception:
                pass
        self.tensor = None
        try:
            self.map.close()
        except BufferError:
            pass  # a request still reads it: the mapping goes with its last view


class Runner(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer: models, shared memory regions, the RPCs."""

    def __init__(self, args, log=None):
        self.args = args
        self.log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self.catalog = dict(args.catalog_entries)
        self.models = {}
        self.failed = {}  # name -> error text of the last failed load
        self.lock = threading.Lock()       # models, failed, regions
        self.load_lock = threading.Lock()  # one load/unload at a time (memory deltas)
        self.regions = {}
        self.reserved = set()  # region names being mapped (their bytes are in shm_bytes)
        self.shm_bytes = 0     # byte_size of regions and reserved, summed (Runner.lock)
        self.stats = {}  # model -> batch -> [requests, seconds per part] (--stats; Runner.lock)
        # Loads and unloads run on this one thread. cuBLAS keeps a handle per
        # thread and a workspace per handle and stream (32 MiB on Hopper) for
        # the process's life: loads on whichever gRPC thread served the call
        # left ~100 MB allocated after the first load on each thread (seen on
        # an H200, docs/gpu-report.md); on one thread that cost is paid once.
        self._loader = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner-load")

    # ---- model lifetime

    def load(self, name, spec=None):
        return self._loader.submit(self._load_now, name, spec).result()

    def _load_now(self, name, spec):
        with self.load_lock:
            spec = spec or self.catalog.get(name)
            if not spec:
                raise Abort(grpc.StatusCode.NOT_FOUND,
                            "model %r: no spec (parameters \"config\": \"torchvision:NAME\") and not in the catalog (%s)"
                            % (name, ", ".join(sorted(self.catalog)) or "empty"))
            with self.lock:
                old = self.models.get(name)
            if old is not None and old.spec == spec:
                return old
            if old is not None:
                self._drop(name)
            a = self.args
            try:
                e = engine.Engine(name, spec, a.device, a.input, a.size, a.max_batch, a.batches, a.slots, log=self.log)
            except engine.SpecError as err:
                with self.lock:
                    self.failed[name] = str(err)
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            except (RuntimeError, ValueError, TypeError) as err:  # CUDA out of memory among them
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                with self.lock:
                    self.failed[name] = str(err)
                raise Abort(grpc.StatusCode.INTERNAL, "model %r (%s): load failed: %s" % (name, spec, err))
            with self.lock:
                self.models[name] = e
                self.failed.pop(name, None)
                self.catalog[name] = spec  # the catalog's own spec unless --allow-load-spec
            return e

    def unload(self, name):
        return self._loader.submit(self._unload_now, name).result()

    def _unload_now(self, name):
        with self.load_lock:  # not while a load measures its memory
            self._drop(name)

    def _drop(self, name):
        with self.lock:
            e = self.models.pop(name, None)
        if e is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, "model %r is not loaded" % name)
        e.close()
        with self.lock:
            self.stats.pop(name, None)  # a reload with another spec starts its own
        self.log("model %s: unloaded" % name)

    def model(self, name, version=""):
        if version not in ("", "1"):
            raise Abort(grpc.StatusCode.NOT_FOUND, "model %s version %s: this runner serves version 1 only" % (_clip(name), _clip(version)))
        with self.lock:
            e = self.models.get(name)
            loaded = sorted(self.models)
        if e is None:
            raise Abort(grpc.StatusCode.NOT_FOUND,
                        "model %s is not loaded on this runner (loaded: %s)" % (_clip(name), ", ".join(loaded) or "none"))
        return e

    # ---- health and metadata

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        with self.lock:
            ok = request.name in self.models
        return pb.ModelReadyResponse(ready=ok and request.version in ("", "1"))

    def ServerMetadata(self, request, context):
        mode = "cuda-graphs" if self.args.device.startswith("cuda") else "cpu-eager"
        return pb.ServerMetadataResponse(
            name=SERVER_NAME,
            version="%s torch-%s %s input=%s" % (SERVER_VERSION, torch.__version__, mode, self.args.input),
            extensions=EXTENSIONS)

    def ModelMetadata(self, request, context):
        return self._rpc(context, self._model_metadata, request)

    def _model_metadata(self, request):
        e = self.model(request.name, request.version)
        r = pb.ModelMetadataResponse(name=e.name, versions=["1"], platform="pytorch_" + e.spec.split(":", 1)[0])
        r.inputs.add(name=INPUT_NAME, datatype=e.wire_dtype, shape=list(e.shape(-1)))
        r.outputs.add(name=OUTPUT_NAME, datatype="FP32", shape=[-1, e.classes])
        return r

    # ---- inference

    def ModelInfer(self, request, context):
        return self._rpc(context, self._infer, request)

    def _infer(self, req):
        held = []  # regions this request uses: not unmapped until it is done
        try:
            t0 = time.perf_counter()
            resp, n, marks = self._infer_held(req, held)
            self._account(req.model_name, n, t0, marks, time.perf_counter())
            return resp
        finally:
            for r in held:
                self.release_region(r)

    def _infer_held(self, req, held):
        e = self.model(req.model_name, req.model_version)
        where = "model %r input %r" % (e.name, INPUT_NAME)
        if len(req.inputs) != 1:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                        "model %r takes 1 input (%r), request has %d" % (e.name, INPUT_NAME, len(req.inputs)))
        t = req.inputs[0]
        if t.name != INPUT_NAME:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "model %r has input %r, request names %s" % (e.name, INPUT_NAME, _clip(t.name)))
        if t.datatype != e.wire_dtype:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: datatype %s, want %s" % (where, t.datatype[:MAX_ECHO], e.wire_dtype))
        shape = list(t.shape)
        want = list(e.shape(-1))
        if len(shape) != len(want) or shape[1:] != want[1:]:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: shape %s, want %s" % (where, shape, want))
        n = shape[0]
        if n < 1:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: batch %d, want at least 1" % (where, n))
        if n > e.max_batch:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: batch %d is above max batch %d" % (where, n, e.max_batch))
        nbytes = n * e.item_bytes
        region = _typed_param(t.parameters, P_REGION, str, where)
        if region is not None:
            size = _typed_param(t.parameters, P_SIZE, int, where)
            if size is not None and size != nbytes:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "%s: shared_memory_byte_size %d, shape %s of %s takes %d" % (where, size, shape, t.datatype, nbytes))
            src = self.region(region, where, held).view(where, _typed_param(t.parameters, P_OFFSET, int, where) or 0, nbytes)
            if len(req.raw_input_contents):
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: in shared memory and raw_input_contents both" % where)
        else:
            if len(req.raw_input_contents) != 1:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "%s: want 1 raw_input_contents entry (or shared memory; typed contents are not read), request has %d"
                            % (where, len(req.raw_input_contents)))
            raw = req.raw_input_contents[0]
            if len(raw) != nbytes:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "%s: %d bytes, shape %s of %s takes %d" % (where, len(raw), shape, t.datatype, nbytes))
            src = torch.frombuffer(raw, dtype=torch.uint8)

        out_view, out_region = None, ""
        out_bytes = n * e.classes * 4
        for o in req.outputs:
            if o.name != OUTPUT_NAME:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "model %r has output %r, request asks for %s" % (e.name, OUTPUT_NAME, _clip(o.name)))
            oregion = _typed_param(o.parameters, P_REGION, str, "model %r output %r" % (e.name, o.name))
            if oregion is not None:
                owhere = "model %r output %r" % (e.name, OUTPUT_NAME)
                size = _typed_param(o.parameters, P_SIZE, int, owhere)
                if size is not None and size < out_bytes:
                    raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "%s: shared_memory_byte_size %d, the output [%d, %d] FP32 takes %d"
                                % (owhere, size, n, e.classes, out_bytes))
                out_region = oregion
                out_view = self.region(oregion, owhere, held).view(owhere, _typed_param(o.parameters, P_OFFSET, int, owhere) or 0, out_bytes)

        t_check = time.perf_counter()
        slot = e.acquire()
        if slot is None:
            raise Abort(grpc.StatusCode.UNAVAILABLE, "model %r is being unloaded" % e.name)
        t_slot = time.perf_counter()
        try:
            y = e.run(slot, src, n, out_view)
        finally:
            e.release(slot)
        t_run = time.perf_counter()

        resp = pb.ModelInferResponse(model_name=e.name, model_version="1", id=req.id)
        ot = resp.outputs.add(name=OUTPUT_NAME, datatype="FP32", shape=[n, e.classes])
        if out_view is not None:
            ot.parameters[P_REGION].string_param = out_region
            ot.parameters[P_SIZE].int64_param = out_bytes
        else:
            resp.raw_output_contents.append(y.contiguous().numpy().tobytes())
        return resp, n, (t_check, t_slot, t_run)

    # ---- where a request's time goes (--stats)

    STAT_PARTS = ("check", "slot_wait", "run", "respond")

    def _account(self, model, n, t0, marks, t_end):
        """Adds one answered request's parts (seconds) to the stats: checking it and finding its
        regions, waiting for a slot, the engine's run() (copies, graph replay, sync), building
        the response."""
        t = (t0,) + tuple(marks) + (t_end,)
        with self.lock:
            per = self.stats.setdefault(model, {}).setdefault(n, [0] + [0.0] * len(self.STAT_PARTS))
            per[0] += 1
            for i in range(len(self.STAT_PARTS)):
                per[i + 1] += t[i + 1] - t[i]

    def stats_snapshot(self):
        """{model: {batch: {"requests": n, "<part>_ms": mean}}} of the requests answered so far
        (ModelInfer's handler alone: gRPC's own time is outside it)."""
        with self.lock:
            out = {}
            for model, by in self.stats.items():
                out[model] = {}
                for n, per in sorted(by.items()):
                    row = {"requests": per[0]}
                    for i, name in enumerate(self.STAT_PARTS):
                        row[name + "_ms"] = round(1000 * per[i + 1] / per[0], 4)
                    out[model][str(n)] = row
            return out

    def write_stats(self, path):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.stats_snapshot(), f, indent=1)
        os.replace(tmp, path)

    # ---- repository extension

    def RepositoryIndex(self, request, context):
        r = pb.RepositoryIndexResponse()
        with self.lock:
            names = sorted(set(self.catalog) | set(self.models) | set(self.failed))
            for name in names:
                e = self.models.get(name)
                if e is not None:
                    r.models.add(name=name, version="1", state="READY", reason=e.describe())
                elif request.ready:
                    continue
                elif name in self.failed:
                    r.models.add(name=name, version="1", state="UNAVAILABLE", reason="load failed: " + self.failed[name])
                else:
                    r.models.add(name=name, version="1", state="UNAVAILABLE", reason="unloaded; spec=" + self.catalog[name])
        return r

    def RepositoryModelLoad(self, request, context):
        return self._rpc(context, self._load, request)

    def _load(self, request):
        """RepositoryModelLoad: the operator's catalog (--model, --catalog) says
        what may be loaded and with which spec; a caller names a model of it.
        A parameters["config"] that differs from the catalog's spec (or names
        a model outside it) is refused, PERMISSION_DENIED: a spec is code to run
        (torchscript:PATH) and would replace the model workers use. Only
        --allow-load-spec lets a caller's spec through."""
        name = request.model_name
        if not name:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "RepositoryModelLoad: model_name is empty")
        spec = _param(request.parameters, "config")
        if isinstance(spec, bytes):
            spec = spec.decode("utf-8", "replace")
        if spec is not None and not isinstance(spec, str):
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "RepositoryModelLoad %s: parameters[\"config\"] is %s, want a string"
                        % (_clip(name), type(spec).__name__))
        with self.lock:
            known = self.catalog.get(name)
        if spec is not None and spec != known and not self.args.allow_load_spec:
            raise Abort(grpc.StatusCode.PERMISSION_DENIED,
                        "RepositoryModelLoad %s: parameters[\"config\"] %s %s: this runner loads only the models of its "
                        "operator's catalog (--model, --catalog) with the catalog's specs; the runner was not started with "
                        "--allow-load-spec" % (_clip(name), _clip(spec),
                                               "is not the catalog's spec" if known else "names a model outside the catalog"))
        if known is None and spec is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, "RepositoryModelLoad: model %s is not in this runner's catalog (%s)"
                        % (_clip(name), ", ".join(sorted(self.catalog)) or "empty"))
        self.load(name, spec)
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request, context):
        return self._rpc(context, self._unload, request)

    def _unload(self, request):
        """RepositoryModelUnload: any caller that reaches the port may unload a model
        of the catalog (and load it again by name); a name outside it is NOT_FOUND."""
        name = request.model_name
        with self.lock:
            known = name in self.catalog or name in self.models
        if not known:
            raise Abort(grpc.StatusCode.NOT_FOUND, "RepositoryModelUnload: model %s is not in this runner's catalog (%s)"
                        % (_clip(name), ", ".join(sorted(self.catalog)) or "empty"))
        self.unload(name)
        return pb.RepositoryModelUnloadResponse()

    # ---- system shared memory extension

    def region(self, name, where, held):
        """The registered region name, held (appended to held) until release_region."""
        with self.lock:
            r = self.regions.get(name)
            if r is not None:
                r.users += 1
                held.append(r)
        if r is None:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "%s: shared memory region %s is not registered" % (where, _clip(name)))
        return r

    def release_region(self, r):
        with self.lock:
            r.users -= 1
            last = r.users == 0 and r.closing
        if last:
            r.close()

    def SystemSharedMemoryRegister(self, request, context):
        return self._rpc(context, self._register, request)

    def _register(self, req):
        """SystemSharedMemoryRegister: the name, key and the bounds (--shm-max-regions,
        --shm-max-bytes) are checked before anything is opened; the name and its
        bytes are reserved while the object is opened (open_shm) and mapped."""
        name = req.name
        if not name:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "SystemSharedMemoryRegister: name is empty")
        if len(name.encode("utf-8")) > MAX_REGION_NAME:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "SystemSharedMemoryRegister: a region name of %d bytes: at most %d"
                        % (len(name.encode("utf-8")), MAX_REGION_NAME))
        check_key(name, req.key)
        if req.byte_size <= 0:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "shared memory region %r: byte_size %d" % (name, req.byte_size))
        a = self.args
        with self.lock:
            if name in self.regions or name in self.reserved:
                raise Abort(grpc.StatusCode.ALREADY_EXISTS, "shared memory region %r is already registered" % name)
            n = len(self.regions) + len(self.reserved)
            if n >= a.shm_max_regions or self.shm_bytes + req.byte_size > a.shm_max_bytes:
                raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            "shared memory region %r of %d bytes: %d regions of %d bytes are registered, and the runner "
                            "holds at most %d regions of %d bytes in all (--shm-max-regions, --shm-max-bytes); "
                            "unregister some first" % (name, req.byte_size, n, self.shm_bytes, a.shm_max_regions, a.shm_max_bytes))
            self.reserved.add(name)
            self.shm_bytes += req.byte_size
        try:
            r = Region(name, req.key, req.offset, req.byte_size, pin=a.device.startswith("cuda"))
        except BaseException:
            with self.lock:
                self.reserved.discard(name)
                self.shm_bytes -= req.byte_size
            raise
        with self.lock:
            self.reserved.discard(name)
            self.regions[name] = r
        self.log("shared memory region %s: %s from %d, %d bytes%s" % (req.name, req.key, req.offset, req.byte_size,
                 ", page-locked for CUDA" if r.registered else ""))
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryStatus(self, request, context):
        return self._rpc(context, self._shm_status, request)

    def _shm_status(self, req):
        resp = pb.SystemSharedMemoryStatusResponse()
        with self.lock:
            if req.name and req.name not in self.regions:
                raise Abort(grpc.StatusCode.NOT_FOUND, "shared memory region %s is not registered" % _clip(req.name))
            for name, r in self.regions.items():
                if req.name and name != req.name:
                    continue
                s = resp.regions[name]
                s.name, s.key, s.offset, s.byte_size = name, r.key, r.offset, r.size
        return resp

    def SystemSharedMemoryUnregister(self, request, context):
        return self._rpc(context, self._unregister, request)

    def _unregister(self, req):
        # as Triton: an empty name unregisters all (every client's: the protocol
        # has no owners; a client that finds its region gone registers it again,
        # as mdag's kserve executor does); an unknown name is no error
        with self.lock:
            if req.name:
                gone = [self.regions.pop(req.name)] if req.name in self.regions else []
            else:
                gone = list(self.regions.values())
                self.regions.clear()
            self.shm_bytes -= sum(r.size for r in gone)
        self._close_regions(gone)
        return pb.SystemSharedMemoryUnregisterResponse()

    def _close_regions(self, gone):
        """Closes unregistered regions now, or when the last request using one ends."""
        with self.lock:
            now = []
            for r in gone:
                r.closing = True
                if r.users == 0:
                    now.append(r)
        for r in now:
            r.close()

    # ---- plumbing

    def _rpc(self, context, fn, request):
        try:
            return fn(request)
        except Abort as a:
            context.abort(a.code, a.msg)
        except Exception as ex:  # never crash the server on a request
            self.log("internal error: %s: %s" % (type(ex).__name__, ex))
            context.abort(grpc.StatusCode.INTERNAL, "%s: %s" % (type(ex).__name__, ex))

    def close(self):
        with self.lock:
            names = list(self.models)
            regs = list(self.regions.values())
            self.regions.clear()
            self.shm_bytes -= sum(r.size for r in regs)
        for name in names:
            try:
                self.unload(name)
            except Abort:
                pass
        self._close_regions(regs)
        self._loader.shutdown(wait=True)


def is_loopback(listen):
    """Whether host:port (or [v6]:port) names this host only."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_args(argv):
    p = argparse.ArgumentParser(description="mdag's PyTorch runner: an Open Inference Protocol gRPC server")
    p.add_argument("--listen", default="127.0.0.1:8001", help="host:port (port 0 picks a free one)")
    p.add_argument("--model", action="append", default=[], metavar="NAME=SPEC[@SIZE]",
                   help="load at start: SPEC is torchvision:NAME, timm:NAME or torchscript:PATH; @SIZE: this "
                        "model's input height = width, where it differs from --size (repeatable)")
    p.add_argument("--catalog", default="", help="file of NAME=SPEC lines: models RepositoryModelLoad may load by name "
                                                 "(with --model, the only models it loads)")
    p.add_argument("--allow-load-spec", action="store_true",
                   help="DANGEROUS: let RepositoryModelLoad callers name any spec in parameters[\"config\"] (a "
                        "torchscript:PATH runs that file's code in the runner) and replace a loaded model; off, a "
                        "config that is not the catalog's spec is refused (PERMISSION_DENIED)")
    p.add_argument("--shm-max-regions", type=int, default=1024,
                   help="shared memory regions registered at once, every client's together (default 1024)")
    p.add_argument("--shm-max-bytes", type=int, default=4 << 30,
                   help="byte_size of the registered regions, summed (default 4 GiB)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:N or cpu")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes to capture CUDA graphs for")
    p.add_argument("--input", default="uint8-nhwc", choices=sorted(engine.INPUTS))
    p.add_argument("--size", type=int, default=224, help="input height = width")
    p.add_argument("--slots", type=int, default=2, help="concurrent batches (CUDA streams; grpc threads)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU intra-op threads (torch.set_num_threads); 0: every CPU this process may use")
    p.add_argument("--open", action="store_true",
                   help="allow a --listen that is not loopback (the protocol has no authentication here: "
                        "anyone who can reach the port can run and load models and register shared memory)")
    p.add_argument("--stats", default="", metavar="FILE",
                   help="write where each request's time goes (check, slot wait, run, respond; mean ms per model "
                        "and batch) to FILE as JSON, every second and at exit")
    p.add_argument("--bench", action="store_true", help="time the raw model per batch size, print JSON, exit")
    p.add_argument("--bench-iters", type=int, default=20)
    a = p.parse_args(argv)
    if a.max_batch < 1 or a.slots < 1 or a.size < 1:
        p.error("--max-batch, --slots and --size must be at least 1")
    try:
        a.batches = sorted({int(b) for b in a.batches.split(",") if b.strip()})
    except ValueError:
        p.error("--batches %r: want comma-separated integers" % a.batches)
    if not a.batches or a.batches[0] < 1:
        p.error("--batches: want positive batch sizes")
    a.models = []
    for m in a.model:
        name, sep, spec = m.partition("=")
        if not sep or not name or not spec:
            p.error("--model %r: want NAME=SPEC" % m)
        a.models.append((name, spec))
    a.catalog_entries = list(a.models)
    if a.catalog:
        try:
            with open(a.catalog, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    line = line.split("#", 1)[0].strip()
                    if not line:
                        continue
                    name, sep, spec = line.partition("=")
                    if not sep or not name.strip() or not spec.strip():
                        p.error("--catalog %s:%d: want NAME=SPEC, got %r" % (a.catalog, i, line))
                    a.catalog_entries.append((name.strip(), spec.strip()))
        except OSError as e:
            p.error("--catalog: %s" % e)
    if a.threads < 0:
        p.error("--threads %d: want 0 (every CPU) or more" % a.threads)
    if a.shm_max_regions < 1 or a.shm_max_bytes < 1:
        p.error("--shm-max-regions %d, --shm-max-bytes %d: want at least 1" % (a.shm_max_regions, a.shm_max_bytes))
    if not a.bench and not a.open and not is_loopback(a.listen):
        p.error("--listen %s is not a loopback address: the Open Inference Protocol port has no authentication, "
                "so anyone who can reach it could run and load models; keep it on 127.0.0.1, or give --open on a "
                "trusted network" % a.listen)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device %s: torch %s sees no CUDA device" % (a.device, torch.__version__))
    return a


def serve(args, log=None):
    """Builds the runner, loads --model entries, starts the server.
    Returns (grpc server, runner, bound port)."""
    runner = Runner(args, log)
    if args.allow_load_spec:
        runner.log("runner: --allow-load-spec: RepositoryModelLoad runs any spec a caller names (torchscript:PATH is code); "
                   "every client that reaches %s is trusted with the runner's user" % args.listen)
    for name, spec in args.models:
        try:
            runner.load(name, spec)
        except Abort as a:
            raise SystemExit("runner: --model %s=%s: %s" % (name, spec, a.msg))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.slots + 2),
                         options=[("grpc.max_receive_message_length", 1 << 30),
                                  ("grpc.max_send_message_length", 1 << 30)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(runner, server)
    port = server.add_insecure_port(args.listen)
    if port == 0:
        raise SystemExit("runner: cannot listen on %s" % args.listen)
    server.start()
    return server, runner, port


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # torch's own default can be 1 thread (Debian's build here), and with one
    # thread torch 1.13 runs 1x1 convolutions outside oneDNN, 20 times slower
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    if args.bench:
        if not args.models:
            raise SystemExit("runner: --bench needs --model NAME=SPEC")
        out = {"device": str(args.device), "torch": torch.__version__, "input": args.input, "size": args.size,
               "threads": torch.get_num_threads(), "models": {}}
        if args.device.startswith("cuda"):
            out["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
        for name, spec in args.models:
            e = engine.Engine(name, spec, args.device, args.input, args.size, args.max_batch, args.batches,
                              1, log=lambda m: print(m, file=sys.stderr, flush=True))
            out["models"][name] = {"spec": spec, "size": e.size, "gpu_bytes": e.gpu_bytes, "gpu_reserved_bytes": e.gpu_reserved,
                                   "batches": {str(b): v for b, v in e.bench(
                                       [b for b in args.batches if b <= args.max_batch], args.bench_iters).items()}}
            e.close()
        print(json.dumps(out, indent=1))
        return 0
    server, runner, port = serve(args)
    host = args.listen.rsplit(":", 1)[0]
    print("runner: listening on %s:%d (stubs: %s; %s)" % (host, port, PB_HOW,
          "CUDA graphs" if args.device.startswith("cuda") else "CPU eager, no CUDA graphs"), file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1 if args.stats else 3600):
        if args.stats:
            write_stats(runner, args.stats)
    print("runner: stopping (5 s grace for requests in flight)", file=sys.stderr, flush=True)
    server.stop(5).wait()
    if args.stats:
        write_stats(runner, args.stats)  # the requests of the grace period too
    runner.close()
    return 0


def write_stats(runner, path):
    """--stats: a file that cannot be written is said, not fatal."""
    try:
        runner.write_stats(path)
    except OSError as e:
        print("runner: --stats %s: %s" % (path, e), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
