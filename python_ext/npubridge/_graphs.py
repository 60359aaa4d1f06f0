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


class _GraphedCallable:
    """fn captured once on static copies of its tensor inputs (see
    graphed_callable)."""

    def __init__(self, fn, example_inputs, pool=None, warmup=1):
        self.fn = fn
        self.example_inputs = list(example_inputs)
        self.static_inputs = [
            x.detach().clone() if isinstance(x, torch.Tensor) else x for x in self.example_inputs
        ]
        side = torch.npu.Stream()
        side.wait_stream(torch.npu.current_stream())
        with torch.npu.stream(side), torch.no_grad():
            for _ in range(warmup):  # eager once: lazy initialisation, caches, autotuning stay out
                fn(*self.static_inputs)
        torch.npu.current_stream().wait_stream(side)
        self.graph = NPUGraph()
        with torch.no_grad(), graph(self.graph, pool=pool):
            self.static_outputs = fn(*self.static_inputs)

    def __call__(self, *args):
        if len(args) != len(self.static_inputs):
            raise TypeError(
                f"graphed callable: expected {len(self.static_inputs)} inputs but found {len(args)}"
            )
        for i, (static, new) in enumerate(zip(self.static_inputs, args)):
            if isinstance(static, torch.Tensor):
                if not isinstance(new, torch.Tensor):
                    raise TypeError(f"graphed callable: input {i} was a tensor at capture, found {type(new).__name__}")
                if new.shape != static.shape or new.dtype != static.dtype or new.device != static.device:
                    raise ValueError(
                        f"graphed callable: input {i} was captured as {tuple(static.shape)} {static.dtype} on "
                        f"{static.device} but found {tuple(new.shape)} {new.dtype} on {new.device}"
                    )
                if new.data_ptr() != static.data_ptr():
                    static.copy_(new)
            elif static is not new and static != new:
                raise ValueError(f"graphed callable: non-tensor input {i} was {static!r} at capture, found {new!r}")
        self.graph.replay()
        return _map_tensors(self.static_outputs, lambda t: t.clone())


def graphed_callable(fn, example_inputs, pool=None):
    """Captures ``fn(*example_inputs)`` into an NPUGraph and returns a callable
    that replays it: ``fn`` runs once eagerly (warm-up) on static copies of
    the inputs, then once under capture; each later call copies its tensor
    inputs into the static buffers (same shapes, dtypes and devices as the
    examples, else ValueError; non-tensor inputs must equal the examples'),
    replays, and returns CLONES of the static outputs (a later replay
    overwrites the static outputs, so the caller's results stay its own).
    For inference (no autograd is recorded): the graph runs under no_grad.
    The returned object keeps ``.graph``, ``.static_inputs`` and
    ``.static_outputs``."""
    return _GraphedCallable(fn, example_inputs, pool=pool)


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

