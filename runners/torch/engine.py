"""Model engines: build a model from a spec, wrap its preprocessing, run batches.

A spec is "torchvision:NAME", "timm:NAME" or "torchscript:PATH". Weights are
always random (weights=None / pretrained=False): the runner never downloads.

On CUDA an Engine holds, per concurrency slot, a CUDA stream, pinned host
input/output buffers, a static device input and one CUDA graph per batch size
in `batches` (captured at load after a warm-up on a side stream); a batch of
n runs the smallest captured graph >= n, padded. On CPU it runs eagerly
(fp32, no graphs).
"""

import gc
import threading
import time
import warnings

import torch

# torch.frombuffer on a request's immutable bytes warns once that the buffer is
# not writable; the runner only reads such tensors.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# input layouts: wire datatype, torch dtype, element size
INPUTS = {
    "uint8-nhwc": ("UINT8", torch.uint8, 1),
    "fp16-nchw": ("FP16", torch.float16, 2),
    "fp32-nchw": ("FP32", torch.float32, 4),
}


class SpecError(ValueError):
    """A model spec that cannot be built (bad format, unknown name)."""


def build_module(spec):
    """Returns the nn.Module (random weights) that spec names."""
    kind, sep, name = spec.partition(":")
    if not sep or not name:
        raise SpecError("model spec %r: want torchvision:NAME, timm:NAME or torchscript:PATH" % spec)
    if kind == "torchvision":
        import torchvision.models as tvm
        get = getattr(tvm, "get_model", None)
        if get is not None:
            try:
                return get(name, weights=None)
            except ValueError as e:
                raise SpecError("model spec %r: torchvision has no model %r (%s)" % (spec, name, e))
        fn = getattr(tvm, name, None)
        if fn is None or not callable(fn) or name.startswith("_"):
            raise SpecError("model spec %r: torchvision has no model %r" % (spec, name))
        return fn(weights=None)
    if kind == "timm":
        try:
            import timm
        except ImportError as e:
            raise SpecError("model spec %r: timm is not installed (%s)" % (spec, e))
        try:
            return timm.create_model(name, pretrained=False)
        except RuntimeError as e:  # timm: Unknown model
            raise SpecError("model spec %r: %s" % (spec, e))
    if kind == "torchscript":
        try:
            return torch.jit.load(name, map_location="cpu")
        except (RuntimeError, ValueError, OSError) as e:
            raise SpecError("model spec %r: cannot load TorchScript file %r: %s" % (spec, name, e))
    raise SpecError("model spec %r: unknown format %r (torchvision, timm, torchscript)" % (spec, kind))


