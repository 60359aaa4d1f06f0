"""Conformance of one plugin: ``python3 -m npubridge conformance --plugin lib.so``.

Every op the plugin's kernels serve is run on npu with the plugin alone
enabled, and each sample is credited to the plugin's kernel only when the
dispatcher's statistics show that kernel served it (a kernel that declined
hands the call to the CPU, which is "not covered: declined", never a pass).

- ATen ops: PyTorch's OpInfo samples (forward, backward where the OpInfo
  supports autograd, and a non-contiguous copy of every sample) for every
  dtype the kernel declares, against the CPU, judged by the error model
  (``_C.judge``, as the OpInfo runner in opinfo.py does). An aten op is mapped
  to the OpInfo entries whose names match it (hardtanh.out and
  hardtanh_backward.grad_input to nn.functional.hardtanh); a run counts for
  every op of the plugin whose kernel it reached.
- The plugin's own ops: the samples and ATen-written reference its
  ``npubridge.testing`` file declares, plus its meta function against the
  kernel's outputs (fake tensors) and its derivative formula against finite
  differences (float64) and the reference's autograd.

The verdict is per (op, dtype): passed, failed (the first failure, with the
sample and the bound it missed) or not covered (why). See
docs/plugin-authoring.md, "Testing your plugin: conformance".
"""
from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from . import _C, opinfo, testing
from ._autograd import _resolve

# The dtypes a kernel declaring "any" is run with.
ANY_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")
TOLERANCE = {
    torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
}
_EXACT = dict(atol=0, rtol=0)


def _tolerance(dtype):
    return TOLERANCE.get(dtype, _EXACT)


# The error model's message: "... (error 0.25 > bound 3.57628e-07: ...".
_JUDGED = re.compile(r"error ([0-9.eE+-]+|inf|nan) > bound ([0-9.eE+-]+|inf|nan)")


@dataclass
class Cell:
    """The verdict on one (op, dtype) of the plugin."""

    op: str
    dtype: str
    plugin: str
    kernel: str  # "p<priority> {dtypes}" of the kernel that serves the dtype
    status: str = "not covered"  # passed | failed | not covered
    reason: str = ""  # the first failure, or why not covered
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
        if self.status != "failed":
            self.status, self.reason = "failed", message
            judged = _JUDGED.search(message)
            if judged:
                self.error, self.bound = float(judged.group(1)), float(judged.group(2))

    def served(self, source, check):
        self.samples += 1
        if source not in self.sources:
            self.sources.append(source)
        if check not in self.checks:
            self.checks.append(check)

    def finish(self, no_sample_reason):
        if self.status == "failed":
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


# ---------------------------------------------------------------------------
# ATen ops: PyTorch's OpInfo samples
# ---------------------------------------------------------------------------

_SUFFIXES = ("_backward_data", "_backward_input", "_backward_weight", "_double_backward", "_backward",
             "_forward", "_with_indices", "_functional", "_out")


def aten_bases(op):
    """Names an OpInfo of `op` may carry: aten::_softmax_backward_data.out
    gives _softmax_backward_data, softmax_backward_data, _softmax, softmax."""
    todo, seen = [op.split("::", 1)[1].split(".", 1)[0]], set()
    while todo:
        n = todo.pop()
        if not n or n in seen:
            continue
        seen.add(n)
        todo.append(n.strip("_"))
        if n.startswith("native_"):
            todo.append(n[len("native_"):])
        for s in _SUFFIXES:
            if n.endswith(s):
                todo.append(n[:-len(s)])
    return seen


def unknown_to_aten(op):
    """Why ATen does not know `op` (an aten:: registry op), or ""."""
    qualified, _, overload = op.partition(".")
    schemas = torch._C._jit_get_schemas_for_operator(qualified)
    if not schemas:
        return f"unknown to ATen: PyTorch {torch.__version__} has no op {qualified}"
    overloads = sorted(s.overload_name for s in schemas)
    if overload in overloads or (overload == "default" and "" in overloads):
        return ""
    listed = ", ".join(repr(o) if o else "'' (the default)" for o in overloads)
    return f"unknown to ATen: {qualified} has no overload '{overload}' (it has {listed})"


def _opinfo_name(o):
    return o.name + ("." + o.variant_test_name if o.variant_test_name else "")


# OpInfo entries whose names share nothing with the ATen op their calls
# reach (by base name, as aten_bases gives it).
_CONVOLUTIONS = tuple(f"nn.functional.conv{t}{d}d" for t in ("", "_transpose") for d in (1, 2, 3))
OPINFO_HINTS = {
    "convolution_overrideable": _CONVOLUTIONS, "convolution": _CONVOLUTIONS,
    "copy": ("clone", "contiguous"), "index": ("__getitem__",),
}


