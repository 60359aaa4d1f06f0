"""npu work in torch.profiler traces (docs/graph-mode.md, "Profiling"): each
plugin kernel run, each fallback and each dtype conversion is a slice of its
own (python_ext/csrc/runtime/profiler_trace.cpp, from the dispatcher's trace
hooks), nested in time under its torch op on the same thread, in the JSON
export_chrome_trace writes (the Chrome trace format Perfetto opens)."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity

import npubridge  # noqa: F401

# torch names PrivateUse1 after the backend once it is renamed ("npu").
NPU_ACTIVITY = getattr(ProfilerActivity, "NPU", None) or ProfilerActivity.PrivateUse1

# The exported timestamps are microseconds with three decimals: containment
# is checked to that rounding (1 ns).
EPS_US = 1e-3
# The CPU events are stamped on an approximate clock converted to wall time
# (c10::ApproximateClockToUnixTimeConverter); the npu track on wall time.
DEVICE_EPS_US = 5.0


def _work():
    a = torch.randn(64, 64, device="npu")
    b = torch.randn(64, 64, device="npu")
    y = a @ b                                          # a cann_like kernel
    # cann_like's convolution is float32 only: a half call is converted.
    img = torch.randn(1, 2, 6, 6, device="npu").half()
    wt = torch.randn(3, 2, 3, 3, device="npu").half()
    w = torch.nn.functional.conv2d(img, wt)
    f = torch.special.i1e(torch.randn(8, device="npu"))  # no kernel: the host fallback
    torch.npu.synchronize()
    return y, w, f


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    _work()  # warm-up: first calls trace meta kernels and caches
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, NPU_ACTIVITY]) as prof:
        _work()
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        doc = json.load(f)  # valid JSON: what Perfetto's Chrome-trace importer reads
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _enclosing_op(events, s):
    """The innermost cpu_op slice on s's thread that contains s in time."""
    best = None
    for e in events:
        if e is s or e.get("cat") != "cpu_op" or e["tid"] != s["tid"] or e["pid"] != s["pid"]:
            continue
        if e["ts"] <= s["ts"] + EPS_US and s["ts"] + s["dur"] <= e["ts"] + e["dur"] + EPS_US:
            if best is None or e["dur"] < best["dur"]:
                best = e
    return best


def _slices(events, prefix):
    """The host slices (user_annotation) whose name starts with prefix."""
    return [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(prefix)]


def test_every_slice_has_a_non_negative_duration(trace):
    assert trace
    for e in trace:
        assert e["dur"] >= 0, e


def test_a_plugin_kernel_is_a_slice_under_its_torch_op(trace):
    [k] = _slices(trace, "cann_like: aten::mm")
    assert k["cat"] == "user_annotation"
    op = _enclosing_op(trace, k)
    assert op is not None and op["name"] == "aten::mm", op
    assert k["dur"] <= op["dur"] + EPS_US


def test_a_dtype_conversion_is_its_own_slice_beside_the_kernel(trace):
    ins = _slices(trace, "convert: float16->float32")
    outs = _slices(trace, "convert: float32->float16")
    assert ins and outs
    [k] = _slices(trace, "cann_like: aten::convolution_overrideable")
    op = _enclosing_op(trace, k)
    assert op is not None and op["name"] == "aten::convolution_overrideable", op
    # Inputs converted before the kernel, the result after it, all inside the op.
    before = [c for c in ins if _enclosing_op(trace, c) is op]
    after = [c for c in outs if _enclosing_op(trace, c) is op]
    assert len(before) == 1 and len(after) == 1
    assert before[0]["ts"] + before[0]["dur"] <= k["ts"] + EPS_US
    assert k["ts"] + k["dur"] <= after[0]["ts"] + EPS_US


def test_a_fallback_is_its_own_slice_under_its_torch_op(trace):
    [fb] = _slices(trace, "fallback: aten::special_i1e")
    op = _enclosing_op(trace, fb)
    assert op is not None and op["name"] == "aten::special_i1e", op



def test_the_npu_track_repeats_each_slice_inside_its_host_slice(trace):
    # With the NPU activity, kineto's session of the npu profiler
    # (runtime/profiler_kineto.cpp) logs every slice again as a device
    # activity ("kernel" events) on the npu's track (pid = device index).
    host = [e for e in trace if e.get("cat") == "user_annotation" and ": " in e["name"]]
    device = [e for e in trace if e.get("cat") == "kernel"]
    assert sorted(e["name"] for e in device) == sorted(e["name"] for e in host)
    assert {e["pid"] for e in device} == {0}
    # Each is stamped between its host slice's begin and end, on the same
    # clock (Note [One clock for both tracks]); DEVICE_EPS_US covers the
    # conversion of the profiler's approximate CPU clock to wall time.
    for d in device:
        assert any(h["name"] == d["name"] and h["ts"] - DEVICE_EPS_US <= d["ts"]
                   and d["ts"] + d["dur"] <= h["ts"] + h["dur"] + DEVICE_EPS_US for h in host), d
