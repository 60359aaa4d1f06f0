"""PyTorch's OpInfo database on npu against the CPU, forward and backward,
with non-contiguous variants: float32 for every op, bfloat16 for the ops
plugin kernels serve at bfloat16. At least 90% of the ops pass at each
dtype, every failure is a known one, and every known one still fails (the
known-failures files only shrink, and must shrink when an op is fixed:
strict expected failures, as PyTorch's own xfail lists)."""
import pathlib

import pytest
import torch

import npubridge.opinfo as opinfo

HERE = pathlib.Path(__file__).parent
KNOWN = {torch.float32: HERE / "opinfo_known_failures.txt", torch.bfloat16: HERE / "opinfo_known_failures_bf16.txt"}


def known_failures(dtype):
    names = set()
    for line in KNOWN[dtype].read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            names.add(line.split("|")[0].strip())
    return names


@pytest.mark.parametrize("dtype, min_tested", [(torch.float32, 500), (torch.bfloat16, 300)],
                         ids=["float32", "bfloat16"])  # tests/CMakeLists.txt runs each on its own
def test_opinfo_floor_and_known_failures(dtype, min_tested):
    results = opinfo.run(max_samples=8, dtype=dtype)
    passed, tested = opinfo.summary(results)
    failed = {name: r["reason"] for name, r in results.items() if r["status"] == "fail"}
    new = {name: reason for name, reason in failed.items() if name not in known_failures(dtype)}
    assert not new, f"new {dtype} OpInfo failures on npu (fix them or, with a reason, list them):\n" + "\n".join(
        f"{n}: {r}" for n, r in sorted(new.items()))
    fixed = sorted(name for name in known_failures(dtype) if results.get(name, {}).get("status") == "pass")
    assert not fixed, (f"{dtype} OpInfo ops listed as known failures now pass on npu; remove them from "
                       f"{KNOWN[dtype].name}: " + ", ".join(fixed))
    assert tested > min_tested
    assert passed / tested >= 0.90, f"{passed}/{tested} {dtype} OpInfo ops pass on npu, below the 90% floor"