def opinfo_candidates(op, db, mapped_from=()):
    """The OpInfo entries of `db` that may reach `op`: by name, its own or
    that of an op the op-mapping table routes to it (`mapped_from`:
    aten::hardtanh reaches aten::clamp.out so)."""
    bases = set(aten_bases(op))
    for framework_op in mapped_from:
        bases |= aten_bases(framework_op)
    hinted = {name for base in bases for name in OPINFO_HINTS.get(base, ())}
    found = []
    for o in db:
        name = _opinfo_name(o)
        if name in opinfo.SKIPPED or name.startswith(opinfo.SKIPPED_PREFIXES):
            continue
        keys = {o.name, o.name.split(".")[-1], getattr(o, "aten_name", None),
                getattr(o, "aten_backward_name", None)}
        keys |= {a.name.split(".")[-1] for a in getattr(o, "aliases", ())}
        if keys & bases or o.name in hinted:
            found.append(o)
    return found


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


# Ops that return the indices of selected elements, which ATen does not fix
# among equal elements (a sort that is not stable, topk, max over a dim):
# an index there is right when it selects an element equal to the one ATen's
# index selects. By OpInfo entry, where the sample keeps its dimension
# (position in args, default).
TIE_ORDER_FREE = {
    "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1), "mode": (0, -1),
    "max.reduction_with_dim": (0, None), "min.reduction_with_dim": (0, None), "median": (0, None),
    "nanmedian": (0, None),
}


def _tie_dim(name, sample):
    """The dimension the op selects along, when its indices are free among
    ties for this sample; None otherwise (stable sorts, ops not listed)."""
    if name not in TIE_ORDER_FREE or sample.kwargs.get("stable", False):
        return None
    position, default = TIE_ORDER_FREE[name]
    dim = sample.kwargs.get("dim", sample.args[position] if len(sample.args) > position else default)
    if not isinstance(dim, int) or not isinstance(sample.input, torch.Tensor) or sample.input.dim() == 0:
        return None
    return dim % sample.input.dim()


def _assert_matches_up_to_ties(got, ref, wide, tol, x, dim):
    """As opinfo._assert_matches, but an int64 output (indices along `dim`
    of x) passes when it selects elements equal to those ATen's selects."""
    got_l, ref_l = opinfo._tensors(got), opinfo._tensors(ref)
    wide_l = opinfo._tensors(wide) if wide is not None else [None] * len(ref_l)
    if len(got_l) != len(ref_l) or len(wide_l) != len(ref_l):
        return opinfo._assert_matches(got, ref, wide, tol)
    x = x.detach()
    for i, (g, r, w) in enumerate(zip(got_l, ref_l, wide_l)):
        if r.dtype != torch.int64 or g.dtype != torch.int64 or g.shape != r.shape:
            opinfo._assert_matches(g, r, w, tol)
            continue

        def select(idx):
            idx = idx.detach().cpu()
            return torch.take_along_dim(x, idx.unsqueeze(dim) if idx.dim() < x.dim() else idx, dim)

        try:
            torch.testing.assert_close(select(g), select(r), rtol=0, atol=0, equal_nan=True)
        except (AssertionError, IndexError, RuntimeError) as e:
            raise AssertionError(f"output {i} (indices along dim {dim}): they select other elements than ATen's "
                                 f"({' '.join(str(e).split())[:300]})") from None


