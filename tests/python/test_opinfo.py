"""PyTorch's OpInfo database on npu against the CPU, forward and backward,
with non-contiguous variants: float32 for every op, bfloat16 for the ops
plugin kernels serve at bfloat16. Every sample of an op is checked (a
failing one does not stop the op); at least 90% of the ops pass at each
dtype, and the run's failures are exactly the known ones, per sample and
reason (strict expected failures, as PyTorch's own xfail lists): a new
failure, a known one that now passes, fails for another reason or is no
longer run (skipped) fails the test, which prints the list's new lines.
The format of the lists: npubridge/conformance/known_failures.py."""
import pathlib

import pytest
import torch

import npubridge.conformance.known_failures as known_lists
import npubridge.conformance.opinfo as opinfo

HERE = pathlib.Path(__file__).parent
KNOWN = {torch.float32: HERE / "opinfo_known_failures.txt", torch.bfloat16: HERE / "opinfo_known_failures_bf16.txt"}


def known_failures(dtype):
    path = KNOWN[dtype]
    return known_lists.parse(path.read_text(), str(dtype)[6:], path.name)


@pytest.mark.parametrize("dtype, min_tested", [(torch.float32, 500), (torch.bfloat16, 300)],
                         ids=["float32", "bfloat16"])  # tests/CMakeLists.txt runs each on its own
def test_opinfo_floor_and_known_failures(dtype, min_tested):
    known = known_failures(dtype)  # a malformed list fails before the long run
    results = opinfo.run(max_samples=8, dtype=dtype)
    passed, tested = opinfo.summary(results)
    found = known_lists.problems(results, known, str(dtype)[6:])
    assert not found, (f"{dtype} OpInfo results on npu differ from {KNOWN[dtype].name} (fix the op or update "
                       "the list):\n" + "\n".join(found) + "\nthe run's failures, as entries:\n" +
                       "\n".join(known_lists.lines_for(results, str(dtype)[6:])))
    assert tested > min_tested
    assert passed / tested >= 0.90, f"{passed}/{tested} {dtype} OpInfo ops pass on npu, below the 90% floor"


def test_the_known_failure_lists_parse():
    for dtype in KNOWN:
        assert known_failures(dtype), KNOWN[dtype]


def test_every_sample_of_a_failing_op_is_checked():
    # native_group_norm at bfloat16 fails in the non-contiguous variant of
    # its first sample; the run used to stop at an op's first failure. Every
    # sample runs now, each failure recorded by sample id.
    results = opinfo.run(max_samples=8, ops={"native_group_norm"}, dtype=torch.bfloat16)
    op, r = "native_group_norm", results["native_group_norm"]
    assert r["samples"] == 8, (op, r)
    assert r["status"] == "fail" and r["failures"], (op, r)
    assert set(r["failures"]) <= set(r["checked"]) and len(r["checked"]) > len(r["failures"]), (op, r)
    for sample, reason in r["failures"].items():
        assert reason.split(":")[0].endswith("Error"), (op, sample, reason)


# The comparison with a list, on made-up results (no npu run).
LIST = """\
# comment
sort | bfloat16 | 0, 3nc | AssertionError: output 1 | ties
topk | bfloat16 | 2 | AssertionError: output 1 | ties
"""


def result(failures, checked, status=None):
    return {"status": status or ("fail" if failures else "pass"), "reason": "r", "samples": 8,
            "failures": failures, "checked": checked}


def test_a_run_matching_the_list_has_no_problems():
    known = known_lists.parse(LIST, "bfloat16")
    run = {"sort": result({"0": "AssertionError: output 1: error 1 > bound 0", "3nc": "AssertionError: output 1: x"},
                          ["0", "0nc", "1", "2", "3", "3nc"]),
           "topk": result({"2": "AssertionError: output 1: x"}, ["0", "1", "2"]), "add": result({}, ["0"])}
    assert known_lists.problems(run, known, "bfloat16") == []


def test_each_change_is_flagged_with_op_dtype_and_sample():
    known = known_lists.parse(LIST, "bfloat16")
    run = {"sort": result({"0": "RuntimeError: something else", "5": "AssertionError: output 0: y"},
                          ["0", "0nc", "3", "3nc", "5"]),
           "topk": result({}, [], status="skip"), "add": result({}, ["0"])}
    found = known_lists.problems(run, known, "bfloat16")
    assert any(p.startswith("new failure: sort bfloat16 sample 5: AssertionError") for p in found), found
    assert any(p.startswith("changed reason: sort bfloat16 sample 0 (line 2)") for p in found), found
    assert any(p.startswith("fixed: sort bfloat16 sample 3nc (line 2) now passes") for p in found), found
    assert any(p.startswith("turned into a skip: topk bfloat16 sample 2 (line 3)") for p in found), found
    assert len(found) == 4, found
    del run["topk"]
    assert "not run: topk bfloat16 sample 2 (line 3)" in known_lists.problems(run, known, "bfloat16")[-1]
    run["topk"] = result({"1": "AssertionError: output 1: x"}, ["0", "1"])  # sample 2 is gone
    found = known_lists.problems(run, known, "bfloat16")
    assert any(p.startswith("not run: topk bfloat16 sample 2 (line 3): the sample was not checked") for p in found)
    assert any(p.startswith("new failure: topk bfloat16 sample 1") for p in found)


@pytest.mark.parametrize("text, message", [
    ("sort | bfloat16 | 0 | AssertionError", "expected 'op | dtype | samples | reason | why'"),
    ("sort | float32 | 0 | AssertionError | ties", "sort: expected dtype bfloat16 (the file's) but found float32"),
    ("sort | bfloat16 | 0, x3 | AssertionError | ties", "sort: sample id 'x3': expected N, Nnc or 'samples'"),
    ("sort | bfloat16 | 0 | A | w\nsort | bfloat16 | 1, 0 | B | w", "list:2: sort sample 0 is listed twice (also line 1)"),
])
def test_a_malformed_list_is_refused_naming_the_line(text, message):
    with pytest.raises(ValueError, match=None) as err:
        known_lists.parse(text, "bfloat16", "list")
    assert message in str(err.value)


def test_lines_for_writes_entries_the_list_accepts():
    run = {"sort": result({"0": "AssertionError: output 1: error 0.5 > bound 0.01", "3nc": "AssertionError: output 1: "
                           "error 2.5 > bound 0.01", "6": "RuntimeError: boom"}, ["0", "3", "3nc", "6"])}
    lines = known_lists.lines_for(run, "bfloat16")
    assert lines == ["sort | bfloat16 | 0, 3nc | AssertionError: output 1: error | ?",
                     "sort | bfloat16 | 6 | RuntimeError: boom | ?"]
    assert known_lists.problems(run, known_lists.parse("\n".join(lines), "bfloat16"), "bfloat16") == []
