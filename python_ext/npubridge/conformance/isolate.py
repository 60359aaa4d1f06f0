"""Crash and hang isolation for `python3 -m npubridge conformance --plugin`
(plugin.py): the run goes on in a child process, in units (an OpInfo
entry at one dtype, or one of the plugin's own ops at one dtype), and a
kernel that kills the process (a segfault, an abort, _exit) or never
returns is reported against the ops the unit was running, while the run
goes on in a new child from the next unit.

The child (``--child-state DIR``) writes DIR/progress.json before each
sample (the unit, the (op, dtype) cells its samples are for, the sample) and
DIR/state.json after each unit (every cell so far, the units done); the
parent watches progress.json and kills a child whose sample has not
finished within the timeout. When a child dies or is killed, the parent
marks the cells of the unit in flight "crashed" or "hung" (naming the
sample, the signal or the timeout), records the unit as done and starts a
new child, which resumes from state.json. Units are deterministic (sorted,
seeded per unit), so a resumed run checks what one process would have.
"""
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict

from .verdict import DIED, Cell

# Before the first sample: import torch, PyTorch's OpInfo database and the
# tests file, on a loaded machine.
SETUP_SECONDS = 600


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
               {**self.head, "done": self.done_units, "cells": [asdict(c) for c in self.cells.values()]})

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
                "seq": self.seq})

    def done(self, unit):
        self.done_units.append(unit)
        self._save()


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


def run_isolated(child_command, timeout, log=print):
    """Runs `child_command` (the conformance command, to which
    --child-state DIR is appended) until a child finishes; returns the
    report's fields: plugin, path, cells (Cell), errors, notes, deaths."""
    with tempfile.TemporaryDirectory(prefix="npub-conformance-") as d:
        progress_path, final_path = os.path.join(d, "progress.json"), os.path.join(d, "final.json")
        deaths = []
        while True:
            for p in (progress_path, final_path):
                if os.path.exists(p):
                    os.remove(p)
            proc = subprocess.Popen(list(child_command) + ["--child-state", d])
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
