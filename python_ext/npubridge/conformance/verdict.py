"""How `python3 -m npubridge conformance --plugin` attributes a sample
(plugin.py): the verdict per (op, dtype) (Cell), and which kernel served a
stretch of calls (Probe, from the dispatcher's statistics); how results are
compared is judge.py's."""
import re
import warnings
from dataclasses import dataclass, field
from typing import List, Optional

from .. import _C

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


def kernel_key(k):
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
            kernels = {kernel_key(k): k["calls"] for k in s.get("kernels", []) if k["plugin"] == self.plugin}
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


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: " + (text.splitlines()[0] if text else "")[:400]


def phase(probe, fn):
    """Runs fn(); returns (result, error message or None, served, declined):
    the ops whose kernels the calls reached, and those whose kernels
    declined (none without a probe: the OpInfo database run)."""
    if probe is None:
        probe = _NO_PROBE
    before = probe.snapshot()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result, error = fn(), None
    except Exception as e:  # noqa: BLE001 - a failing call is a verdict, not a crash of the tool
        result, error = None, first_line(e)
    served, declined = probe.delta(before)
    return result, error, served, declined


class _NoProbe:
    def snapshot(self):
        return {}

    def delta(self, before):
        return {}, {}


_NO_PROBE = _NoProbe()
