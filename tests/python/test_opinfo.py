"""PyTorch's OpInfo database on npu against the CPU (float32, forward and
backward, with non-contiguous variants): at least 90% of the ops pass, and
every failure is a known one (tests/python/opinfo_known_failures.txt)."""
import pathlib

import npubridge.opinfo as opinfo

KNOWN = pathlib.Path(__file__).with_name("opinfo_known_failures.txt")


def known_failures():
    names = set()
    for line in KNOWN.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            names.add(line.split("|")[0].strip())
    return names


def test_opinfo_floor_and_known_failures():
    results = opinfo.run(max_samples=8)
    passed, tested = opinfo.summary(results)
    failed = {name: r["reason"] for name, r in results.items() if r["status"] == "fail"}
    new = {name: reason for name, reason in failed.items() if name not in known_failures()}
    assert not new, "new OpInfo failures on npu (fix them or, with a reason, list them):\n" + "\n".join(
        f"{n}: {r}" for n, r in sorted(new.items()))
    assert tested > 500
    assert passed / tested >= 0.90, f"{passed}/{tested} OpInfo ops pass on npu, below the 90% floor"
