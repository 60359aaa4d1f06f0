"""Crash and hang isolation for `python3 -m npubridge conformance --plugin`
(plugin.py): the run goes on in a child process, in units (an OpInfo
entry at one dtype, or one of the plugin's own ops at one dtype), and a
kernel that kills the process (a segfault, an abort, _exit) or never
returns is reported against the ops the unit was running, while the run
goes on in a new child from the next unit.

A child is forked from the process that runs the command (fork), which
has imported torch and npubridge but not started the runtime: each child
starts its own (Note [The runtime starts at the first npu use]) with the
plugin on NPUB_PLUGIN_PATH, as a new `python3 -m npubridge` process would,
without importing torch again. Where this process has started the runtime
(main() called by a program that used the npu), a forked child could not
use the npu (npu._is_in_bad_fork): the child is then the conformance
command with ``--child-state DIR`` in a new process (spawn).

The child writes DIR/progress.json before each sample (the unit, the (op,
dtype) cells its samples are for, the sample) and DIR/state.json after
each unit (every cell so far, the units done); the parent watches
progress.json and kills a child whose sample has not finished within the
timeout. When a child dies or is killed, the parent marks the cells of the
unit in flight "crashed" or "hung" (naming the sample, the signal or the
timeout), records the unit as done and starts a new child, which resumes
from state.json. Units are deterministic (sorted, seeded per unit), so a
resumed run checks what one process would have. Before forking a resumed
child, this process imports what the dead one had imported for the run
and each child would import again (SHARED_IMPORTS: PyTorch's OpInfo
database, seconds each time), once for all the children after it.
"""
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict

from .verdict import DIED, Cell

# Before the first sample: import torch, PyTorch's OpInfo database and the
# tests file, on a loaded machine.
SETUP_SECONDS = 600

# What a child may import for the run that takes seconds, which a forked
# child need not import again when this process has (fork, above).
SHARED_IMPORTS = ("torch.testing._internal.common_methods_invocations",)


def _shared_imports():
    return [name for name in SHARED_IMPORTS if name in sys.modules]


class Checkpoint:
    """In process: nothing recorded, every unit runs."""

    def setup(self, report_head, cells):
        pass

    def skip(self, unit, at_risk):
        return False

    def start(self, unit, at_risk, source, label):
        pass

    def done(self, unit):
        pass


def _write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class ChildCheckpoint(Checkpoint):
    """In the child: resumes from DIR/state.json, records progress and state."""

    def __init__(self, directory):
        self.dir = directory
        self.cells, self.head, self.done_units, self.seq = {}, {}, [], 0

    def setup(self, report_head, cells):
        self.cells, self.head = cells, dict(report_head)
        state = _read(os.path.join(self.dir, "state.json"))
        if state is not None:
            self.done_units = state["done"]
            for saved in state["cells"]:
                cell = cells.get((saved["op"], saved["dtype"]))
                if cell is not None:
                    cell.__dict__.update(Cell(**saved).__dict__)
        self._save()

    def _save(self):
        _write(os.path.join(self.dir, "state.json"),
               {**self.head, "done": self.done_units, "cells": [asdict(c) for c in self.cells.values()],
                "imported": _shared_imports()})

    def skip(self, unit, at_risk):
        if unit in self.done_units:
            return True
        # Every cell the unit is for already died: its samples would only
        # kill the process again.
        return bool(at_risk) and all(self.cells[k].status in DIED for k in at_risk if k in self.cells)

    def start(self, unit, at_risk, source, label):
        self.seq += 1
        _write(os.path.join(self.dir, "progress.json"),
               {"unit": unit, "at_risk": [list(k) for k in at_risk], "source": source, "label": label,
                "seq": self.seq, "imported": _shared_imports()})

    def done(self, unit):
        self.done_units.append(unit)
        self._save()


class _Forked:
    """A child forked from this process that runs child(directory) and
    exits with its status (1 and the traceback when it raises), as
    subprocess.Popen's poll, kill, wait and returncode see it."""

    def __init__(self, child, directory):
        sys.stdout.flush()
        sys.stderr.flush()
        # As the gc module's documentation advises before a fork without
        # exec: what this process holds (torch, npubridge) is never
        # traversed again by a collection, the child's or this process's
        # (at its exit too), and stays shared with the child.
        gc.freeze()
        self.pid, self.returncode = os.fork(), None
        if self.pid == 0:
            status = 1
            try:
                child(directory)
                status = 0
            except SystemExit as e:  # sys.exit(code) in the run (a tests file's): as the interpreter exits
                status = e.code if isinstance(e.code, int) else int(e.code is not None)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - the traceback, as of an uncaught exception
                traceback.print_exc()
            finally:
                # os._exit: no interpreter shutdown, which would run this
                # process's atexit handlers and finalizers a second time;
                # the child's runtime and its threads end with it.
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(status)

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self):
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def fork(child):
    """Starts children forked from this process, each running
    child(directory) (the run with a ChildCheckpoint(directory), then
    write_final): for run_isolated, where this process has not started the
    runtime. A resumed child finds imported what the one before it had
    (SHARED_IMPORTS)."""

    def start(directory):
        for module in (_read(os.path.join(directory, "state.json")) or {}).get("imported", []):
            if module in SHARED_IMPORTS:
                importlib.import_module(module)
        return _Forked(child, directory)

    return start