def _run_opinfo_sample(o, sample, backward, tol, probe):
    """The sample on the CPU and on npu, in phases: [(check, error, served,
    declined)]; check is "forward", "backward" or "error case"."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = o(sample.input, *sample.args, **sample.kwargs)
    except Exception as cpu_error:  # noqa: BLE001 - the npu must refuse it as the CPU does
        reason = (str(cpu_error).strip().splitlines() or [""])[0]
        npu_sample = sample.transform(opinfo._to("npu"))

        def refuse():
            try:
                o(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
            except type(cpu_error) as npu_error:
                if reason in str(npu_error):
                    return
                raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), the npu "
                                     f"another error: {str(npu_error).strip()[:200]}") from None
            raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), the npu did not")

        _, error, served, declined = _phase(probe, refuse)
        return [("error case", error, served, declined)]
    wide_sample, wide = None, None
    if o.supports_dtype(torch.float64, "cpu"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wide_sample = sample.transform(opinfo._float64)
                wide = o(wide_sample.input, *wide_sample.args, **wide_sample.kwargs)
        except Exception:  # noqa: BLE001 - no float64 reference: the CPU's result at the tolerance decides
            wide_sample, wide = None, None
    narrow_sample, narrow = None, None
    if o.supports_dtype(torch.float32, "cpu") and any(
            t.dtype == torch.float64 for t in opinfo._tensors([sample.input, sample.args, sample.kwargs])):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                narrow_sample = sample.transform(_to_float32)
                narrow = o(narrow_sample.input, *narrow_sample.args, **narrow_sample.kwargs)
        except Exception:  # noqa: BLE001 - no float32 run: the float64 result alone is the host's
            narrow_sample, narrow = None, None
    npu_sample = sample.transform(opinfo._to("npu"))
    box = {}

    def forward():
        box["out"] = o(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
        dim = _tie_dim(_opinfo_name(o), sample)
        if dim is None:
            opinfo._assert_matches(box["out"], calibrated(ref, narrow), wide, tol)
        else:
            _assert_matches_up_to_ties(box["out"], calibrated(ref, narrow), wide, tol, sample.input, dim)
            # Other tied elements selected: their gradients land elsewhere, and rightly so.
            box["other_ties"] = any(g.dtype == torch.int64 and not torch.equal(g.cpu(), r)
                                    for g, r in zip(opinfo._tensors(box["out"]), opinfo._tensors(ref)))

    phases = []
    _, error, served, declined = _phase(probe, forward)
    phases.append(("forward", error, served, declined))
    if error is not None or not backward or box.get("other_ties"):
        return phases
    ref_outs = [t for t in opinfo._tensors(ref) if t.requires_grad and t.is_floating_point()]
    npu_outs = [t for t in opinfo._tensors(box["out"]) if t.requires_grad and t.is_floating_point()]
    ref_in = [t for t in opinfo._tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
    npu_in = [t for t in opinfo._tensors([npu_sample.input, npu_sample.args, npu_sample.kwargs]) if t.requires_grad]
    if not ref_outs or len(ref_outs) != len(npu_outs) or not ref_in:
        return phases

    def backward_check():
        weights = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape) for t in ref_outs]
        ref_grads = opinfo._weighted_grads(ref_outs, ref_in, weights)
        npu_grads = opinfo._weighted_grads(npu_outs, npu_in, weights)
        if narrow is not None:
            narrow_outs = [t for t in opinfo._tensors(narrow) if t.requires_grad and t.is_floating_point()]
            narrow_in = [t for t in opinfo._tensors([narrow_sample.input, narrow_sample.args,
                                                     narrow_sample.kwargs]) if t.requires_grad]
            if len(narrow_outs) == len(ref_outs) and len(narrow_in) == len(ref_in):
                try:
                    narrow_grads = opinfo._weighted_grads(narrow_outs, narrow_in, [w.float() for w in weights])
                    ref_grads = [calibrated(g, n) if g is not None and n is not None else g
                                 for g, n in zip(ref_grads, narrow_grads)]
                except Exception:  # noqa: BLE001 - no float32 gradient: the float64 one alone
                    pass
        wide_grads = None
        if wide is not None:
            wide_outs = [t for t in opinfo._tensors(wide) if t.requires_grad and t.is_floating_point()]
            wide_in = [t for t in opinfo._tensors([wide_sample.input, wide_sample.args, wide_sample.kwargs])
                       if t.requires_grad]
            if len(wide_outs) == len(ref_outs) and len(wide_in) == len(ref_in):
                try:
                    wide_grads = opinfo._weighted_grads(wide_outs, wide_in, weights)
                except Exception:  # noqa: BLE001 - no float64 gradient: the tolerance decides
                    wide_grads = None
        for i, (g_ref, g_npu) in enumerate(zip(ref_grads, npu_grads)):
            if g_ref is None or g_npu is None:
                assert (g_ref is None) == (g_npu is None), f"gradient {i} defined on one device only"
                continue
            g_wide = wide_grads[i] if wide_grads is not None else None
            try:
                opinfo._assert_matches(g_npu, g_ref, g_wide, tol)
            except AssertionError as e:
                raise AssertionError(f"gradient of input {i}: {e}") from None

    _, error, served, declined = _phase(probe, backward_check)
    phases.append(("backward", error, served, declined))
    return phases


def _credit(cells, dtype_name, source, label, phases):
    """Books the phases of one sample on the cells of the ops they reached."""
    for check, error, served, declined in phases:
        for op, reason in declined.items():
            cell = cells.get((op, dtype_name))
            if cell is not None and op not in served:
                cell.declined += 1
                cell.decline_reason = cell.decline_reason or reason
        for op in served:
            cell = cells.get((op, dtype_name))
            if cell is None:
                continue
            cell.served(source, check)
            if error is None:
                cell.passed += 1
            else:
                others = sorted(o for o in served if o != op)
                also = f" (the same run reached {', '.join(others)})" if others else ""
                cell.fail(f"{source} {label} ({check}){also}: {error}")


def run_aten(cells, ops, probe, max_samples, log=print):
    """Runs the OpInfo samples of `ops` ({op: [declared dtype names]})."""
    from torch.testing._internal.common_methods_invocations import op_db

    per_opinfo: Dict[str, Tuple[object, set]] = {}
    no_opinfo = {}
    mapped_from = {}
    for framework_op, target, _ in _C.op_map():
        mapped_from.setdefault(target, []).append(framework_op)

    def candidates(op, db):
        return opinfo_candidates(op, db, mapped_from.get(op, ()))

    for op, dtypes in ops.items():
        found = candidates(op, op_db)
        if not found:
            no_opinfo[op] = ("no OpInfo for this op (PyTorch's OpInfo database has no entry named "
                             f"{' or '.join(sorted(aten_bases(op)))})")
        for o in found:
            entry = per_opinfo.setdefault(_opinfo_name(o), (o, set()))
            entry[1].update(dtypes)
    tried = {}  # (op, dtype) -> the OpInfo entries that had samples for it
    for name, (o, dtypes) in sorted(per_opinfo.items()):
        for dtype_name in sorted(dtypes):
            dtype = getattr(torch, dtype_name)
            if not o.supports_dtype(dtype, "cpu"):
                continue
            for op in ops:
                if dtype_name in ops[op] and o in candidates(op, [o]):
                    tried.setdefault((op, dtype_name), []).append(name)
            backward = o.supports_autograd and dtype.is_floating_point
            tol = _tolerance(dtype)
            torch.manual_seed(0)  # sample inputs are random: make the run repeatable
            deterministic = opinfo.DETERMINISTIC.get(name, lambda s: s)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    samples = list(itertools.islice(o.sample_inputs("cpu", dtype, requires_grad=backward), max_samples))
            except Exception as e:  # noqa: BLE001 - PyTorch's sample generator failed for this dtype
                log(f"note: OpInfo {name} has no samples for {dtype_name}: {_first_line(e)}")
                continue
            for i, sample in enumerate(samples):
                sample = deterministic(sample)
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i}",
                        _run_opinfo_sample(o, sample, backward, tol, probe))
                try:
                    variant = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample with no non-contiguous form
                    continue
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i} non-contiguous",
                        _run_opinfo_sample(o, variant, False, tol, probe))
    for (op, dtype_name), cell in cells.items():
        if op not in ops:
            continue
        if op in no_opinfo:
            why = no_opinfo[op]
        elif (op, dtype_name) not in tried:
            names = sorted({_opinfo_name(o) for o in candidates(op, op_db)})
            why = f"no OpInfo sample for {dtype_name} ({', '.join(names)} not defined for it on the CPU)"
        else:
            why = ("OpInfo samples of " + ", ".join(tried[(op, dtype_name)]) + " never reached the kernel "
                   "(the calls went to other ops)")
        cell.finish(why)


# ---------------------------------------------------------------------------
# the plugin's own ops: the npubridge.testing file
# ---------------------------------------------------------------------------

def _map(fn, x):
    return opinfo._tree_map(fn, x)


def _clone_cpu(x):
    return _map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _to_float64(x):
    return _map(lambda t: t.detach().double() if isinstance(t, torch.Tensor) and t.is_floating_point()
                else (t.detach().clone() if isinstance(t, torch.Tensor) else t), x)


def _noncontiguous(x):
    from torch.testing._internal.common_utils import noncontiguous_like

    return _map(lambda t: noncontiguous_like(t) if isinstance(t, torch.Tensor) and t.numel() > 1 else t, x)


def _as_list(x):
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for t in x if isinstance(t, torch.Tensor)]


def _written(schema):
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


class CustomOp:
    def __init__(self, op, tests: testing.OpTests, derivative):
        self.name, self.tests, self.derivative = op, tests, derivative
        self.packet = _resolve(op)
        self.schema = self.packet._schema
        self.written = _written(self.schema)
        self.returns_nothing = len(self.schema.returns) == 0

    def outputs(self, result, args):
        """The op's results: its returns, or the arguments it writes."""
        if self.returns_nothing:
            return [args[i] for i in self.written if i < len(args) and isinstance(args[i], torch.Tensor)]
        return _as_list(result)

    def reference(self, args, kwargs):
        result = self.tests.reference(*args, **kwargs)
        return _as_list(result)


