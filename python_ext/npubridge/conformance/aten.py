"""A plugin's ATen ops for `python3 -m npubridge conformance --plugin`
(plugin.py): PyTorch's OpInfo samples of every entry that may reach the op,
forward, backward and non-contiguous, run by the OpInfo runner
(opinfo.run_sample), each credited to the plugin's ops whose kernels it
reached."""
import itertools
import warnings
from typing import Dict, Tuple

import torch

from .. import _C
from . import opinfo
from .isolate import Checkpoint
from .judge import tolerance
from .opinfo import opinfo_name
from .verdict import first_line


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
        name = opinfo_name(o)
        if name in opinfo.SKIPPED or name.startswith(opinfo.SKIPPED_PREFIXES):
            continue
        keys = {o.name, o.name.split(".")[-1], getattr(o, "aten_name", None),
                getattr(o, "aten_backward_name", None)}
        keys |= {a.name.split(".")[-1] for a in getattr(o, "aliases", ())}
        if keys & bases or o.name in hinted:
            found.append(o)
    return found


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
            entry = per_opinfo.setdefault(opinfo_name(o), (o, set()))
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
            tol = tolerance(dtype)
            torch.manual_seed(0)  # sample inputs are random: make the run repeatable
            deterministic = opinfo.DETERMINISTIC.get(name, lambda s: s)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    samples = list(itertools.islice(o.sample_inputs("cpu", dtype, requires_grad=backward), max_samples))
            except Exception as e:  # noqa: BLE001 - PyTorch's sample generator failed for this dtype
                log(f"note: OpInfo {name} has no samples for {dtype_name}: {first_line(e)}")
                checkpoint.done(unit)
                continue
            for i, sample in enumerate(samples):
                sample = deterministic(sample)
                checkpoint.start(unit, at_risk, f"OpInfo {name}", f"sample {i}")
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i}",
                        opinfo.run_sample(o, sample, backward, tol, probe))
                try:
                    variant = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample with no non-contiguous form
                    continue
                checkpoint.start(unit, at_risk, f"OpInfo {name}", f"sample {i} non-contiguous")
                _credit(cells, dtype_name, f"OpInfo {name}", f"sample {i} non-contiguous",
                        opinfo.run_sample(o, variant, False, tol, probe))
            checkpoint.done(unit)
    for (op, dtype_name), cell in cells.items():
        if op not in ops:
            continue
        if op in no_opinfo:
            why = no_opinfo[op]
        elif (op, dtype_name) not in tried:
            names = sorted({opinfo_name(o) for o in candidates(op, db)})
            why = f"no OpInfo sample for {dtype_name} ({', '.join(names)} not defined for it on the CPU)"
        else:
            why = ("OpInfo samples of " + ", ".join(tried[(op, dtype_name)]) + " never reached the kernel "
                   "(the calls went to other ops)")
        cell.finish(why)
