"""compile_report: what the npu backend made of a compiled model, per graph.

For each Dynamo graph: its inputs' shapes (one entry per recompile), the
fusion patterns that fired and those skipped with why, and for each of its
AOTAutograd graphs (inference, or forward and backward) the nodes and the
kernels they resolved to, fallbacks with reasons, and the planned arena
bytes with the live-set peak (its lower bound, not an eager figure), from
the lowering's ``Compiled.summary()``; then Dynamo's graph breaks with
their reasons.
"""
from torch._dynamo.eval_frame import innermost_backend

from . import backend as _backend


def _records(model):
    if model is None:
        return _backend._orphans
    if isinstance(model, _backend.NpuBackend):
        return model._npu_records
    ctx = getattr(model, "dynamo_ctx", None) or getattr(getattr(model, "forward", None), "dynamo_ctx", None)
    owner = innermost_backend(ctx.callback) if ctx is not None else None
    if owner is None or not hasattr(owner, "_npu_records"):
        if ctx is None:
            raise TypeError(f"compile_report(): expected a model returned by torch.compile(..., backend='npu') or "
                            f"npubridge.compile but found {type(model).__name__}")
        return []
    return owner._npu_records


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
    breaks = dict(graphs and _records(model)[-1].graph_breaks or {})
    fired = {}
    for g in graphs:
        for k, v in g["patterns_fired"].items():
            fired[k] = fired.get(k, 0) + v
    return {"graphs": graphs, "patterns_fired": fired, "graph_breaks": breaks,
            "fallbacks": sum(len(p["fallbacks"]) for g in graphs for p in g["parts"].values())}


def _bytes(n):
    return "-" if n is None else f"{n / 1024:.1f} KiB"


def format_report(d):
    lines = [f"npu compile report: {len(d['graphs'])} graph(s), patterns fired "
             f"{d['patterns_fired'] or 'none'}, {d['fallbacks']} fallback node(s)"]
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
                lines.append(f"    not lowered (runs as the FX graph): {p['not_lowered_reason']}")
            for k, v in sorted(p["kernels"].items()):
                lines.append(f"    {k} x{v}")
            for f in p["fallbacks"] if p["lowered"] is not False else []:
                lines.append(f"    fallback {f['node']} ({f['target']}): {f['reason']}")
    if d["graph_breaks"]:
        lines.append("graph breaks (Dynamo, this process):")
        for why, n in d["graph_breaks"].items():
            lines.append(f"  x{n}: {why}")
    return "\n".join(lines)


class Report(dict):
    """compile_report's result: a dict that prints as text."""

    def __str__(self):
        return format_report(self)
