"""compile_report: what the npu backend made of a compiled model, per graph.

For each Dynamo graph: its inputs' shapes (one entry per recompile), the
fusion patterns that fired and those skipped with why, and for each of its
AOTAutograd graphs (inference, or forward and backward) the nodes and the
kernels they resolved to, fallbacks with reasons (an unlowered graph's
nodes are not fallbacks: they run as eager npu ops, reported as
"unlowered"), and the planned arena bytes with the live-set
peak (its lower bound, not an eager figure), from the lowering's
``Compiled.summary()``; then the graph breaks Dynamo counted in this
model's frames, with their reasons (Note [Graph breaks per compiled model]).
"""
import collections
import sys
import threading

import torch
from torch._dynamo.eval_frame import _TorchDynamoContext, innermost_backend
from torch._dynamo.utils import counters

from . import backend as _backend

_ACCEPTS = "a model or function returned by torch.compile(..., backend='npu') or npubridge.compile"


def _dynamo_ctx(model):
    """The Dynamo context torch.compile wrapped `model` in: an
    OptimizedModule's dynamo_ctx, or, for a compiled function, the context
    its wrapper closes over."""
    ctx = getattr(model, "dynamo_ctx", None) or getattr(getattr(model, "forward", None), "dynamo_ctx", None)
    if ctx is None and hasattr(model, "_torchdynamo_orig_callable"):
        for cell in getattr(model, "__closure__", None) or ():
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(v, _TorchDynamoContext):
                return v
    return ctx


def _is_npu(owner):
    return isinstance(owner, _backend.NpuBackend) or hasattr(owner, "_npu_records") or \
        getattr(owner, "compiler_fn", None) is _backend.npu_backend or \
        isinstance(getattr(owner, "compiler_fn", None), _backend.NpuBackend)


def _owner(model):
    """The object the backend keeps `model`'s records on (see
    backend._find_owner); TypeError naming what is accepted otherwise."""
    if isinstance(model, _backend.NpuBackend):
        return model
    ctx = _dynamo_ctx(model)
    if ctx is None:
        raise TypeError(f"compile_report(): expected {_ACCEPTS} but found {type(model).__name__}")
    owner = innermost_backend(ctx.callback)
    if not _is_npu(owner):
        name = getattr(owner, "compiler_name", None) or getattr(owner, "__name__", None) or type(owner).__name__
        raise TypeError(f"compile_report(): expected {_ACCEPTS} but found one compiled with backend {name!r}")
    return owner


def _records(model):
    if model is None:
        return _backend._orphans
    return getattr(_owner(model), "_npu_records", [])


# Note [Graph breaks per compiled model]: Dynamo counts graph breaks per
# process (counters["graph_break"]). Around each frame Dynamo compiles, the
# counters are read at its start and end (Dynamo's compile callbacks); the
# breaks counted in between are that frame's, and go to the owner of the
# frame's backend (the convert-frame callback on the stack), an npu one's
# only. Frames of a model whose partial graph is empty (a break first thing
# in a resumed frame) are counted too: the owner comes from the frame's
# callback, not from a backend call.
_local = threading.local()


def _frame_owner():
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "_torchdynamo_orig_backend"):
            return innermost_backend(owner)
        frame = frame.f_back
    return None


def _on_compile_start(args):
    _local.start = collections.Counter(counters["graph_break"])


def _on_compile_end(args):
    start = getattr(_local, "start", None)
    _local.start = None
    if start is None or args.callback_trigger != torch._dynamo.callback.CallbackTrigger.DYNAMO:
        return
    new = collections.Counter(counters["graph_break"])
    new.subtract(start)
    new = {k: v for k, v in new.items() if v > 0}
    if not new:
        return
    owner = _frame_owner()
    if owner is None or not _is_npu(owner):
        return
    if not hasattr(owner, "_npu_graph_breaks"):
        owner._npu_graph_breaks = collections.Counter()
    owner._npu_graph_breaks.update(new)


class _Kept(list):
    """A callback list whose clear() keeps ours: torch._dynamo.reset()
    clears every compile callback (callback_handler.clear()), and a model
    compiled after a reset must still have its breaks counted."""

    def clear(self):
        kept = [f for f in self if f in (_on_compile_start, _on_compile_end)]
        super().clear()
        self.extend(kept)


def _install():
    h = torch._dynamo.callback_handler
    for attr, fn in (("start_callbacks", _on_compile_start), ("end_callbacks", _on_compile_end)):
        lst = getattr(h, attr)
        if not isinstance(lst, _Kept):
            lst = _Kept(lst)
            setattr(h, attr, lst)
        if fn not in lst:
            lst.append(fn)


