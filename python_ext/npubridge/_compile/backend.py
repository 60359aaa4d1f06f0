"""The Dynamo backend "npu": Dynamo graph -> pre-dispatch ATen graph ->
fusion rewrite -> AOTAutograd (forward/backward split) -> npubridge's
lowering of each graph to plugin kernels.

Note [What runs where]: Dynamo captures the Python-level graph and guards it
(a new shape fails a guard and comes back here: a recompile); code it
cannot capture runs eagerly between graphs (a graph break, counted by
Dynamo). AOTAutograd traces forward and backward to ATen graphs and
partitions them; ``min_cut_rematerialization_partition`` chooses what the
forward saves for the backward by a min cut, recomputing cheap ops instead
of saving their outputs, which lowers the training step's peak memory. Each
of those graphs goes to ``npubridge._compile.lowering.lower`` (resolved
kernels, planned memory, the C++ loop); a node it cannot serve on a plugin
kernel runs through PyTorch's own implementation there and is reported.

Note [A failed stage compiles less, never wrongly]: when the pre-dispatch
trace or the rewrite raises, the graph is compiled without patterns (the
reason is in the report); the backend never returns a graph it has not
checked, and never swallows an error of the model itself.
"""
import sys
import time

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters

from . import patterns as _patterns
from . import predispatch
from . import specialize as _specialize

_DEFAULTS = {"patterns": True, "partition": "min_cut"}
# torch.compile's modes; only reduce-overhead changes anything here (the
# autotuning ones are Inductor's).
_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class GraphRecord:
    """What the backend did with one Dynamo graph (one entry of compile_report)."""

    def __init__(self, index, dynamo_gm, example_inputs):
        self.index = index
        self.dynamo_nodes = sum(1 for n in dynamo_gm.graph.nodes if n.op == "call_function"
                                or n.op == "call_method" or n.op == "call_module")
        self.input_shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in example_inputs]
        self.patterns = {"fired": {}, "skipped": {}}
        self.predispatch_error = None
        self.compiled = {}  # "forward" | "backward" | "inference" -> lowering's Compiled
        self.reduce_overhead = None  # why CUDA-graph-style replay is (not) used
        self.compile_seconds = 0.0
        self.graph_breaks = {}
        self.specialised = False  # compiled at a call, for its concrete inputs (specialize.py)


def _find_owner():
    """The object torch.compile made for this model's backend (its
    _TorchCompileWrapper, which wraps npubridge.compile's NpuBackend too):
    records are kept on it so that compile_report(model) finds them."""
    frame, found = sys._getframe(1), None
    while frame is not None:
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "_TorchCompileWrapper":
            return owner
        if found is None and isinstance(owner, NpuBackend):
            found = owner
        frame = frame.f_back
    return found


_orphans = []  # records of a backend called outside torch.compile (directly, tests)


def _records_of(owner):
    if owner is None:
        return _orphans
    if not hasattr(owner, "_npu_records"):
        owner._npu_records = []
    return owner._npu_records


