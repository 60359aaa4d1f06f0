"""Fails when a committed coverage report (docs/coverage/<plugin>.md) is not
what the conformance run of this build wrote (<build>/coverage/...md): a
kernel added, fixed or broken since the report was generated.

    coverage_current.py COMMITTED.md FRESH.md

Compared: the summary line (its timing aside) and, per row of the table,
the op, dtype, result and samples. Other columns (detail, timings) may
differ between machines. Regenerate the reports with ./scripts/coverage.sh.
Standard library only.
"""
import re
import sys

KEYS = ("plugin", "op", "dtype")
VALUES = ("result", "samples")


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def read(path):
    """(summary, {row key: row values}) of one report."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    summary = next((l for l in lines if l.startswith("**")), "")
    summary = re.sub(r"\s*\([0-9.]+ s\)", "", summary)
    rows, header = {}, None
    for line in lines:
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if set(line) <= set("|-: "):
            continue
        row = dict(zip(header, cells))
        key = tuple(row.get(k, "") for k in KEYS)
        rows[key] = tuple(row.get(v, "") for v in VALUES)
    return summary, rows


def main(committed, fresh):
    old_summary, old = read(committed)
    new_summary, new = read(fresh)
    if not new:
        print(f"{fresh}: no rows: the conformance run wrote no table", file=sys.stderr)
        return 2
    problems = []
    if old_summary != new_summary:
        problems.append(f"summary: committed {old_summary!r}, this build {new_summary!r}")
    for key in sorted(set(old) | set(new)):
        name = " ".join(k for k in key if k)
        if key not in new:
            problems.append(f"{name}: in the committed report, not in this build's")
        elif key not in old:
            problems.append(f"{name}: {'/'.join(new[key])} in this build, not in the committed report")
        elif old[key] != new[key]:
            problems.append(f"{name}: committed {'/'.join(old[key])}, this build {'/'.join(new[key])}")
    if problems:
        print(f"{committed} is stale ({len(problems)} difference(s) from {fresh}); regenerate it with "
              "./scripts/coverage.sh:", file=sys.stderr)
        for p in problems[:40]:
            print(f"  {p}", file=sys.stderr)
        if len(problems) > 40:
            print(f"  ... and {len(problems) - 40} more", file=sys.stderr)
        return 1
    print(f"{committed}: current ({len(new)} rows)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