def _judge_all(got, host, wide, what):
    if len(got) != len(host):
        raise AssertionError(f"{what}: the kernel produced {len(got)} tensors, the reference {len(host)}")
    for i, (g, h) in enumerate(zip(got, host)):
        w = wide[i] if wide is not None and i < len(wide) else None
        g = g.detach().cpu()
        if w is not None and (w.shape != h.shape):
            w = None
        if opinfo._judgeable(g) and opinfo._judgeable(h):
            if w is None or not w.is_floating_point():
                w = h.double() if h.is_floating_point() else h
            msg = _C.judge(g, h.detach(), w.detach())
            if msg:
                raise AssertionError(f"{what} {i}: {msg}")
        else:
            torch.testing.assert_close(g, h, equal_nan=True, check_device=False, **_tolerance(h.dtype))


def _meta_check(cop, npu_args, npu_kwargs, got):
    """Runs the op on fake tensors; raises when its declared outputs differ
    from the kernel's real ones (shape, dtype)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = _map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, npu_args)
        fake_kwargs = _map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, npu_kwargs)
        try:
            result = cop.packet(*fake_args, **fake_kwargs)
        except Exception as e:  # noqa: BLE001 - reported with the meta function named
            raise AssertionError(
                f"the meta function raised on a sample the kernel computes: {_first_line(e)}") from None
        declared = cop.outputs(result, list(fake_args))
        declared = [(tuple(t.shape), t.dtype) for t in declared]
    real = [(tuple(t.shape), t.dtype) for t in got]
    if len(declared) != len(real):
        raise AssertionError(f"the meta function declares {len(declared)} outputs, the kernel returned {len(real)}")
    for i, (d, r) in enumerate(zip(declared, real)):
        if d != r:
            raise AssertionError(f"output {i}: the meta function declares shape {list(d[0])} {str(d[1])[6:]}, "
                                 f"the kernel returned shape {list(r[0])} {str(r[1])[6:]}")


def _has_meta(op):
    """Whether PyTorch has a Meta kernel for the op (what a plugin's meta
    function is registered as)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")
    except RuntimeError:
        return False


