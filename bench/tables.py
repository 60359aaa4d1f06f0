"""The benchmark tables of README.md and docs/*.md, written from the results
files (bench/results/*.json) so that a published figure is always the
committed run's.

    python3 bench/tables.py            # rewrite every generated region
    python3 bench/tables.py --check    # exit 1 naming each stale region

A generated region is

    <!-- bench-table:NAME begin -->
    ... (written by this script: do not edit) ...
    <!-- bench-table:NAME end -->

where NAME is one of TABLES below (the same NAME may appear in several
files). Everything between the two markers is replaced; prose outside them
must not quote figures: it points at the table. Standard library only, and
no npubridge import, so the check runs on any Python 3.
"""
import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_GLOBS = ("README.md", "docs/*.md", "docs/*/*.md")
BEGIN = "<!-- bench-table:{} begin -->"
END = "<!-- bench-table:{} end -->"
MARKER = re.compile(r"<!-- bench-table:([A-Za-z0-9_-]+) (begin|end) -->")
NOTE = "<!-- written by bench/tables.py from {}: edit the script or rerun the bench, not this table -->"


class TableError(Exception):
    """A results file or a document this script cannot use (exit 2)."""


# --- formatting -------------------------------------------------------------

def ms(x):
    """Milliseconds with three significant digits or so (no exponent)."""
    if x >= 100:
        return f"{x:.0f} ms"
    if x >= 10:
        return f"{x:.1f} ms"
    return f"{x:.2f} ms"


def times(x):
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def pct(x):
    return f"{100 * x:.0f}%"


def size(n):
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def gbps(x):
    return f"{x:.3g} GB/s" if x >= 1 else f"{1000 * x:.3g} MB/s"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def field(data, path, what):
    """data[path[0]][path[1]]...; a TableError naming the file and the key if absent."""
    cur = data
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            raise TableError(f"{what}: no {'.'.join(str(p) for p in path)} (written by an older or "
                             f"different bench? rerun it)") from None
    return cur


# --- one function per table: (results data, file name) -> markdown ---------

def cann_table(d, src):
    peaks = field(d, ["ceiling"], src)
    rows, met = [], 0
    for i, r in enumerate(field(d, ["results"], src)):
        get = lambda k: field(r, [k], f"{src}: results[{i}]")  # noqa: E731
        ratio, target, unit, rate = get("ratio"), get("target"), get("unit"), get("rate")
        ok = ratio <= target
        met += ok
        if unit == "GFLOP/s":
            peak = peaks.get("bf16_gflops") if " bf16 " in f" {get('name')} " and peaks.get("bf16_gflops") \
                else peaks.get("fp32_gflops")
            of_peak = pct(rate / peak) if peak else "n/a"
            shown = f"{rate:.0f} GFLOP/s"
        else:
            # Memory-bound rows: no bound is measured (bench/machine_ceiling.h).
            of_peak = "n/a"
            shown = f"{rate:.1f} {unit}"
        rows.append([get("name"), ms(get("npu_ms")), ms(get("torch_ms")), f"{ratio:.2f}",
                     f"<= {target:g}", "met" if ok else "**missed**", shown, of_peak])
    results = field(d, ["results"], src)
    intro = (f"One run of `./scripts/bench.sh cann` (`{src}`): {field(d, ['threads'], src)} threads on "
             f"each side, torch {field(d, ['torch'], src)}; each time is the median of its calls, made in "
             f"three blocks that alternate with the other side's. Ratio = npu time / PyTorch time (lower "
             f"is better; the stress row: 4 host threads' time / one thread's, both on npu); "
             f"targets met: {met} of {len(results)}. \"of peak\" is the rate against the compute peak "
             f"the bench measures first on the same threads "
             f"({peaks.get('isa', '?')}: fp32 FMA {peaks.get('fp32_gflops', 0):.0f} GFLOP/s, bf16 dot "
             f"products {peaks.get('bf16_gflops', 0):.0f} GFLOP/s); memory-bound cases have no "
             f"measured bound (n/a).")
    return intro + "\n\n" + table(
        ["case", "npu", "PyTorch", "ratio", "target", "", "rate", "of peak"], rows)


