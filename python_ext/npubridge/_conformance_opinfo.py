"""ATen ops for `python3 -m npubridge conformance --plugin` (conformance.py):
PyTorch's OpInfo samples of every entry that may reach the op, forward,
backward and non-contiguous, each credited to the plugin's ops whose kernels
it reached."""
import itertools
import warnings
from typing import Dict, Tuple

import torch

from . import _C, opinfo
from ._conformance_isolate import Checkpoint
from ._conformance_verdict import _first_line, _phase, _to_float32, _tolerance, calibrated


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


def run_aten(cells, ops, probe, max_samples, log=print, checkpoint=None):
    """Runs the OpInfo samples of `ops` ({op: [declared dtype names]}), an
    OpInfo entry at one dtype a unit of `checkpoint`."""
    checkpoint = checkpoint or Checkpoint()
    db = opinfo.op_db()

    per_opinfo: Dict[str, Tuple[object, set]] = {}
    no_opinfo = {}
    mapped_from = {}
    for framework_op, target, _ in _C.op_map():
        mapped_from.setdefault(target, []).append(framework_op)

    def candidates(op, db):
        return opinfo_candidates(op, db, mapped_from.get(op, ()))

    for op, dtypes in ops.items():
        found = candidates(op, db)
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
            at_risk = []  # the cells this entry's samples are for
            for op in ops:
                if dtype_name in ops[op] and o in candidates(op, [o]):
                    tried.setdefault((op, dtype_name), []).append(name)
                    at_risk.append((op, dtype_name))
            unit = f"OpInfo {name} {dtype_name}"
            if checkpoint.skip(unit, at_risk):
                continue
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
                checkpoint.done(unit)
                continue
            for i, sample in enumerate(samples):
                sample = deterministic(sample)
                checkpoint.start(unit, at_risk, f"OpInfo {name}", f"sample {i}")
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i}",
                        _run_opinfo_sample(o, sample, backward, tol, probe))
                try:
                    variant = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample with no non-contiguous form
                    continue
                checkpoint.start(unit, at_risk, f"OpInfo {name}", f"sample {i} non-contiguous")
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i} non-contiguous",
                        _run_opinfo_sample(o, variant, False, tol, probe))
            checkpoint.done(unit)
    for (op, dtype_name), cell in cells.items():
        if op not in ops:
            continue
        if op in no_opinfo:
            why = no_opinfo[op]
        elif (op, dtype_name) not in tried:
            names = sorted({_opinfo_name(o) for o in candidates(op, db)})
            why = f"no OpInfo sample for {dtype_name} ({', '.join(names)} not defined for it on the CPU)"
        else:
            why = ("OpInfo samples of " + ", ".join(tried[(op, dtype_name)]) + " never reached the kernel "
                   "(the calls went to other ops)")
        cell.finish(why)
