"""How `python3 -m npubridge conformance --plugin` attributes and judges a
sample (conformance.py): the verdict per (op, dtype) (Cell), which kernel
served a stretch of calls (Probe, from the dispatcher's statistics), and the
host result float64 samples are judged against."""
import re
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from . import _C, opinfo

# Only where the error model cannot judge (complex results, an op with no
# float64 CPU kernel): the CPU's result at a per-dtype tolerance, as
# opinfo.TOLERANCE for the dtypes it runs; integer and bool results exact.
TOLERANCE = {
    torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
}
_EXACT = dict(atol=0, rtol=0)


def _tolerance(dtype):
    return TOLERANCE.get(dtype, _EXACT)


# The error model's message: "... (error 0.25 > bound 3.57628e-07: ...".
_JUDGED = re.compile(r"error ([0-9.eE+-]+|inf|nan) > bound ([0-9.eE+-]+|inf|nan)")


DIED = ("crashed", "hung")


@dataclass
class Cell:
    """The verdict on one (op, dtype) of the plugin."""

    op: str
    dtype: str
    plugin: str
    kernel: str  # "p<priority> {dtypes}" of the kernel that serves the dtype
    status: str = "not covered"  # passed | failed | not covered | crashed | hung
    reason: str = ""  # the first failure, why not covered, or where the process died
    samples: int = 0  # samples the kernel served
    passed: int = 0
    declined: int = 0  # samples the kernel declined (the CPU served them)
    decline_reason: str = ""
    sources: List[str] = field(default_factory=list)  # OpInfo entries or the tests file
    checks: List[str] = field(default_factory=list)  # what was checked (forward, backward, meta, gradcheck, ...)
    note: str = ""  # what a passed cell lacks (a meta function)
    error: Optional[float] = None  # the worst element's error and bound in the first failure, when judged
    bound: Optional[float] = None

    def fail(self, message):
        if self.status not in ("failed",) + DIED:
            self.status, self.reason = "failed", message
            judged = _JUDGED.search(message)
            if judged:
                self.error, self.bound = float(judged.group(1)), float(judged.group(2))

    def died(self, status, message):
        """The process running the cell's samples crashed or hung (status
        "crashed" or "hung"); the first death stands."""
        if self.status not in DIED:
            self.status, self.reason, self.error, self.bound = status, message, None, None

    def served(self, source, check):
        self.samples += 1
        if source not in self.sources:
            self.sources.append(source)
        if check not in self.checks:
            self.checks.append(check)

    def finish(self, no_sample_reason):
        if self.status in ("failed",) + DIED:
            return
        if self.samples > 0:
            self.status = "passed"
            notes = [self.note] if self.note else []
            if self.declined:
                notes.append(f"{self.declined} samples declined ({self.decline_reason})")
            self.reason = "; ".join(notes)
        elif self.declined:
            self.reason = f"declined ({self.decline_reason})"
        else:
            self.reason = no_sample_reason


# ---------------------------------------------------------------------------
# which kernel served: the dispatcher's statistics around each call
# ---------------------------------------------------------------------------


def _kernel_key(k):
    return f"p{k['priority']} {{{k['dtypes']}}}"


class Probe:
    """Snapshots of the plugin's kernel calls, fallbacks and errors per
    registry op; ``delta`` says which ops a stretch of code reached."""

    def __init__(self, plugin, ops):
        self.plugin, self.ops = plugin, set(ops)

    def snapshot(self):
        snap = {}
        for op, s in _C.stats().items():
            if op not in self.ops:
                continue
            kernels = {_kernel_key(k): k["calls"] for k in s.get("kernels", []) if k["plugin"] == self.plugin}
            if not kernels and self.plugin in s["native"]:  # a build without per-kernel statistics
                kernels = {"": s["native"][self.plugin]}
            snap[op] = (kernels, s["fallbacks"], s["errors"])
        return snap

    def delta(self, before):
        """{op: served kernel key or None (errors only)}, {op: decline reason}."""
        after = self.snapshot()
        served, declined = {}, {}
        reasons = None
        for op, (kernels, fallbacks, errors) in after.items():
            k0, f0, e0 = before.get(op, ({}, 0, 0))
            ran = [k for k, calls in kernels.items() if calls > k0.get(k, 0)]
            if ran:
                served[op] = ran[0]
            elif errors > e0:
                served[op] = None
            elif fallbacks > f0:
                if reasons is None:
                    reasons = _C.fallback_reasons() if hasattr(_C, "fallback_reasons") else {}
                declined[op] = reasons.get(op, "no reason recorded")
        return served, declined


def _first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: " + (text.splitlines()[0] if text else "")[:400]


def _phase(probe, fn):
    """Runs fn(); returns (result, error message or None, served, declined)."""
    before = probe.snapshot()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result, error = fn(), None
    except Exception as e:  # noqa: BLE001 - a failing call is a verdict, not a crash of the tool
        result, error = None, _first_line(e)
    served, declined = probe.delta(before)
    return result, error, served, declined

# Note [Judging float64 results]
# The error model bounds a result by a few ulps of the float64 reference plus
# four times the error ATen's own result in the op's dtype shows against it.
# For a float64 op the reference is ATen's float64 result itself, which
# would leave no allowance for a different summation order: ATen's own
# float64 error is estimated instead from its float32 run on the same
# inputs, scaled by the ratio of the unit roundoffs (2^-53 / 2^-24), as the
# error bounds of the model scale with u, doubled because the reference is
# then a float64 result carrying the same kind of error as the kernel's (as
# npub-conformance allows a float64 kernel twice the bound), and doubled
# again because one float32 run is one draw of an error that depends on the
# order of the sums (a backward pass through five kernels missed 2x by 8%
# on cann_like). A defect (a dropped term, float64 read as float) misses
# this by many orders of magnitude still. The float32 run also starts from
# rounded inputs, so the estimate includes the op's sensitivity to a
# float64 rounding of its inputs: the allowance of a backward-stable kernel.
# `calibrated` makes the host result the judge compares with: the float64
# result moved by that estimate.
_F64_PER_F32 = 4 * 2.0 ** -29


def _to_float32(t):
    if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
        return t.detach().float().requires_grad_(t.requires_grad)
    return t


def calibrated(host, narrow):
    """host (float64 results) moved by their float32 counterparts' error,
    scaled to float64 (Note [Judging float64 results]); host where there is
    no counterpart."""
    if narrow is None:
        return host
    hosts, narrows = opinfo._tensors(host), opinfo._tensors(narrow)
    if len(hosts) != len(narrows):
        return host
    moved = iter([h.detach() + (n.detach().double() - h.detach()).nan_to_num(0, 0, 0) * _F64_PER_F32
                  if h.dtype == torch.float64 and n.is_floating_point() and n.shape == h.shape else h
                  for h, n in zip(hosts, narrows)])
    return _map(lambda t: next(moved) if isinstance(t, torch.Tensor) else t, host)


def _map(fn, x):
    return opinfo._tree_map(fn, x)