_install()


def _graph_part(compiled):
    summary = compiled.summary() if hasattr(compiled, "summary") else {}
    nodes = summary.get("nodes", [])
    kinds, kernels, fallbacks = {}, {}, []
    for n in nodes:
        kinds[n["kind"]] = kinds.get(n["kind"], 0) + 1
        if n["kind"] == "kernel":
            key = f"{n.get('plugin')}: {n.get('kernel_op')}"
            kernels[key] = kernels.get(key, 0) + 1
        elif n["kind"] == "fallback":
            fallbacks.append({"node": n["name"], "target": n["target"], "reason": n.get("reason")})
    return {"nodes": len(nodes), "kinds": kinds, "kernels": kernels, "fallbacks": fallbacks,
            "lowered": summary.get("lowered"), "not_lowered_reason": summary.get("reason"),
            "planned_bytes": summary.get("planned_bytes"), "live_peak_bytes": summary.get("live_peak_bytes"),
            "summary": summary}


def report_dict(model):
    graphs = []
    for rec in _records(model):
        graphs.append({"index": rec.index, "input_shapes": rec.input_shapes, "dynamo_nodes": rec.dynamo_nodes,
                       "specialised": getattr(rec, "specialised", False),
                       "patterns_fired": dict(rec.patterns["fired"]),
                       "patterns_skipped": {k: dict(v) for k, v in rec.patterns["skipped"].items()},
                       "predispatch_error": rec.predispatch_error, "reduce_overhead": rec.reduce_overhead,
                       "compile_seconds": rec.compile_seconds,
                       "parts": {kind: _graph_part(c) for kind, c in rec.compiled.items()}})
    breaks = {} if model is None else dict(getattr(_owner(model), "_npu_graph_breaks", {}))
    fired = {}
    for g in graphs:
        for k, v in g["patterns_fired"].items():
            fired[k] = fired.get(k, 0) + v
    return {"graphs": graphs, "patterns_fired": fired, "graph_breaks": breaks,
            "fallbacks": sum(len(p["fallbacks"]) for g in graphs for p in g["parts"].values()),
            "unlowered_nodes": sum(p["nodes"] for g in graphs for p in g["parts"].values()
                                   if p["lowered"] is False)}


def _bytes(n):
    return "-" if n is None else f"{n / 1024:.1f} KiB"


def format_report(d):
    lines = [f"npu compile report: {len(d['graphs'])} graph(s), patterns fired "
             f"{d['patterns_fired'] or 'none'}, {d['fallbacks']} fallback node(s)"
             + (f", {d['unlowered_nodes']} node(s) in unlowered graphs" if d["unlowered_nodes"] else "")]
    for g in d["graphs"]:
        lines.append(f"graph {g['index']}: inputs {g['input_shapes']}  ({g['dynamo_nodes']} Dynamo nodes, "
                     f"compiled in {g['compile_seconds']:.2f} s)")
        if g.get("specialised"):
            lines.append("  compiled at a call for its concrete inputs (a dynamic Dynamo graph, or new settings)")
        if g["predispatch_error"]:
            lines.append(f"  patterns not applied: {g['predispatch_error']}")
        for name, n in g["patterns_fired"].items():
            lines.append(f"  pattern {name}: fired x{n}")
        for name, reasons in g["patterns_skipped"].items():
            for why, n in reasons.items():
                lines.append(f"  pattern {name}: skipped x{n}: {why}")
        if g["reduce_overhead"]:
            lines.append(f"  reduce-overhead: {g['reduce_overhead']}")
        for kind, p in g["parts"].items():
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(p["kinds"].items()))
            lines.append(f"  {kind}: {p['nodes']} nodes ({kinds}); planned {_bytes(p['planned_bytes'])} "
                         f"(live peak, the lower bound of any plan: {_bytes(p['live_peak_bytes'])})")
            if p["lowered"] is False:
                lines.append(f"    unlowered: {p['nodes']} nodes, {p['not_lowered_reason']} (the graph runs as "
                             f"the FX graph: each node an eager npu op)")
            for k, v in sorted(p["kernels"].items()):
                lines.append(f"    {k} x{v}")
            for f in p["fallbacks"] if p["lowered"] is not False else []:
                lines.append(f"    fallback {f['node']} ({f['target']}): {f['reason']}")
    if d["graph_breaks"]:
        lines.append("graph breaks (Dynamo, in this model's frames):")
        for why, n in d["graph_breaks"].items():
            lines.append(f"  x{n}: {why}")
    return "\n".join(lines)


class Report(dict):
    """compile_report's result: a dict that prints as text."""

    def __str__(self):
        return format_report(self)