class PythonProgram:
    """Stand-in for lowering.lower where this build has none: runs the ATen
    graph through FX's Python interpreter (each node an eager npu op)."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *args):
        return self.gm(*args)

    def summary(self):
        nodes = [{"name": n.name, "target": str(n.target), "kind": "eager", "plugin": None, "kernel_op": None,
                  "dtype_conversion": None, "reason": "no lowering in this build: the node runs as an eager op"}
                 for n in self.gm.graph.nodes if n.op == "call_function"]
        return {"nodes": nodes, "fallbacks": 0, "planned_bytes": None, "live_peak_bytes": None,
                "intermediates_bytes": None, "output_bytes": None}


def _lower(gm, example_inputs):
    try:
        from . import lowering
    except ImportError:
        return PythonProgram(gm)
    return lowering.lower(gm, example_inputs)


def _graph_compiler(record, kind, mode):
    def compile_graph(gm, example_inputs):
        start = time.perf_counter()
        compiled = _lower(gm, example_inputs)
        record.compiled[kind] = compiled
        if mode == "reduce-overhead":
            compiled = _maybe_graphed(record, kind, compiled, _written_inputs(gm))
        record.compile_seconds += time.perf_counter() - start
        return _boxed(compiled)

    return compile_graph


def _boxed(fn):
    """AOTAutograd's calling convention: one list of arguments (so that its
    runtime can release the inputs it owns as soon as the graph read them)."""
    if getattr(fn, "_boxed_call", False):
        return fn
    boxed = getattr(fn, "boxed", None)  # lowering's Compiled: empties the list

    def run(args):
        return boxed(args) if boxed is not None else fn(*args)

    run._boxed_call = True
    run.program = fn
    return run


def _written_inputs(gm):
    """Indices of the graph inputs that an op of gm writes, directly or
    through a view (AOTAutograd's kept input mutations: copy_ into the
    input): graphed_callable copies them back to the caller's tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    root = {n: i for i, n in enumerate(placeholders)}
    written = set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None:
            continue
        for a, v in zip(schema.arguments, n.args):
            if a.alias_info is not None and isinstance(v, torch.fx.Node) and v in root:
                if a.alias_info.is_write:
                    written.add(root[v])
                elif any(r.alias_info is not None for r in schema.returns):
                    root[n] = root[v]  # a view of the input
    return written


def _maybe_graphed(record, kind, compiled, written):
    if kind != "inference":
        record.reduce_overhead = "not used: training graphs run the normal program (replay is for inference)"
        return compiled
    try:
        from .. import _graphs
    except ImportError:
        _graphs = None
    if _graphs is None or not hasattr(_graphs, "graphed_callable"):
        record.reduce_overhead = "not used: this build has no npubridge._graphs.graphed_callable"
        return compiled
    record.reduce_overhead = "replayed (npubridge._graphs.graphed_callable)"
    return _Replayed(compiled, _graphs.graphed_callable, record, written)


def _first_line(err):
    """The first line of an error's message, or of its cause's (the C++
    loop re-raises a kernel's error as the cause of an empty one)."""
    while err is not None and not str(err).strip():
        err = err.__cause__ or err.__context__
    return str(err).strip().splitlines()[0] if err is not None else "(no message)"


class _Replayed:
    """An inference graph replayed as a captured NPU graph. The first call
    runs the normal program (the compiler's example inputs are fake tensors,
    and capturing needs real static buffers) and notes the inputs'
    addresses; the second captures, in place on the inputs whose address
    did not change (parameters, buffers), on static copies of the others
    (Note [Graphed callables], npubridge/_graphs.py)."""

    def __init__(self, compiled, graphed_callable, record, written=()):
        self.compiled, self._graphed_callable, self.record = compiled, graphed_callable, record
        self.written = set(written)
        self.graphed = None
        self.first_ptrs = None

    def __call__(self, *args):
        if self.graphed is None and self.first_ptrs is None:
            self.first_ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
            return self.compiled(*args)
        if self.graphed is None:
            stable = [i for i, a in enumerate(args)
                      if isinstance(a, torch.Tensor) and a.data_ptr() == self.first_ptrs[i]]
            try:
                self.graphed = self._graphed_callable(self.compiled, list(args), in_place=stable,
                                                      mutated=self.written)
            except Exception as err:  # noqa: BLE001 - a graph that cannot be captured runs as the program
                # (a host fallback, a sync inside the graph ...: the capture names it)
                self.graphed = self.compiled
                self.record.reduce_overhead = f"not used: the capture failed: {_first_line(err)}"
        return self.graphed(*args)

    def summary(self):
        return self.compiled.summary()