def clients_table(d, src):
    rows = []
    for i, r in enumerate(field(d, ["results"], src)):
        get = lambda k: field(r, [k], f"{src}: results[{i}]")  # noqa: E731
        ratio, target, fallbacks = get("ratio"), get("target"), get("fallbacks_per_step")
        verdict = "" if target is None else ("met" if ratio <= target else "**missed**")
        rows.append([get("name"), ms(get("npu_ms")), ms(get("cpu_ms")), f"{ratio:.2f}",
                     "" if target is None else f"<= {target:g}", verdict,
                     sum(fallbacks.values())])
    intro = (f"One run of `./scripts/bench.sh clients` (`{src}`): transformers "
             f"{field(d, ['transformers'], src)}, torch {field(d, ['torch'], src)}, "
             f"{field(d, ['threads'], src)} threads; a step is timed from the Trainer's step begin to its end "
             f"(npu synchronised), the median of {field(d, ['steps'], src)} steps after "
             f"{field(d, ['warmup'], src)} of warm-up per run; {field(d, ['rounds'], src)} rounds of an npu run "
             f"and a CPU run (`use_cpu=True`), the two going first in turn. Times are the medians of the rounds; "
             f"ratio = the median of the rounds' npu time / CPU time (lower is better; shown rounded: a ratio "
             f"shown as 1.20 may be just over the target).")
    return intro + "\n\n" + table(["Trainer step", "npu", "CPU", "ratio", "target", "", "CPU fallbacks per step"],
                                   rows)


def _sample_text(block, settle_ms=None):
    if not block:
        return "the two timed back to back in each sample"
    lead = ("one untimed step" if settle_ms is None else
            f"untimed steps (at least one, and at least {settle_ms:g} ms of them)")
    return (f"a sample being a block of {block} timed steps on each device in turn, each block after {lead} "
            f"(Note [Samples are blocks of steps, the devices in turn], bench/bench_models.py)")


def models_table(d, src):
    rows = []
    for i, r in enumerate(field(d, ["results"], src)):
        get = lambda k: field(r, [k], f"{src}: results[{i}]")  # noqa: E731
        kind = "compiled" if get("compiled") else "eager"
        rows.append([get("case"), kind, ms(get("npu_ms")), ms(get("cpu_ms")), f"{get('ratio'):.2f}",
                     f"{sum(get('fallbacks').values()):g}"])
    slowest = field(d, ["slowest"], src)
    breakdown = field(slowest, ["breakdown"], src)
    ops = [[o["key"], f"{o['cpu_calls']:g} / {o['npu_calls']:g}", f"{o['cpu_us'] / 1e3:.2f} ms",
            f"{o['npu_us'] / 1e3:.2f} ms", f"{o['lost_us'] / 1e3:+.2f} ms"]
           for o in field(breakdown, ["ops"], src)]
    intro = (f"One run of `./scripts/bench.sh models` (`{src}`): torch {field(d, ['torch'], src)}, transformers "
             f"{field(d, ['transformers'], src)}, {field(d, ['cpu_threads'], src)} CPU threads and "
             f"{field(d, ['npu_threads'], src)} npu compute threads; per case the median over "
             f"{field(d, ['samples'], src)} samples (after {field(d, ['warmup'], src)} steps of warm-up) of the "
             f"ratio npu step / CPU step, {_sample_text(d.get('block', 0), d.get('settle_ms'))}. Compiled: "
             f"`torch.compile(backend=\"npu\")` against Inductor on the CPU. Eager geometric mean: "
             f"**{field(d, ['eager_geomean'], src):.2f}** (lower is better; the target is 0.85, every case <= 1.0).")
    per_op = (f"Where the slowest eager case, {field(slowest, ['case'], src)} (npu "
              f"{field(breakdown, ['npu_step_ms'], src):.1f} ms, CPU {field(breakdown, ['cpu_step_ms'], src):.1f} ms), "
              f"loses its time (`python3 -m npubridge profile-compare bench/bench_models.py "
              f"{field(slowest, ['case'], src)}`; self time per step, the largest losses, then the large gains: "
              f"an op each device runs under its own name, such as the CPU's `aten::mkldnn_convolution` and npu's "
              f"`aten::convolution_overrideable`, shows as one of each):")
    return (intro + "\n\n" + table(["case", "", "npu", "CPU", "ratio", "CPU fallbacks per step"], rows) + "\n\n" +
            per_op + "\n\n" + table(["op", "calls CPU / npu", "CPU", "npu", "npu loses"], ops))


