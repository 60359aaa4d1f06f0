"""Graph capture and replay on npu, with torch.cuda's graph API shape.

``torch.npu.NPUGraph``, ``torch.npu.graph(g, pool=None, stream=None)``,
``torch.npu.graph_pool_handle()``, ``torch.npu.is_current_stream_capturing()``
and ``torch.npu.make_graphed_callables``; ``torch.accelerator.Graph`` reaches
the same C++ graph through PyTorch's GraphImplInterface.

While a thread captures (Note [Capture records instead of running],
device_sim/graph_capture.h) its plugin kernel launches and device-to-device
copies are recorded with their arguments, not run; its allocations come from
the graph's private pool, so every tensor made inside the capture is a static
buffer whose memory the graph keeps until ``reset()``. ``replay()`` runs the
records again on the current stream: update the static inputs in place
(``static_x.copy_(x)``) before it, read the static outputs after it. Host
copies, synchronize, ``.item()``, CPU fallbacks and ops whose output shape
depends on the data raise inside a capture, naming the op; the error ends the
capture (the graph is invalid, ``reset()`` it to capture again).

``graphed_callable(fn, example_inputs)`` is what ``mode="reduce-overhead"`` of
the compile backend uses.

Note [Graphed callables]
A replay reads and writes the addresses of the capture, so a graphed callable
must make a call look like a normal one: inputs it cannot capture in place
are copied into static buffers and, where the graph writes them (a KV cache,
BatchNorm statistics, AOTAutograd's input mutations), copied back after the
replay; parameters and buffers are captured in place (their addresses are
stable; a new address captures again); outputs keep the aliasing they had in
the capture (an input returned is the caller's tensor; outputs sharing a
storage share one fresh copy of it); and each distinct set of input shapes
and non-tensor values (automatic dynamic shapes pass the batch size as a
SymInt) gets a capture of its own, as CUDA graph trees record one per shape.
"""

import gc

import torch

from . import _C

__all__ = [
    "NPUGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "graphed_callable",
]


def graph_pool_handle():
    """An opaque id of a private memory pool that graphs may share
    (``torch.npu.graph(g, pool=handle)``), as torch.cuda.graph_pool_handle."""
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """True while the calling thread captures a graph on the current npu."""
    return _C._is_current_stream_capturing()


class NPUGraph(_C._NPUGraph):
    """One captured graph (torch.cuda.CUDAGraph's shape).

    ``capture_begin(pool=None, capture_error_mode="thread_local")`` records the
    calling thread's npu work on the current device until ``capture_end()``;
    ``replay()`` runs it again; ``reset()`` drops the records and lets go of
    the pool; ``pool()`` is the pool's id, to share with another graph.
    capture_error_mode: "thread_local" (default: only the capturing thread is
    affected), "global" (other threads' synchronize and host copies on the
    device raise during the capture), "relaxed" (the capturing thread may
    synchronize).
    """

    def capture_begin(self, pool=None, capture_error_mode="thread_local"):
        super().capture_begin(tuple(pool) if pool is not None else (0, 0), capture_error_mode)

    def debug_dump(self, path):
        super().debug_dump(str(path))


class graph:
    """Context manager that captures the work of its body into ``npu_graph``,
    as torch.cuda.graph: on a side stream (``stream``, or a new one) that
    waits for the current stream first, after a gc.collect() and a
    synchronize so no earlier work or freed memory crosses into the capture.

    An exception in the body (a forbidden op, say) ends the capture: the
    graph is left invalid (``reset()`` it), and the exception propagates.
    """

    default_capture_stream = None

    def __init__(self, npu_graph, pool=None, stream=None, capture_error_mode="thread_local"):
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"torch.npu.graph: expected an NPUGraph but found {type(npu_graph).__name__}")
        self.npu_graph = npu_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        if stream is None:
            if graph.default_capture_stream is None:
                graph.default_capture_stream = torch.npu.Stream()
            stream = graph.default_capture_stream
        self.capture_stream = stream
        self._stream_ctx = None

    def __enter__(self):
        if is_current_stream_capturing():
            # Before the synchronize below, which a capture forbids: its
            # error would be about synchronize, not about the nesting.
            raise RuntimeError(
                f"torch.npu.graph: captures cannot nest: this thread is already capturing a graph on "
                f"npu:{torch.npu.current_device()}; end that capture (leave its `with torch.npu.graph(...)`) "
                f"before beginning another")
        torch.npu.synchronize()
        gc.collect()
        self.capture_stream.wait_stream(torch.npu.current_stream())
        self._stream_ctx = torch.npu.stream(self.capture_stream)
        self._stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.npu_graph.capture_end()
            elif self.npu_graph.capturing():
                # An error outside npubridge's checks (a Python exception in
                # the body): end the capture here; the graph is invalid.
                self.npu_graph.reset()
        finally:
            self._stream_ctx.__exit__(None, None, None)
        return False