def _gradient_check(cop, sample, dtype, gradcheck):
    """The plugin's derivative formula against the reference's autograd (and
    finite differences when `gradcheck`)."""
    entry = cop.derivative
    inputs = [i for i in entry["inputs"] if i < len(sample.args) and isinstance(sample.args[i], torch.Tensor)]
    diff_outs = sorted({i for kind, i in (tuple(a) for a in entry["args"]) if kind == "grad"})
    if not inputs or any(not sample.args[i].is_floating_point() or sample.args[i].numel() == 0 for i in inputs):
        return False

    def with_grad(args, device, to):
        args = list(args)
        for i in range(len(args)):
            if isinstance(args[i], torch.Tensor):
                t = to(args[i].detach())
                args[i] = opinfo._to(device)(t) if device != "cpu" else t.clone()
        for i in inputs:
            args[i].requires_grad_(True)
        return args

    def pick(outs):
        return [outs[i] for i in diff_outs if i < len(outs)]

    npu_args = with_grad(sample.args, "npu", lambda t: t)
    npu_outs = pick(_as_list(cop.packet(*npu_args, **sample.kwargs)))
    weights = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape) for t in npu_outs]
    npu_grads = opinfo._weighted_grads(npu_outs, [npu_args[i] for i in inputs], weights)
    host_args = with_grad(sample.args, "cpu", lambda t: t)
    try:
        host_outs = pick(cop.reference(host_args, sample.kwargs))
        host_grads = opinfo._weighted_grads(host_outs, [host_args[i] for i in inputs], weights)
        wide_args = with_grad(sample.args, "cpu", lambda t: t.double() if t.is_floating_point() else t)
        wide_outs = pick(cop.reference(wide_args, sample.kwargs))
        wide_grads = opinfo._weighted_grads(wide_outs, [wide_args[i] for i in inputs],
                                            [w.double() for w in weights])
        if dtype == torch.float64:
            narrow_args = with_grad(sample.args, "cpu", _to_float32)
            narrow_outs = pick(cop.reference(narrow_args, sample.kwargs))
            narrow_grads = opinfo._weighted_grads(narrow_outs, [narrow_args[i] for i in inputs],
                                                  [w.float() for w in weights])
            host_grads = [calibrated(h, n) if h is not None and n is not None else h
                          for h, n in zip(host_grads, narrow_grads)]
    except Exception as e:  # noqa: BLE001 - the reference is not differentiable: only gradcheck can judge
        host_grads = None
        if not gradcheck:
            raise AssertionError(f"the reference is not differentiable ({_first_line(e)}) and the kernel takes "
                                 "no float64 for gradcheck") from None
    if host_grads is not None:
        names = [cop.schema.arguments[i].name for i in inputs]
        for name, g, h, w in zip(names, npu_grads, host_grads, wide_grads):
            if (g is None) != (h is None):
                raise AssertionError(f"gradient of {name}: defined by {'the formula' if h is None else 'the reference'}"
                                     " only")
            if g is not None:
                _judge_all([g], [h], [w], f"gradient of {name} (the formula against the reference's autograd):"
                           " output")
    if gradcheck:
        base = with_grad(sample.args, "npu", lambda t: t)

        def fn(*diff):
            args = list(base)
            for slot, t in zip(inputs, diff):
                args[slot] = t
            return tuple(pick(_as_list(cop.packet(*args, **sample.kwargs))))

        try:
            torch.autograd.gradcheck(fn, tuple(base[i] for i in inputs), eps=1e-6, atol=1e-5, rtol=1e-3,
                                     raise_exception=True)
        except Exception as e:  # noqa: BLE001
            text = " ".join(str(e).split())[:500]
            raise AssertionError(f"gradcheck (the formula against finite differences, float64): {text}") from None
    return True