class Wrapped(torch.nn.Module):
    """The model behind the wire: input as it arrives, output float32 [b, K].

    uint8-nhwc: raw RGB pixels, scaled to [0,1] and normalised with the
    ImageNet mean/std here (so a worker sends pixels). fp16/fp32-nchw: passed
    as they come (the worker normalised them). The model computes in `dtype`
    (fp16 on CUDA); the output is cast to float32.
    """

    def __init__(self, model, layout, dtype, channels_last):
        super().__init__()
        self.model = model
        self.nhwc = layout == "uint8-nhwc"
        self.dtype = dtype
        self.channels_last = channels_last
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN, dtype=dtype).view(1, 3, 1, 1))
        self.register_buffer("inv_std", (1.0 / torch.tensor(IMAGENET_STD, dtype=torch.float32)).to(dtype).view(1, 3, 1, 1))

    def forward(self, x):
        if self.nhwc:
            # NHWC permuted to NCHW is channels_last in memory already
            x = x.permute(0, 3, 1, 2).to(self.dtype).mul(1.0 / 255.0)
            x = (x - self.mean) * self.inv_std
        else:
            x = x.to(self.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = self.model(x)
        if isinstance(y, (tuple, list)):
            y = y[0]
        return y.float().reshape(y.shape[0], -1)


def _typed(src, dtype):
    """The uint8 tensor src viewed as dtype; copied first when its offset is
    not a multiple of the element size (a shared memory offset may be odd)."""
    if dtype != torch.uint8 and src.storage_offset() % torch.tensor([], dtype=dtype).element_size():
        src = src.clone()
    return src.view(dtype)


def _capture(g, pool):
    """torch.cuda.graph, capturing this thread only where torch can
    (capture_error_mode, torch >= 2.1): a load may capture while other
    threads serve batches of other models on their streams."""
    try:
        return torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local")
    except TypeError:
        return torch.cuda.graph(g, pool=pool)


_side = {}  # device -> the warm-up stream every engine on it shares
_side_lock = threading.Lock()


def _side_stream(device):
    """The stream warm-ups run on before a graph capture, one per device for
    the process's life. cuBLAS (and cuBLASLt) keep a workspace per stream
    for as long as the process runs (32 MiB each on Hopper): a new stream
    for each load would keep that memory after every unload."""
    with _side_lock:
        s = _side.get(device)
        if s is None:
            s = _side[device] = torch.cuda.Stream(device)
        return s


def split_spec(spec):
    """SPEC[@SIZE] -> (SPEC, SIZE or None): a model's own input size beside
    the runner's --size (InceptionResNetV2 takes 299, ResNet-50 224)."""
    base, at, size = spec.rpartition("@")
    if at and base and size.isascii() and size.isdigit():
        if int(size) < 1:
            raise SpecError("model spec %r: size %s: want at least 1" % (spec, size))
        return base, int(size)
    return spec, None


class Slot:
    """One concurrency slot: stream, pinned buffers, static input, graphs."""

    def __init__(self, index):
        self.index = index
        self.stream = None
        self.h_in = None   # pinned uint8 [max_batch * item_bytes]
        self.h_out = None  # pinned float32 [max_batch, K]
        self.d_in = None   # device [max_graph, ...input shape]
        self.graphs = {}   # batch -> (CUDAGraph, static output)


class Engine:
    """One loaded model."""

    def __init__(self, name, spec, device, layout, size, max_batch, batches, slots, log=print):
        if layout not in INPUTS:
            raise SpecError("input layout %r: want one of %s" % (layout, ", ".join(sorted(INPUTS))))
        self.name = name
        self.spec = spec
        spec, own = split_spec(spec)
        size = own or size
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.layout = layout
        self.wire_dtype, self.in_dtype, self.in_elem = INPUTS[layout]
        self.size = size
        self.max_batch = max_batch
        if layout == "uint8-nhwc":
            self.item_shape = (size, size, 3)
        else:
            self.item_shape = (3, size, size)
        self.item_bytes = size * size * 3 * self.in_elem
        self.log = log
        self.gpu_bytes = 0        # memory_allocated delta over the load
        self.gpu_reserved = 0     # memory_reserved delta (graph pools included)
        self._cond = threading.Condition()
        self._inflight = 0
        self._closed = False

        t0 = time.perf_counter()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            alloc0 = torch.cuda.memory_allocated(self.device)
            res0 = torch.cuda.memory_reserved(self.device)
        if self.cuda:
            torch.backends.cudnn.benchmark = True  # fixed shapes: pick kernels once, at warm-up
        module = build_module(spec).eval()
        dtype = torch.float16 if self.cuda else torch.float32
        wrapped = Wrapped(module, layout, dtype, self.cuda)
        wrapped = wrapped.to(self.device)
        if self.cuda:
            wrapped = wrapped.to(dtype=dtype, memory_format=torch.channels_last)
        wrapped.eval()
        for p in wrapped.parameters():
            p.requires_grad_(False)
        self.model = wrapped
        with torch.inference_mode():
            probe = torch.zeros((1,) + self.item_shape, dtype=self.in_dtype, device=self.device)
            out = self.model(probe)
        self.classes = int(out.shape[1])

        if self.cuda:
            bs = sorted({b for b in batches if 1 <= b <= max_batch} | {max_batch})
            self.batches = bs
            self.slots = [self._make_slot(i, bs) for i in range(slots)]
            torch.cuda.synchronize(self.device)
            self.gpu_bytes = torch.cuda.memory_allocated(self.device) - alloc0
            self.gpu_reserved = torch.cuda.memory_reserved(self.device) - res0
        else:
            self.batches = []
            self.slots = [Slot(i) for i in range(slots)]
        self._free = list(range(slots))
        self.load_seconds = time.perf_counter() - t0
        log("model %s (%s): loaded on %s in %.1fs, input %s %s, output FP32 [-1, %d], %s, gpu_bytes=%d reserved=%d"
            % (name, spec, self.device, self.load_seconds, self.wire_dtype, list(self.shape(-1)), self.classes,
               "CUDA graphs for batches %s, %d slots" % (self.batches, slots) if self.cuda
               else "eager (CPU, no CUDA graphs)", self.gpu_bytes, self.gpu_reserved))

    # ---- shapes and description

    def shape(self, batch):
        return (batch,) + self.item_shape

    def describe(self):
        """key=value text for RepositoryIndex's reason and the logs."""
        mode = "graphs=" + ",".join(str(b) for b in self.batches) if self.cuda else "eager"
        return ("spec=%s device=%s input=%s max_batch=%d %s gpu_bytes=%d gpu_reserved_bytes=%d"
                % (self.spec, self.device, self.layout, self.max_batch, mode, self.gpu_bytes, self.gpu_reserved))

    # ---- CUDA set-up

    def _make_slot(self, i, bs):
        s = Slot(i)
        s.stream = torch.cuda.Stream(self.device)
        top = bs[-1]
        s.h_in = torch.empty(top * self.item_bytes, dtype=torch.uint8, pin_memory=True)
        s.h_out = torch.empty((top, self.classes), dtype=torch.float32, pin_memory=True)
        s.d_in = torch.zeros(self.shape(top), dtype=self.in_dtype, device=self.device)
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():  # no_grad, as torch's graph capture examples (outputs stay normal tensors)
            # warm-up on a side stream, as capture requires
            side = _side_stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for b in reversed(bs):
                    for _ in range(2):
                        self.model(s.d_in[:b])
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            # largest first: the shared pool then fits the smaller ones
            for b in reversed(bs):
                g = torch.cuda.CUDAGraph()
                with _capture(g, pool):
                    y = self.model(s.d_in[:b])
                s.graphs[b] = (g, y)
        return s

    def graph_batch(self, n):
        """The smallest captured batch >= n."""
        for b in self.batches:
            if b >= n:
                return b
        raise ValueError("batch %d is above the largest captured graph %d" % (n, self.batches[-1]))

    # ---- lifetime

    def acquire(self):
        """Takes a slot; returns its index, or None once the engine is closed."""
        with self._cond:
            while not self._free and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            self._inflight += 1
            return self._free.pop()

    def release(self, i):
        with self._cond:
            self._free.append(i)
            self._inflight -= 1
            self._cond.notify_all()

    def close(self, timeout=60.0):
        """Waits (bounded) for batches in flight, then drops the model and buffers."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            deadline = time.monotonic() + timeout
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            busy = self._inflight
        if busy:
            self.log("model %s: unloading with %d batches still in flight" % (self.name, busy))
            return
        self.slots = []
        self.model = None
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # ---- running

    def run(self, slot_index, src, n, out_view=None):
        """Runs n items. src: a uint8 CPU tensor of n*item_bytes (request bytes
        or a shared memory view). Returns float32 CPU tensor [n, K]; when
        out_view (uint8 CPU tensor of n*K*4 bytes) is given the result is
        written there, and the return value may be None."""
        if self.cuda:
            return self._run_cuda(self.slots[slot_index], src, n, out_view)
        with torch.inference_mode():
            y = self.model(_typed(src, self.in_dtype).view(self.shape(n)))
        if out_view is not None:
            out_view.copy_(y.contiguous().view(-1).view(torch.uint8))
        return y

    def _run_cuda(self, s, src, n, out_view):
        b = self.graph_batch(n)
        g, y = s.graphs[b]
        nbytes = n * self.item_bytes
        with torch.cuda.stream(s.stream):
            if src.is_pinned():
                host = src
            else:
                s.h_in[:nbytes].copy_(src)
                host = s.h_in[:nbytes]
            s.d_in[:n].copy_(_typed(host, self.in_dtype).view(self.shape(n)), non_blocking=True)
            g.replay()
            direct = out_view is not None and out_view.storage_offset() % 4 == 0 and out_view.is_pinned()
            if direct:  # D2H straight into the page-locked shared memory region
                out_view.view(torch.float32).view(n, self.classes).copy_(y[:n], non_blocking=True)
            else:
                s.h_out[:n].copy_(y[:n], non_blocking=True)
        s.stream.synchronize()
        if direct:
            return None
        if out_view is not None:
            out_view.copy_(s.h_out[:n].reshape(-1).view(torch.uint8))
        return s.h_out[:n].clone()

    # ---- benchmark

    def bench(self, batches, iters=20, warmup=5):
        """Per batch size: the median raw model time in ms without transfers
        (CUDA events around a graph replay on GPU, perf_counter around the
        eager call on CPU), and with_copies_median_ms, perf_counter around
        run() (host bytes in, float32 out: the copies and the sync included).
        Runs on slot 0: call it with no requests in flight."""
        res = {}
        for b in batches:
            times = []
            if self.cuda:
                s = self.slots[0]
                gb = self.graph_batch(b)
                g, _ = s.graphs[gb]
                with torch.cuda.stream(s.stream):
                    for _ in range(warmup):
                        g.replay()
                    for _ in range(iters):
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        e0.record(s.stream)
                        g.replay()
                        e1.record(s.stream)
                        e1.synchronize()
                        times.append(e0.elapsed_time(e1))
            else:
                x = torch.randint(0, 255, self.shape(b), dtype=torch.uint8).to(self.in_dtype)
                with torch.inference_mode():
                    for _ in range(warmup):
                        self.model(x)
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        self.model(x)
                        times.append((time.perf_counter() - t0) * 1e3)
            times.sort()
            med = times[len(times) // 2]
            # the runner's whole path for a request's bytes, protocol aside:
            # (on CUDA) copy into the pinned buffer, H2D, replay, D2H, sync
            src = torch.randint(0, 255, (b * self.item_bytes,), dtype=torch.uint8)
            if self.in_dtype != torch.uint8:
                src = torch.rand(self.shape(b)).to(self.in_dtype).reshape(-1).view(torch.uint8)
            for _ in range(warmup):
                self.run(0, src, b)
            e2e = []
            for _ in range(iters):
                t0 = time.perf_counter()
                self.run(0, src, b)
                e2e.append((time.perf_counter() - t0) * 1e3)
            e2e.sort()
            res[b] = {"median_ms": round(med, 4), "min_ms": round(times[0], 4),
                      "items_per_s": round(b / med * 1e3, 1),
                      "graph_batch": self.graph_batch(b) if self.cuda else b,
                      "with_copies_median_ms": round(e2e[len(e2e) // 2], 4)}
        return res
