"""One plugin's conformance run (the package's docstring says what is
checked): the plugin alone enabled, its ops split into ATen ops (aten.py)
and its own (custom.py), in this process or in isolated children
(isolate.py)."""
import importlib
import importlib.util
import os
import re
import sys
import time
from typing import Dict, List, Tuple

from .. import _C, testing
from . import opinfo
from .aten import opinfo_candidates, run_aten, unknown_to_aten
from .custom import run_custom
from .isolate import Checkpoint, run_isolated
from .report import Report
from .verdict import Cell, Probe, first_line, kernel_key

# The dtypes a kernel declaring "any" is run with.
ANY_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")


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


def _has_opinfo(op):
    return bool(opinfo_candidates(op, opinfo.op_db()))


def run(path, wanted_ops=(), tests=(), max_samples=8, log=print, checkpoint=None):
    """The report of the plugin at `path`, in this process. `checkpoint`
    (isolate.py) records the run's progress for a parent that
    isolates crashes and hangs (run_isolated), and resumes a run."""
    start = time.time()
    checkpoint = checkpoint or Checkpoint()
    errors = []
    plugin = find_plugin(path)
    if plugin is None:
        # The loader's messages read "plugin '<path>' rejected: <reason>",
        # with the path as NPUB_PLUGIN_PATH gave it (absolute after the
        # re-exec) or resolved.
        names = {path, os.path.abspath(path), os.path.realpath(path)}
        rejected = [f for f in _C.load_failures() if any(f.startswith(f"plugin '{n}'") for n in names)]
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
    # The tests file is read first: it may also declare samples and a
    # reference for an ATen op PyTorch's OpInfo database has no entry for
    # (aten::_fused_adamw_), which then runs as the plugin's own ops do.
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
            errors.append(f"the tests file {f} failed to import: {first_line(e)}")
            loaded = False
    declared = testing.registered()
    aten, custom = {}, {}
    for op in chosen:
        by_dtype = {}
        for k in sorted(kernels[op], key=lambda k: -k["priority"]):
            for d in _dtype_names(k["dtypes"]):
                by_dtype.setdefault(d, kernel_key(k))
        for d, key in by_dtype.items():
            cells[(op, d)] = Cell(op=op, dtype=d, plugin=name, kernel=key)
        if op.startswith("aten::") and op in declared and not _has_opinfo(op):
            custom[op] = list(by_dtype)
        elif op.startswith("aten::"):
            why = unknown_to_aten(op)
            if why:
                for d in by_dtype:
                    cells[(op, d)].finish(why)
                continue
            aten[op] = list(by_dtype)
        else:
            custom[op] = list(by_dtype)

    notes = _unmap_hiding_entries(aten, kernels)
    checkpoint.setup({"plugin": name, "path": path, "errors": errors, "notes": notes}, cells)
    probe = Probe(name, kernels)
    if aten:
        run_aten(cells, aten, probe, max_samples, log, checkpoint)
    if custom:
        derivatives = {d["op"]: d for d in _C.derivatives() if d["plugin"] == name}
        if loaded or testing.registered():
            run_custom(cells, custom, probe, max_samples, derivatives, where, log, checkpoint)
        for (op, _), cell in cells.items():
            if op in custom and cell.status == "not covered" and not cell.reason:
                cell.finish("the tests file failed to import")
    ordered = sorted(cells.values(), key=lambda c: (c.op, c.dtype))
    return Report(name, path, ordered, errors, time.time() - start, notes)


def run_in_child(start_child, timeout, log=print):
    """The report of a run in child processes, each started by
    start_child(DIR) (isolate.fork or isolate.spawn), a crash or hang
    reported against the op (run_isolated)."""
    start = time.time()
    f = run_isolated(start_child, timeout, log)
    cells = sorted(f["cells"], key=lambda c: (c.op, c.dtype))
    return Report(f["plugin"], f["path"], cells, f["errors"], time.time() - start, f["notes"])


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
