"""The same step profiled on the CPU and on npu, matched op by op and sorted by
the time npu loses: where a model step's difference between the two devices
comes from.

    python3 -m npubridge profile-compare SCRIPT [ARGS...] [--steps N] [--top K] [--shapes] [--json OUT]

SCRIPT is a Python file that defines

    def make_step(device, *args):
        ...build the model and its inputs on `device` ("cpu" or "npu")...
        return step            # a callable running one step (no arguments)

ARGS are passed to make_step as strings. Both steps run in this process, with
the same number of intra-op threads (torch.get_num_threads()); each is warmed
up, then profiled for N steps (torch.profiler, CPU activity: npubridge's
kernels run inline on the calling thread, so an aten op's self time on npu is
its dispatch, conversions and kernel together). The table has one row per
ATen op (per op and input shapes with --shapes): calls and self time per
step on each device, and what npu loses; "(outside ops)" is the step's wall
time no op accounts for (Python, the autograd engine). npu's fallbacks to the
CPU during the profiled steps are listed per op, from npubridge.stats().
"""
import dataclasses
import importlib.util
import json
import os
import statistics
import time

import torch

import npubridge


@dataclasses.dataclass
class OpRow:
    key: str
    cpu_calls: float = 0.0
    npu_calls: float = 0.0
    cpu_us: float = 0.0  # self time per step
    npu_us: float = 0.0
    fallbacks: float = 0.0  # per step

    @property
    def lost_us(self):
        return self.npu_us - self.cpu_us


@dataclasses.dataclass
class Comparison:
    rows: list  # OpRow, sorted by lost time, largest first
    cpu_step_ms: float
    npu_step_ms: float
    steps: int
    threads: int

    @property
    def ratio(self):
        return self.npu_step_ms / self.cpu_step_ms


def _sync(device):
    if device == "npu":
        torch.npu.synchronize()


def _profile(step, device, steps, shapes):
    """Per key: (calls, self µs) summed over `steps` profiled steps, and the
    median wall time of a step (ms) measured in the same profiled run."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=shapes) as prof:
        wall_ms = _timed(step, device, steps)
    per_key = {}
    slices = tuple(f"{p['name']}: " for p in npubridge.plugins())
    for e in prof.events():
        owner = e
        # npubridge's kernel slices ("cann_like: aten::mm.out") nest in the
        # ATen op that dispatched them: their time is that op's.
        while owner.name.startswith(slices) and owner.cpu_parent is not None:
            owner = owner.cpu_parent
        key = owner.name + (f" {owner.input_shapes}" if shapes and owner.input_shapes else "")
        calls, us = per_key.get(key, (0, 0.0))
        per_key[key] = (calls + (owner is e), us + e.self_cpu_time_total)
    return per_key, wall_ms


def _timed(step, device, steps):
    """The median wall time of `steps` steps (ms), the device synchronised
    at both ends of each."""
    walls = []
    for _ in range(steps):
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        walls.append(time.perf_counter() - t)
    walls.sort()
    return 1e3 * walls[len(walls) // 2]


SETTLE_S = 0.025  # untimed lead-in of a block: longer than libgomp's spin after a CPU loop (7-9 ms)


def time_blocks(npu_step, cpu_step, blocks, block=3, settle_s=SETTLE_S, counts=None):
    """Per block (npu s, cpu s): the mean time of `block` steps on each
    device in turn, each device's block after untimed steps (at least one,
    and at least `settle_s` of them), so that the other device's threads
    (PyTorch's OpenMP worker spins for several milliseconds after a CPU
    loop) and cache contents are not charged to it; which device goes first
    alternates, so that a slow spell falls on both. block == 0: single
    steps, no untimed step (bench_models --per-step). `counts`, a dict,
    gets each device's number of steps run (timed and untimed) added."""
    out = []
    for i in range(blocks):
        pair = {}
        sides = (("npu", npu_step), ("cpu", cpu_step))
        for device, step in sides if i % 2 == 0 else sides[::-1]:
            timed = max(block, 1)
            ran = timed
            if block:
                t = time.perf_counter()
                step()
                _sync(device)
                ran += 1
                while time.perf_counter() - t < settle_s:
                    step()
                    _sync(device)
                    ran += 1
            _sync("npu")
            t = time.perf_counter()
            for _ in range(timed):
                step()
            _sync(device)
            if counts is not None:
                counts[device] = counts.get(device, 0) + ran
            pair[device] = (time.perf_counter() - t) / timed
        out.append((pair["npu"], pair["cpu"]))
    return out


