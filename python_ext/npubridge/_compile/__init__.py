"""Graph mode: ``torch.compile(model, backend="npu")`` and its report.

backend.py (Dynamo backend, AOTAutograd wiring), predispatch.py (the ATen
graph patterns match on), patterns.py (matcher and rewrite), report.py
(compile_report); lowering.py and memory_plan.py turn each ATen graph into
the program the C++ loop runs.
"""
import torch

from . import backend as _backend
from . import patterns as _patterns
from . import report as _report


def compile(model, *, mode=None, options=None, dynamic=False, fullgraph=False):  # noqa: A001 - torch.compile's name
    """``torch.compile(model, backend="npu")``: Dynamo captures, AOTAutograd
    splits forward and backward, npubridge rewrites fusion patterns and runs
    each graph on plugin kernels.

    ``options``: {"patterns": True | False | [names], "partition":
    "min_cut" | "default"}. ``mode="reduce-overhead"`` replays inference
    graphs as captured NPU graphs where the build has them. Static shapes by
    default (``dynamic=False``): a new shape recompiles through Dynamo's guards."""
    return torch.compile(model, backend=_backend.NpuBackend(mode, options), dynamic=dynamic, fullgraph=fullgraph)


def compile_report(compiled_model=None):
    """Per graph of ``compiled_model`` (from torch.compile(..., backend="npu")
    or npubridge.compile): nodes and the kernels they resolved to, patterns
    fired and skipped with reasons, fallbacks with reasons, planned arena
    bytes and their lower bound (the live-set peak), graph breaks. A dict;
    ``print()`` it for text."""
    return _report.Report(_report.report_dict(compiled_model))


def register_fusion_pattern(text):
    """Adds a fusion pattern in the text form (docs/graph-mode.md); raises
    ValueError naming the pattern and line of a parse error."""
    _patterns.register(text)