def run_custom(cells, ops, probe, max_samples, derivatives, where, log=print):
    """Runs the npubridge.testing samples of the plugin's own ops."""
    registered = testing.registered()
    for op, dtypes in ops.items():
        tests = registered.get(op)
        op_cells = [cells[(op, d)] for d in dtypes]
        if tests is None or tests.samples is None:
            for c in op_cells:
                c.finish(f"no samples: declare @testing.samples(\"{op}\") in {where}")
            continue
        if tests.reference is None:
            for c in op_cells:
                c.finish(f"no reference: declare @testing.reference(\"{op}\") in {where}")
            continue
        try:
            cop = CustomOp(op, tests, derivatives.get(op))
        except Exception as e:  # noqa: BLE001 - PyTorch refused the op's schema
            for c in op_cells:
                c.finish(f"PyTorch has no op {op} to call ({_first_line(e)})")
            continue
        has_meta = _has_meta(op)
        source = f"tests {tests.where.rsplit(':', 1)[0]}"
        for dtype_name in dtypes:
            cell = cells[(op, dtype_name)]
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(0)
            try:
                samples = list(itertools.islice(tests.samples(dtype) or (), max_samples))
            except Exception as e:  # noqa: BLE001 - the author's sample function failed
                cell.fail(f"the samples function raised for {dtype_name}: {_first_line(e)}")
                continue
            for i, s in enumerate(samples):
                if not isinstance(s, testing.Sample):
                    cell.fail(f"sample {i}: expected a testing.Sample but found {type(s).__name__}")
                    break
                label = f"sample {i}" + (f" '{s.name}'" if s.name else "")
                for variant, sample in (("", s), (" non-contiguous", None)):
                    if variant:
                        sample = testing.Sample(*_noncontiguous(s.args), name=s.name, **_noncontiguous(s.kwargs))
                    _run_custom_sample(cell, cop, sample, dtype, source, label + variant, probe,
                                       meta=has_meta and not variant,
                                       gradients=cop.derivative is not None and not variant)
            if not has_meta and cell.samples:
                cell.note = ("no meta function: fake tensors, torch.compile and torch.export cannot trace "
                             "the op")
            cell.finish(f"no sample for {dtype_name}, which the kernel declares (the samples function yielded "
                        "none)" if not samples else "no sample reached the kernel")


def _run_custom_sample(cell, cop, sample, dtype, source, label, probe, meta, gradients):
    try:
        host = cop.reference(_clone_cpu(list(sample.args)), _clone_cpu(sample.kwargs))
        ref_error = None
    except Exception as e:  # noqa: BLE001 - the reference rejects the sample: the kernel must too
        host, ref_error = None, _first_line(e)
    wide = None
    if ref_error is None:
        try:
            wide = cop.reference(_to_float64(list(sample.args)), _to_float64(sample.kwargs))
        except Exception:  # noqa: BLE001 - no float64 reference: the sample's dtype alone decides
            wide = None
        if dtype == torch.float64:
            try:
                host = calibrated(host, cop.reference(_map(_to_float32, _clone_cpu(list(sample.args))),
                                                      _map(_to_float32, _clone_cpu(sample.kwargs))))
            except Exception:  # noqa: BLE001 - no float32 run: the float64 result alone is the host's
                pass
    npu_args = _map(opinfo._to("npu"), list(sample.args))
    npu_kwargs = _map(opinfo._to("npu"), sample.kwargs)
    box = {}

    def forward():
        box["result"] = cop.packet(*npu_args, **npu_kwargs)

    _, error, served, declined = _phase(probe, forward)
    op = cop.name
    if op in declined and op not in served:
        cell.declined += 1
        cell.decline_reason = cell.decline_reason or declined[op]
        return
    if ref_error is not None:
        cell.served(source, "error case")
        if error is None:
            cell.fail(f"{source} {label}: the reference rejects the sample ({ref_error}) but the kernel "
                      "accepted it")
        else:
            cell.passed += 1
        return
    cell.served(source, "forward")
    if error is not None:
        cell.fail(f"{source} {label} (forward): {error}")
        return
    got = cop.outputs(box.get("result"), npu_args)
    try:
        _judge_all(got, host, wide, "output")
    except AssertionError as e:
        cell.fail(f"{source} {label} (forward): {e}")
        return
    except Exception as e:  # noqa: BLE001
        cell.fail(f"{source} {label} (forward): {_first_line(e)}")
        return
    if meta:
        try:
            _meta_check(cop, _map(opinfo._to("npu"), list(sample.args)), _map(opinfo._to("npu"), sample.kwargs),
                        got)
            if "meta" not in cell.checks:
                cell.checks.append("meta")
        except AssertionError as e:
            cell.fail(f"{source} {label} (meta): {e}")
            return
        except Exception as e:  # noqa: BLE001
            cell.fail(f"{source} {label} (meta): {_first_line(e)}")
            return
    if gradients and dtype.is_floating_point:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                checked = _gradient_check(cop, sample, dtype, gradcheck=dtype == torch.float64)
            if checked:
                check = "gradcheck" if dtype == torch.float64 else "backward"
                if check not in cell.checks:
                    cell.checks.append(check)
        except AssertionError as e:
            cell.fail(f"{source} {label} (derivative): {e}")
            return
        except Exception as e:  # noqa: BLE001
            cell.fail(f"{source} {label} (derivative): {_first_line(e)}")
            return
    cell.passed += 1