def compare(make_step, args=(), steps=5, warmup=2, shapes=False):
    """Profiles make_step("cpu", *args)() and make_step("npu", *args)();
    returns a Comparison. Step times are measured unprofiled (the profiler's
    own cost per op is not the same on both devices)."""
    cpu_step, npu_step = make_step("cpu", *args), make_step("npu", *args)
    for _ in range(warmup):
        cpu_step()
        npu_step()
    _sync("npu")
    # Unprofiled step times, in blocks (time_blocks); an odd number of them,
    # so that the median is one of them.
    pairs = time_blocks(npu_step, cpu_step, max(3, (steps + 2) // 3) | 1)
    cpu_ops, cpu_prof_ms = _profile(cpu_step, "cpu", steps, shapes)
    npubridge.reset_stats()
    npu_ops, npu_prof_ms = _profile(npu_step, "npu", steps, shapes)
    fallbacks = {}
    for op, s in npubridge.stats().items():
        if s["fallbacks"]:
            name = op.split(".")[0]  # aten::foo.overload -> the profiler's aten::foo
            fallbacks[name] = fallbacks.get(name, 0) + s["fallbacks"]
    rows = {}
    for side, ops in (("cpu", cpu_ops), ("npu", npu_ops)):
        for key, (calls, us) in ops.items():
            row = rows.setdefault(key, OpRow(key))
            setattr(row, f"{side}_calls", calls / steps)
            setattr(row, f"{side}_us", us / steps)
    for row in rows.values():
        row.fallbacks = fallbacks.get(row.key.split(" ")[0], 0) / steps
    for side, ops, wall in (("cpu", cpu_ops, cpu_prof_ms), ("npu", npu_ops, npu_prof_ms)):
        inside = sum(us for _, us in ops.values()) / steps
        outside = rows.setdefault("(outside ops)", OpRow("(outside ops)"))
        setattr(outside, f"{side}_us", max(0.0, 1e3 * wall - inside))
    ordered = sorted(rows.values(), key=lambda r: r.lost_us, reverse=True)
    return Comparison(ordered, 1e3 * statistics.median(c for _, c in pairs),
                      1e3 * statistics.median(n for n, _ in pairs), steps, torch.get_num_threads())


def _shown(cmp, top):
    """The `top` largest losses, then the large gains (an op of one device
    that the other runs under another name shows as one of each)."""
    return cmp.rows[:top] + [r for r in cmp.rows[top:] if r.lost_us < -200]


def format_table(cmp, top=25):
    lines = [f"step: cpu {cmp.cpu_step_ms:.2f} ms, npu {cmp.npu_step_ms:.2f} ms, npu/cpu {cmp.ratio:.2f} "
             f"({cmp.steps} steps each, {cmp.threads} threads; per-op figures are self time per step, profiled)",
             f"{'op':52} {'calls cpu/npu':>14} {'cpu µs':>9} {'npu µs':>9} {'lost µs':>9}  fallbacks/step"]
    shown = _shown(cmp, top)
    for r in shown:
        calls = f"{r.cpu_calls:g}/{r.npu_calls:g}"
        fb = f"{r.fallbacks:g}" if r.fallbacks else ""
        lines.append(f"{r.key[:52]:52} {calls:>14} {r.cpu_us:9.0f} {r.npu_us:9.0f} {r.lost_us:9.0f}  {fb}")
    rest = cmp.rows[top:]
    if rest:
        lines.append(f"{'(' + str(len(rest)) + ' more ops)':52} {'':>14} {sum(r.cpu_us for r in rest):9.0f} "
                     f"{sum(r.npu_us for r in rest):9.0f} {sum(r.lost_us for r in rest):9.0f}")
    return "\n".join(lines)


def to_json(cmp, top=25):
    return {"cpu_step_ms": cmp.cpu_step_ms, "npu_step_ms": cmp.npu_step_ms, "ratio": cmp.ratio,
            "steps": cmp.steps, "threads": cmp.threads,
            "ops": [dict(dataclasses.asdict(r), lost_us=r.lost_us) for r in _shown(cmp, top)]}


def load_script(path):
    """The make_step of a script file; a clear error when it has none."""
    if not os.path.isfile(path):
        raise SystemExit(f"npubridge profile-compare: {path}: no such file")
    spec = importlib.util.spec_from_file_location("_npub_profiled_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make_step = getattr(module, "make_step", None)
    if not callable(make_step):
        raise SystemExit(f"npubridge profile-compare: {path} defines no make_step(device, *args) "
                         "(it returns a callable that runs one step on the device)")
    return make_step


def main(args):
    make_step = load_script(args.script)
    cmp = compare(make_step, tuple(args.args), steps=args.steps, warmup=args.warmup, shapes=args.shapes)
    print(format_table(cmp, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(cmp, args.top), f, indent=1)
    return 0
