"""Known OpInfo failures on npu (tests/python/opinfo_known_failures*.txt)
and their comparison with a run of opinfo.run: strict expected failures,
per sample.

An entry is one line, ``op | dtype | samples | reason | why``:

- op: the OpInfo name as opinfo.run gives it (name.variant_test_name);
- dtype: float32 or bfloat16, the dtype of the run the file is for;
- samples: comma-separated ids of the failing checks: ``N`` (sample N of the
  op's sample_inputs, 0-based: forward and backward), ``Nnc`` (its
  non-contiguous variant), ``samples`` (PyTorch's sample generator raised);
- reason: text every listed check's recorded reason must contain (the
  exception type and the start of its message);
- why: the cause, in words (not matched).

One op may have several entries (checks failing for different reasons);
a check is listed once. Blank lines and lines starting with # are ignored.

Against a run, each of these is a problem, reported with the op, the dtype
and the sample: a failing check no entry lists (new), a listed check that
fails for another reason (changed), passes (fixed: remove it), or did not
run (the op was skipped, or the sample refused or gone: update the entry).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    op: str
    dtype: str
    sample: str
    reason: str
    why: str
    line: int


def _valid_id(s):
    return s == "samples" or s.isdigit() or (s.endswith("nc") and s[:-2].isdigit())


def parse(text, dtype, where="the known-failures file"):
    """{(op, sample id): Known} of the file's text; ValueError naming the
    line for a malformed entry or one of another dtype."""
    entries = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in line.split("|", 4)]
        if len(fields) != 5 or not all(fields[:4]):
            raise ValueError(f"{where}:{n}: expected 'op | dtype | samples | reason | why' but found {line!r}")
        op, line_dtype, samples, reason, why = fields
        if line_dtype != dtype:
            raise ValueError(f"{where}:{n}: {op}: expected dtype {dtype} (the file's) but found {line_dtype}")
        for s in (s.strip() for s in samples.split(",")):
            if not _valid_id(s):
                raise ValueError(f"{where}:{n}: {op}: sample id {s!r}: expected N, Nnc or 'samples'")
            if (op, s) in entries:
                raise ValueError(f"{where}:{n}: {op} sample {s} is listed twice (also line {entries[(op, s)].line})")
            entries[(op, s)] = Known(op, line_dtype, s, reason, why, n)
    return entries


def problems(results, known, dtype):
    """What differs between a run (opinfo.run's results) and the known
    failures: a list of messages, empty when the run is as listed."""
    out = []
    for op, r in sorted(results.items()):
        if r["status"] != "fail":
            continue
        for sample, reason in r["failures"].items():
            k = known.get((op, sample))
            if k is None:
                out.append(f"new failure: {op} {dtype} sample {sample}: {reason}")
            elif k.reason not in reason:
                out.append(f"changed reason: {op} {dtype} sample {sample} (line {k.line}): expected a reason "
                           f"containing {k.reason!r} but found {reason!r}")
    for (op, sample), k in sorted(known.items()):
        r = results.get(op)
        if r is None:
            out.append(f"not run: {op} {dtype} sample {sample} (line {k.line}): opinfo.run has no result for "
                       "the op (gone from op_db, or no longer defined for the dtype)")
        elif r["status"] == "skip":
            out.append(f"turned into a skip: {op} {dtype} sample {sample} (line {k.line}): the op was skipped "
                       f"({r['reason']})")
        elif sample in r["failures"]:
            continue
        elif sample in r.get("checked", ()):
            out.append(f"fixed: {op} {dtype} sample {sample} (line {k.line}) now passes: remove it from the list")
        else:
            out.append(f"not run: {op} {dtype} sample {sample} (line {k.line}): the sample was not checked "
                       f"(refused on both sides, or the op has fewer samples: {r['samples']} compared)")
    return out


def lines_for(results, dtype):
    """Entries listing exactly the failures of a run, one per op and
    reason (the exception type and the message up to its first number other
    than the output's index: the error model's figures vary by sample),
    for updating a list from real results; `why` is left to fill in."""
    import re

    grouped = {}
    for op, r in sorted(results.items()):
        if r["status"] != "fail":
            continue
        for sample, reason in r["failures"].items():
            stem = re.split(r"(?<!output )(?<![\w.])-?[0-9]|\|", reason, maxsplit=1)[0]
            stem = stem.rstrip(" ([{:,'\"")[:120]
            grouped.setdefault((op, stem), []).append(sample)
    return [f"{op} | {dtype} | {', '.join(samples)} | {stem} | ?" for (op, stem), samples in grouped.items()]