# ---------------------------------------------------------------------------
# the whole run
# ---------------------------------------------------------------------------

def find_plugin(path):
    """The loaded plugin whose file is `path`, or None."""
    real = os.path.realpath(path)
    for p in _C.plugins():
        if p["path"] and os.path.realpath(p["path"]) == real:
            return p
    return None


def tests_beside(path):
    """<dir>/<name>_conformance.py for <dir>/lib<name>.so."""
    base = os.path.basename(path)
    stem = base[3:] if base.startswith("lib") else base
    stem = stem.split(".so", 1)[0]
    return os.path.join(os.path.dirname(os.path.abspath(path)), f"{stem}_conformance.py")


def load_tests(spec):
    """Imports a tests file (a path) or module (a dotted name)."""
    if spec.endswith(".py") or os.sep in spec:
        name = "npubridge_conformance_" + re.sub(r"\W", "_", os.path.basename(spec)[:-3])
        module_spec = importlib.util.spec_from_file_location(name, spec)
        if module_spec is None:
            raise ImportError(f"cannot import {spec}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def _dtype_names(dtypes):
    return list(ANY_DTYPES) if dtypes == "any" else [d.strip() for d in dtypes.split(",") if d.strip()]


def select(op_names, wanted):
    """The plugin's ops `wanted` selects (exact names, or a name without
    overload for all of its overloads), and the wanted names none matched."""
    if not wanted:
        return list(op_names), []
    chosen, unmatched = [], []
    for w in wanted:
        hits = [o for o in op_names if o == w or o.partition(".")[0] == w]
        if not hits:
            unmatched.append(w)
        chosen += [h for h in hits if h not in chosen]
    return chosen, unmatched


@dataclass
class Report:
    plugin: str
    path: str
    cells: List[Cell]
    errors: List[str]  # what stopped a part of the run (a rejected plugin, a tests file that failed)
    seconds: float = 0.0
    notes: List[str] = field(default_factory=list)  # what the run changed to reach the plugin's kernels

    def counts(self):
        c = {"passed": 0, "failed": 0, "not covered": 0}
        for cell in self.cells:
            c[cell.status] += 1
        return c

    def exit_status(self):
        c = self.counts()
        return 0 if not self.errors and c["failed"] == 0 and c["passed"] > 0 else 1

    def summary(self):
        c = self.counts()
        s = (f"conformance of plugin '{self.plugin}' ({self.path}): {len(self.cells)} op x dtype pairs: "
             f"{c['passed']} passed, {c['failed']} failed, {c['not covered']} not covered "
             f"({sum(x.samples for x in self.cells)} samples, {self.seconds:.1f} s)")
        if c["passed"] == 0 and not c["failed"] and not self.errors:
            s += "; nothing was covered"
        return s


def run(path, wanted_ops=(), tests=(), max_samples=8, log=print):
    start = time.time()
    errors = []
    plugin = find_plugin(path)
    if plugin is None:
        real = os.path.realpath(path)
        rejected = [f for f in _C.load_failures() if f.startswith(path) or f.startswith(real)]
        why = rejected[0] if rejected else f"{path}: not loaded (is it on NPUB_PLUGIN_PATH?)"
        return Report("?", path, [], [f"the plugin was not loaded: {why}"], time.time() - start)
    name = plugin["name"]
    for p in _C.plugins():
        if p["name"] == name:
            _C.enable_plugin(p["name"], True)
        else:
            _C.enable_plugin(p["name"], False)

    kernels: Dict[str, List[dict]] = {}
    for k in _C.ops(name):
        kernels.setdefault(k["op"], []).append(k)
    chosen, unmatched = select(sorted(kernels), list(wanted_ops))
    cells: Dict[Tuple[str, str], Cell] = {}
    for w in unmatched:
        errors.append(f"--op {w}: the plugin serves no op of that name (it serves {', '.join(sorted(kernels))})")
    aten, custom = {}, {}
    for op in chosen:
        by_dtype = {}
        for k in sorted(kernels[op], key=lambda k: -k["priority"]):
            for d in _dtype_names(k["dtypes"]):
                by_dtype.setdefault(d, _kernel_key(k))
        for d, key in by_dtype.items():
            cells[(op, d)] = Cell(op=op, dtype=d, plugin=name, kernel=key)
        if op.startswith("aten::"):
            why = unknown_to_aten(op)
            if why:
                for d in by_dtype:
                    cells[(op, d)].finish(why)
                continue
            aten[op] = list(by_dtype)
        else:
            custom[op] = list(by_dtype)

    notes = _unmap_hiding_entries(aten, kernels)
    probe = Probe(name, kernels)
    if aten:
        run_aten(cells, aten, probe, max_samples, log)
    if custom:
        files = list(tests)
        if not files and os.path.exists(tests_beside(path)):
            files = [tests_beside(path)]
        where = files[0] if files else f"--tests FILE or {tests_beside(path)}"
        testing.clear()
        loaded = True
        for f in files:
            try:
                load_tests(f)
            except Exception as e:  # noqa: BLE001 - the author's file is broken: say so, go on with the rest
                errors.append(f"the tests file {f} failed to import: {_first_line(e)}")
                loaded = False
        derivatives = {d["op"]: d for d in _C.derivatives() if d["plugin"] == name}
        if loaded or testing.registered():
            run_custom(cells, custom, probe, max_samples, derivatives, where, log)
        for (op, _), cell in cells.items():
            if op in custom and cell.status == "not covered" and not cell.reason:
                cell.finish("the tests file failed to import")
    ordered = sorted(cells.values(), key=lambda c: (c.op, c.dtype))
    return Report(name, path, ordered, errors, time.time() - start, notes)


def _unmap_hiding_entries(aten_ops, plugin_ops):
    """Removes, for the run, the op-mapping entries that send calls of the
    plugin's ATen ops (or of their other overloads, which reach them through
    .out) to another op: the table's aten::hardtanh -> aten::clamp.out would
    hide a plugin's own aten::hardtanh.out kernel. Returns what it removed."""
    families = {op.partition(".")[0] for op in aten_ops}
    notes = []
    for framework_op, target, _ in _C.op_map():
        if framework_op.partition(".")[0] in families and target not in plugin_ops:
            _C.unregister_op(framework_op)
            notes.append(f"the op-mapping table routes {framework_op} to {target}, which would hide the plugin's "
                         "kernel: unmapped for this run")
    return notes


def write_markdown(report, path):
    c = report.counts()
    with open(path, "w") as f:
        f.write(f"# Conformance of plugin `{report.plugin}`\n\n`{report.path}`, PyTorch {torch.__version__}. "
                "Generated by `python3 -m npubridge conformance`: ATen ops against PyTorch's OpInfo samples on "
                "the CPU, the plugin's own ops against the reference of its tests file; every floating result "
                "judged by the error model (docs/plugin-authoring.md, \"How your kernels are judged\"), with "
                "the plugin alone enabled and each sample credited to its kernel only when that kernel served "
                "it.\n\n")
        f.write(f"**{c['passed']} op x dtype pairs passed, {c['failed']} failed, {c['not covered']} not "
                f"covered** ({report.seconds:.1f} s).\n\n")
        for e in report.errors:
            f.write(f"- error: {e}\n")
        for n in report.notes:
            f.write(f"- note: {n}\n")
        if report.errors or report.notes:
            f.write("\n")
        f.write("| op | dtype | result | kernel | samples | checks | source | detail |\n"
                "|---|---|---|---|---|---|---|---|\n")
        for x in report.cells:
            detail = x.reason.replace("|", "\\|").replace("\n", " ")
            f.write(f"| `{x.op}` | {x.dtype} | {x.status} | {x.plugin} {x.kernel} | {x.passed}/{x.samples}"
                    f"{f', {x.declined} declined' if x.declined else ''} | {', '.join(x.checks)} | "
                    f"{', '.join(x.sources)} | {detail} |\n")


def write_json(report, path):
    with open(path, "w") as f:
        json.dump({"plugin": report.plugin, "path": report.path, "torch": torch.__version__,
                   "seconds": round(report.seconds, 2), "summary": report.counts(), "errors": report.errors,
                   "notes": report.notes,
                   "results": [asdict(c) for c in report.cells]}, f, indent=1)


def print_report(report, out=print):
    for n in report.notes:
        out(f"note: {n}")
    for e in report.errors:
        out(f"ERROR {e}")
    for c in report.cells:
        if c.status == "failed":
            out(f"FAIL {c.plugin} {c.op} {c.dtype} [kernel {c.kernel}]: {c.reason}")
        elif c.status == "not covered":
            out(f"NOT COVERED {c.plugin} {c.op} {c.dtype}: {c.reason}")
        else:
            out(f"PASS {c.plugin} {c.op} {c.dtype} [kernel {c.kernel}]: {c.passed}/{c.samples} samples "
                f"({', '.join(c.checks)})" + (f"; {c.reason}" if c.reason else ""))
    out(report.summary())