def graph_table(d, src):
    def speed_row(label, part, eager_key, fast_key, ratio_key):
        p = field(d, [part], src)
        inductor = ""
        if "inductor_cpu_ms" in p:
            inductor = (f"{ms(p['inductor_cpu_ms'])} (ours at "
                        f"{times(field(p, ['speedup_vs_inductor_cpu'], src))} its speed)")
        return [label, ms(field(p, [eager_key], src)), ms(field(p, [fast_key], src)),
                times(field(p, [ratio_key], src)), f">= {field(p, ['target'], src):g}x",
                "met" if field(p, ["met"], src) else "**missed**", inductor]

    mem = field(d, ["train_step_peak_memory"], src)
    rows = [
        speed_row("forward", "forward", "eager_npu_ms", "compiled_npu_ms", "speedup_vs_eager"),
        speed_row("training step (forward, loss, backward, SGD)", "train_step", "eager_npu_ms",
                  "compiled_npu_ms", "speedup_vs_eager"),
        speed_row("one-token decode, NPUGraph replay", "decode_step", "eager_npu_ms", "replay_ms", "speedup"),
        ["peak memory of the training step", f"{field(mem, ['eager_bytes'], src) / 1e6:.2f} MB",
         f"{field(mem, ['compiled_bytes'], src) / 1e6:.2f} MB", times(field(mem, ["ratio"], src)),
         f"<= {field(mem, ['target'], src):g}x", "met" if field(mem, ["met"], src) else "**missed**", ""],
    ]
    quick = " A `--quick` run: small sizes, not for publishing." if d.get("quick") else ""
    intro = (f"`./scripts/bench.sh graph` (`{src}`, run {field(d, ['date'], src)[:10]}, torch "
             f"{field(d, ['torch'], src)}, {field(d, ['threads'], src)} threads; the tiny Llama of the "
             f"tests; ratios of samples interleaved in one run).{quick}")
    return intro + "\n\n" + table(
        ["", "eager npu", "compiled / replayed npu", "speed-up", "target", "", "Inductor on the CPU"], rows)


def dist_table(d, src):
    cfg = field(d, ["config"], src)
    rows = []
    for i, r in enumerate(field(d, ["allreduce"], src)):
        get = lambda k: field(r, [k], f"{src}: allreduce[{i}]")  # noqa: E731
        if get("target") is None:
            target = verdict = ""
        else:
            target = f">= {get('target'):g}x"
            verdict = "met" if get("ratio") >= get("target") else "**missed**"
        rows.append([size(get("bytes")), gbps(get("gloo_busbw_GBps")), gbps(get("npu_busbw_GBps")),
                     times(get("ratio")), times(get("ratio_nocheck")), target, verdict])
    intro = (f"`./scripts/bench.sh dist` (`{src}`): {field(cfg, ['world_size'], src)} ranks, "
             f"{field(cfg, ['threads_per_rank'], src)} compute thread each, on one "
             f"{field(cfg, ['machine_cpus'], src)}-core machine, {field(cfg, ['transport'], src)}, torch "
             f"{field(cfg, ['torch'], src)}{'; a --quick run' if cfg.get('quick') else ''}. Allreduce bus "
             f"bandwidth, {field(cfg, ['dtype'], src)}; the last ratio with the signature check off "
             f"(`NPUB_DIST_CHECK=0`):")
    ddp_rows = []
    for i, r in enumerate(field(d, ["ddp"], src)):
        get = lambda k: field(r, [k], f"{src}: ddp[{i}]")  # noqa: E731
        ddp_rows.append([f"{get('backend')} ({get('device').split(':')[0]} tensors)", ms(get("one_rank_ms")),
                         ms(get("ddp_ms")), times(get("speedup_2_over_1")),
                         times(get("compute_scaling_2_over_1")), ms(get("comm_at_end_allreduce_ms")),
                         pct(get("overlap_fraction"))])
    grad_mb = field(d, ["ddp", 0, "gradient_bytes"], src) / 1e6
    ddp_intro = (f"DDP step of {field(cfg, ['model'], src)}, {grad_mb:.1f} MB of gradients; \"compute "
                 f"alone\" is what the 2 ranks' compute gains without communication, \"hidden\" the share "
                 f"of the allreduce (measured alone at the end of backward) that DDP hides behind it:")
    return (intro + "\n\n" + table(["size", "Gloo, CPU tensors", "npu", "npu / Gloo", "without check",
                                    "target", ""], rows)
            + "\n\n" + ddp_intro + "\n\n"
            + table(["backend", "1 rank", "2 ranks", "speed-up", "compute alone", "allreduce", "hidden"],
                    ddp_rows))