def check_options(mode, options):
    """The options with their defaults; ValueError naming a bad one."""
    opts = dict(_DEFAULTS)
    opts.update(options or {})
    unknown = set(opts) - set(_DEFAULTS)
    if opts.get("partition") not in ("min_cut", "default"):
        raise ValueError(f"torch.compile(backend='npu'): expected options['partition'] to be 'min_cut' or "
                         f"'default' but found {opts.get('partition')!r}")
    if unknown:
        raise ValueError(f"torch.compile(backend='npu'): unknown option(s) {sorted(unknown)}; "
                         f"expected {sorted(_DEFAULTS)}")
    chosen = opts["patterns"]
    if not isinstance(chosen, bool):
        if isinstance(chosen, str) or not all(isinstance(n, str) for n in chosen):
            raise ValueError(f"torch.compile(backend='npu'): expected options['patterns'] to be True, False or a "
                             f"list of pattern names but found {chosen!r}")
        known = {p["name"] for p in _patterns.all_patterns()}
        if set(chosen) - known:
            raise ValueError(f"torch.compile(backend='npu'): unknown pattern(s) {sorted(set(chosen) - known)} in "
                             f"options['patterns']; the patterns are {sorted(known)}")
    if mode not in _MODES:
        raise ValueError(f"torch.compile(backend='npu'): expected mode to be one of {sorted(m for m in _MODES if m)} "
                         f"or None but found {mode!r}")
    return opts


def npu_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **kwargs):
    """The backend torch.compile calls with each Dynamo graph."""
    opts = check_options(mode, {**(options or {}), **kwargs})
    # The plugin ops and the pattern table exist once the runtime started
    # (Note [The runtime starts at the first npu use]); Dynamo may trace
    # before any npu tensor exists (fake inputs).
    torch.npu._lazy_init()
    records = _records_of(_find_owner())
    def again(g, inputs):
        return _compile_static(g, inputs, opts, mode, records, specialised=True)

    if _specialize.is_symbolic(example_inputs):  # Note [Dynamic graphs are compiled per concrete shape]
        return _specialize.PerShape(gm, again)
    under = _specialize.settings()
    first = _compile_static(gm, example_inputs, opts, mode, records)
    return _specialize.PerShape(gm, again, first, under)  # Note [A settings change recompiles]


def _compile_static(gm, example_inputs, opts, mode, records, specialised=False):
    """The pipeline of one static-shape graph: pre-dispatch trace, patterns,
    AOTAutograd (partition), lowering of each of its graphs."""
    record = GraphRecord(len(records), gm, example_inputs)
    record.specialised = specialised
    records.append(record)
    start = time.perf_counter()
    target = gm
    if opts["patterns"] is not False:
        try:
            traced = predispatch.trace(gm, example_inputs)
            traced.meta.update(gm.meta)
            record.patterns = _patterns.rewrite(traced, opts["patterns"], [
                isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs])
            target = traced
        except Exception as err:  # noqa: BLE001 - Note [A failed stage compiles less, never wrongly]
            record.predispatch_error = f"{type(err).__name__}: {_first_line(err)}"
    record.graph_breaks = dict(counters["graph_break"])
    record.compile_seconds += time.perf_counter() - start
    partition = {}
    if opts["partition"] == "min_cut":
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        partition["partition_fn"] = min_cut_rematerialization_partition
    aot = aot_autograd(fw_compiler=_graph_compiler(record, "forward", mode),
                       bw_compiler=_graph_compiler(record, "backward", mode),
                       inference_compiler=_graph_compiler(record, "inference", mode),
                       keep_inference_input_mutations=True, **partition)
    start = time.perf_counter()
    compiled = aot(target, example_inputs)
    record.compile_seconds += time.perf_counter() - start
    return compiled


class NpuBackend:
    """The backend object of one ``npubridge.compile`` call (holds its records)."""

    def __init__(self, mode=None, options=None):
        check_options(mode, options)  # at npubridge.compile, not at the first call
        self.mode, self.options = mode, dict(options or {})
        self._npu_records = []

    def __call__(self, gm, example_inputs):
        return npu_backend(gm, example_inputs, mode=self.mode, options=self.options)
