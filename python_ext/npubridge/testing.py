"""What a plugin gives ``python3 -m npubridge conformance`` for its own ops.

ATen ops are checked against PyTorch's OpInfo samples and ATen itself; an op
of the plugin's own namespace has neither, so the plugin ships a Python file
(passed with ``--tests FILE``, or found beside the library as
``<name>_conformance.py`` for ``lib<name>.so``) that declares, per op, sample
inputs and a reference written with ATen::

    import torch
    from npubridge import testing

    @testing.reference("acme::scaled_add")
    def scaled_add(x, y, alpha):
        return x + alpha * y

    @testing.samples("acme::scaled_add")
    def scaled_add_samples(dtype):
        yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype), 2.0)
        yield testing.Sample(torch.randn(0, 5, dtype=dtype), torch.randn(0, 5, dtype=dtype), 1.0, name="empty")

The reference gets CPU tensors, runs on the CPU (once in the sample's dtype,
once on float64 copies of its floating inputs) and returns the op's results
in the order of its returns, or, for an op that returns nothing, the
expected values of the arguments it writes (in schema order, the tensors of
a written list one by one). A reference that raises on a
sample makes it an error case: the kernel must raise too. The samples
function is called once per dtype the op's kernels declare; yielding
nothing for a dtype leaves that dtype "not covered".

The tool adds what needs nothing from the author: the op's meta function
against the kernel's outputs, its derivative formula against finite
differences and against the reference's autograd, non-contiguous copies of
every sample, and a check that the plugin's kernel (not the CPU fallback)
served each call. docs/plugin-authoring.md, "Testing your plugin:
conformance", has the whole story.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

__all__ = ["Sample", "reference", "samples", "registered", "clear"]

_OP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


@dataclass
class Sample:
    """One call's arguments, as the op takes them (CPU tensors; the tool
    moves them to the npu, keeping their strides). ``name`` labels it in the
    report; it is not passed to the op."""

    args: Tuple[Any, ...]
    kwargs: Dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __init__(self, *args, name: str = "", **kwargs):
        self.args, self.kwargs, self.name = tuple(args), dict(kwargs), name


@dataclass
class OpTests:
    reference: Optional[Callable] = None
    samples: Optional[Callable[[Any], Iterable[Sample]]] = None
    where: str = ""  # the file that declared them, for the report


_REGISTRY: Dict[str, OpTests] = {}


def _canonical(op: str, decorator: str) -> str:
    if not isinstance(op, str) or not _OP.fullmatch(op):
        raise ValueError(f"testing.{decorator}(): expected an op name 'namespace::name' or "
                         f"'namespace::name.overload' but found {op!r}")
    return op[:-len(".default")] if op.endswith(".default") else op


def _where(fn) -> str:
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""


def reference(op: str):
    """Declares fn as the ATen-written reference of plugin op ``op``."""
    name = _canonical(op, "reference")

    def register(fn):
        entry = _REGISTRY.setdefault(name, OpTests())
        entry.reference, entry.where = fn, entry.where or _where(fn)
        return fn

    return register


def samples(op: str):
    """Declares fn(dtype) -> iterable of Sample as the samples of ``op``."""
    name = _canonical(op, "samples")

    def register(fn):
        entry = _REGISTRY.setdefault(name, OpTests())
        entry.samples, entry.where = fn, entry.where or _where(fn)
        return fn

    return register


def registered() -> Dict[str, OpTests]:
    """Every op given a reference or samples so far, by name."""
    return dict(_REGISTRY)


def clear():
    _REGISTRY.clear()