def spawn(command):
    """Starts children that run `command` (the conformance command line,
    --child-state DIR appended) in new processes: for run_isolated."""
    return lambda directory: subprocess.Popen(list(command) + ["--child-state", directory])


def _watch(proc, progress_path, timeout):
    """Waits for the child; returns (None | "crashed" | "hung", detail)."""
    last, since = None, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.1)
        try:
            with open(progress_path) as f:
                now_text = f.read()
        except OSError:
            now_text = None
        if now_text != last:
            last, since = now_text, time.monotonic()
        limit = timeout if now_text else max(timeout, SETUP_SECONDS)
        if time.monotonic() - since > limit:
            proc.kill()
            proc.wait()
            return "hung", f"no result within {limit:g} s"
    rc = proc.returncode
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "unknown"
        return "crashed", f"the process died with signal {-rc} ({name})"
    if rc != 0:
        return "crashed", f"the process exited with status {rc}"
    return None, ""


def run_isolated(start, timeout, log=print):
    """Runs children, each started by start(DIR) (fork or spawn, above),
    until one finishes; returns the report's fields: plugin, path, cells
    (Cell), errors, notes, deaths."""
    with tempfile.TemporaryDirectory(prefix="npub-conformance-") as d:
        progress_path, final_path = os.path.join(d, "progress.json"), os.path.join(d, "final.json")
        deaths = []
        while True:
            for p in (progress_path, final_path):
                if os.path.exists(p):
                    os.remove(p)
            proc = start(d)
            status, detail = _watch(proc, progress_path, timeout)
            final = _read(final_path)
            if status is None and final is not None:
                return _fields(final, deaths)
            state, progress = _read(os.path.join(d, "state.json")), _read(progress_path)
            if status is None:
                status, detail = "crashed", "the process ended without a report"
            if state is None or progress is None or progress["unit"] in state["done"]:
                where = "before the first sample" if progress is None else "outside a sample"
                fields = _fields(state or {"plugin": "?", "path": "", "cells": [], "errors": [], "notes": []},
                                 deaths)
                fields["errors"].append(f"the conformance run {status} {where} ({detail}); it cannot go on")
                return fields
            at_risk = [tuple(k) for k in progress["at_risk"]]
            ops = sorted({op for op, _ in at_risk})
            dtype = ", ".join(sorted({dt for _, dt in at_risk}))
            also = f" (the sample is for {', '.join(ops)})" if len(ops) > 1 else ""
            if status == "hung":
                message = (f"hung: {detail} in {progress['source']} {progress['label']} ({dtype}){also}; "
                           "killed, the run went on in a new process")
            else:
                message = (f"crashed: {detail} in {progress['source']} {progress['label']} ({dtype}){also}; "
                           "the run went on in a new process")
            for saved in state["cells"]:
                if (saved["op"], saved["dtype"]) in at_risk:
                    cell = Cell(**saved)
                    cell.died(status, message)
                    saved.update(asdict(cell))
            state["done"].append(progress["unit"])
            state["imported"] = sorted(set(state.get("imported", [])) | set(progress.get("imported", [])))
            _write(os.path.join(d, "state.json"), state)
            deaths.append(f"{', '.join(ops)} {dtype}: {message}")
            log(f"note: {', '.join(ops)} {dtype} {status} in {progress['source']} {progress['label']}; "
                "going on in a new process")


def _fields(data, deaths):
    return {"plugin": data.get("plugin", "?"), "path": data.get("path", ""),
            "cells": [Cell(**c) for c in data.get("cells", [])], "errors": list(data.get("errors", [])),
            "notes": list(data.get("notes", [])), "deaths": deaths}


def write_final(directory, report):
    _write(os.path.join(directory, "final.json"),
           {"plugin": report.plugin, "path": report.path, "cells": [asdict(c) for c in report.cells],
            "errors": report.errors, "notes": report.notes})