TABLES = {
    "cann": ("bench/results/cann.json", cann_table),
    "clients": ("bench/results/clients.json", clients_table),
    "models": ("bench/results/models.json", models_table),
    "graph": ("bench/results/graph.json", graph_table),
    "dist": ("bench/results/dist.json", dist_table),
}


# --- documents ---------------------------------------------------------------

def render(name, root):
    src, fn = TABLES[name]
    path = os.path.join(root, src)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TableError(f"{src}: missing (bench-table '{name}' is generated from it; "
                         f"./scripts/bench.sh writes it)") from None
    except json.JSONDecodeError as e:
        raise TableError(f"{src}: not valid JSON ({e})") from None
    return NOTE.format(src) + "\n" + fn(data, src) + "\n"


def documents(root):
    seen = []
    for pattern in DOC_GLOBS:
        for p in sorted(glob.glob(os.path.join(root, pattern))):
            if p not in seen:
                seen.append(p)
    return seen


def regenerate(text, rel, root, cache):
    """(new text, [names of the regions that changed]) for one document."""
    out, changed, pos, open_name = [], [], 0, None
    for m in MARKER.finditer(text):
        name, kind = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if kind == "begin":
            if open_name is not None:
                raise TableError(f"{rel}:{line}: bench-table '{name}' begins inside '{open_name}'")
            if name not in TABLES:
                raise TableError(f"{rel}:{line}: unknown bench-table '{name}' (known: {', '.join(TABLES)})")
            if not text.endswith("\n", 0, m.end() + 1):
                raise TableError(f"{rel}:{line}: the begin marker of '{name}' must end its line")
            out.append(text[pos:m.end() + 1])
            pos, open_name = m.end() + 1, name
        else:
            if open_name != name:
                raise TableError(f"{rel}:{line}: end of bench-table '{name}' without its begin")
            if name not in cache:
                cache[name] = render(name, root)
            new = "\n" + cache[name] + "\n"
            if text[pos:m.start()] != new:
                changed.append(name)
            out.append(new)
            pos, open_name = m.start(), None
    if open_name is not None:
        raise TableError(f"{rel}: bench-table '{open_name}' has no end marker")
    out.append(text[pos:])
    return "".join(out), changed


def run(root, check, out=sys.stdout, err=sys.stderr):
    """0: every region current (or rewritten); 1: --check found stale regions; 2: an error."""
    cache, used, stale, writes = {}, set(), [], []
    try:
        for path in documents(root):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            new, changed = regenerate(text, rel, root, cache)
            used.update(m.group(1) for m in MARKER.finditer(text))
            for name in changed:
                stale.append(f"{rel}: bench-table '{name}' differs from {TABLES[name][0]}")
            if changed:
                writes.append((path, new))
        unused = [n for n in TABLES if n not in used]
        if unused:
            raise TableError(f"no document has a region for bench-table {', '.join(repr(n) for n in unused)} "
                             f"(expected {BEGIN.format(unused[0])} ... {END.format(unused[0])} in "
                             f"{' or '.join(DOC_GLOBS)})")
    except TableError as e:
        print(f"bench/tables.py: {e}", file=err)
        return 2
    if not check:
        for path, new in writes:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    if check and stale:
        for s in stale:
            print(f"bench/tables.py: stale: {s}", file=err)
        print("bench/tables.py: run `python3 bench/tables.py` and commit the documents", file=err)
        return 1
    for s in stale:
        print(f"rewrote {s.split(':')[0]} (bench-table {s.split(chr(39))[1]})", file=out)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a region is stale")
    ap.add_argument("--root", default=ROOT, help="the source tree (default: this script's)")
    a = ap.parse_args(argv)
    return run(a.root, a.check)


if __name__ == "__main__":
    sys.exit(main())