def _flat_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flat_tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _flat_tensors(o)]
    return []


def _map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _meta(x):
    """What a capture depends on in an input: a tensor's shape, strides,
    dtype and device; any other value itself (Note [Graphed callables]).
    None for a value that is not hashable (compared by equality instead)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), tuple(x.stride()), x.dtype, str(x.device))
    try:
        hash(x)
    except TypeError:
        return None
    return ("value", type(x).__name__, x)


class _Recapture(Exception):
    """An input captured in place came at another address: capture again."""


def _storage_key(t):
    return (t.device, t.untyped_storage().data_ptr())


class _Capture:
    """fn captured once for one set of input metas (Note [Graphed callables])."""

    def __init__(self, fn, args, in_place, mutated, pool, warmup):
        self.in_place = set(i for i in in_place if isinstance(args[i], torch.Tensor))
        self.static_inputs = [
            (x if i in self.in_place else x.detach().clone()) if isinstance(x, torch.Tensor) else x
            for i, x in enumerate(args)
        ]
        side = torch.npu.Stream()
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side), torch.no_grad():
            for _ in range(warmup):  # eager once: lazy initialisation, caches, autotuning stay out
                # on copies: the warm-up must not apply the graph's input mutations to the caller's tensors
                fn(*[x.detach().clone() if isinstance(x, torch.Tensor) else x for x in self.static_inputs])
        torch.npu.current_stream().wait_stream(side)
        versions = [x._version if isinstance(x, torch.Tensor) else None for x in self.static_inputs]
        self.graph = NPUGraph()
        with torch.no_grad(), graph(self.graph, pool=pool):
            self.static_outputs = fn(*self.static_inputs)
        # Inputs the graph writes: ATen's in-place ops bump the version
        # counter at capture; the compile backend names the rest (`mutated`).
        self.copy_back = [
            i for i, x in enumerate(self.static_inputs)
            if isinstance(x, torch.Tensor) and i not in self.in_place
            and (i in mutated or x._version != versions[i])
        ]
        self._plan_outputs()

    def _plan_outputs(self):
        """How each static output becomes the caller's: an input itself (or
        a view of it), or a view of a fresh copy of its storage, one copy per
        storage, so outputs that alias each other keep aliasing."""
        inputs = {}
        for i, x in enumerate(self.static_inputs):
            if isinstance(x, torch.Tensor):
                inputs.setdefault(_storage_key(x), i)
        self.out_plan = {}
        for t in _flat_tensors(self.static_outputs):
            key = _storage_key(t)
            if key in inputs:
                i = inputs[key]
                x = self.static_inputs[i]
                same = t is x or (t.shape == x.shape and t.stride() == x.stride()
                                  and t.storage_offset() == x.storage_offset())
                self.out_plan[id(t)] = ("input", i, same, t.storage_offset() - x.storage_offset())
            else:
                self.out_plan[id(t)] = ("storage", key, None, None)

    def run(self, args):
        for i, (static, new) in enumerate(zip(self.static_inputs, args)):
            if not isinstance(static, torch.Tensor):
                continue
            if i in self.in_place:
                if new is not static and (new.data_ptr() != static.data_ptr() or new.stride() != static.stride()):
                    raise _Recapture(i)
            elif new.data_ptr() != static.data_ptr() or new.stride() != static.stride():
                static.copy_(new)
        self.graph.replay()
        for i in self.copy_back:
            if args[i].data_ptr() != self.static_inputs[i].data_ptr():
                args[i].copy_(self.static_inputs[i])
        copies = {}

        def out(t):
            kind, key, same, offset = self.out_plan[id(t)]
            if kind == "input":
                new = args[key]
                if same:
                    return new
                if new.stride() == self.static_inputs[key].stride():
                    return new.as_strided(t.shape, t.stride(), new.storage_offset() + offset)
                return t.clone()  # strides differ from the capture's: no equivalent view
            if key not in copies:
                src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
                copies[key] = src.clone().untyped_storage()
            return torch.empty(0, dtype=t.dtype, device=t.device).set_(
                copies[key], t.storage_offset(), t.shape, t.stride())

        return _map_tensors(self.static_outputs, out)

    def reset(self):
        self.graph.reset()


class _GraphedCallable:
    """fn captured per distinct input metas (see graphed_callable)."""

    def __init__(self, fn, example_inputs, pool=None, warmup=1, in_place=(), mutated=()):
        self.fn, self.pool, self.warmup = fn, pool, warmup
        self.in_place, self.mutated = set(in_place), set(mutated)
        self.num_inputs = len(example_inputs)
        self.captures = {}  # input metas -> _Capture
        self._capture(list(example_inputs))

    def _key(self, args):
        return tuple(_meta(x) for x in args)

    def _capture(self, args):
        c = _Capture(self.fn, args, self.in_place, self.mutated, self.pool, self.warmup)
        key = self._key(args)
        if None not in key:
            self.captures[key] = c
        self.last = c
        return c

    # The first capture's buffers, as before (tests, the decode replay).
    @property
    def graph(self):
        return self.last.graph

    @property
    def static_inputs(self):
        return self.last.static_inputs

    @property
    def static_outputs(self):
        return self.last.static_outputs

    def __call__(self, *args):
        if len(args) != self.num_inputs:
            raise TypeError(f"graphed callable: expected {self.num_inputs} inputs but found {len(args)}")
        args = list(args)
        key = self._key(args)
        c = self.captures.get(key) if None not in key else None
        if c is None and None in key and all(
                isinstance(a, torch.Tensor) == isinstance(b, torch.Tensor)
                and (_meta(a) == _meta(b) if isinstance(a, torch.Tensor) else (a is b or a == b))
                for a, b in zip(args, self.last.static_inputs)):
            c = self.last
        if c is None:
            c = self._capture(args)  # a new shape or value: capture once more (cached)
        try:
            return c.run(args)
        except _Recapture as moved:
            # An input captured in place came at another address (a replaced
            # parameter): from now on it is copied into a static buffer.
            self.in_place.discard(moved.args[0])
            for old in self.captures.values():
                old.reset()
            self.captures.clear()
            return self._capture(args).run(args)


def graphed_callable(fn, example_inputs, pool=None, in_place=(), mutated=()):
    """Captures ``fn(*example_inputs)`` into an NPUGraph and returns a callable
    that replays it (Note [Graphed callables]). ``fn`` runs once eagerly
    (warm-up, on copies) and once under capture; tensor inputs are captured on
    static copies, except those whose index is in ``in_place`` (parameters,
    buffers: tensors whose address stays the same), which are captured on the
    caller's tensor itself and never copied; an in-place input that later
    comes at another address makes the callable capture again with a copy.
    Each call copies the other tensor inputs into the static buffers,
    replays, copies back the inputs the graph writes (found from the version
    counters at capture, plus the indices in ``mutated``), and returns the
    outputs: an output that is an input (or a view of one) is the caller's
    tensor (or the same view of it); the others are views of fresh copies of
    the static outputs' storage, one copy per storage, so outputs that alias
    each other still do. A call with other shapes, strides, dtypes or devices,
    or other non-tensor values (a SymInt batch size), is captured once more
    and cached by those. For inference: the graph runs under no_grad. The
    object keeps ``.graph``, ``.static_inputs`` and ``.static_outputs`` of the
    last capture."""
    return _GraphedCallable(fn, example_inputs, pool=pool, in_place=in_place, mutated=mutated)


def make_graphed_callables(callables, sample_args, pool=None):
    """Inference form of torch.cuda.make_graphed_callables: each callable
    (a function or a module) captured on its sample args, sharing one pool;
    returns graphed callables (a tuple for a tuple, one for one). Autograd
    through the graphs is not supported (the graphs run under no_grad)."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    shared = pool if pool is not None else graph_pool_handle()
    out = tuple(_GraphedCallable(c, args, pool=shared) for c, args in zip(callables, sample_args))
    return out[0] if single else out

