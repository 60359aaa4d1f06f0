"""torch.autograd.profiler.profile(use_device="npu") (Note [Profiled device
time is the stream's], python_ext/csrc/runtime/profiler_stubs.cpp): every
op's CPU and device times are real and non-negative, nested ops' times add
up, and the totals are plausible against the wall clock."""
import time
import warnings

import torch

import npubridge  # noqa: F401


def _profile(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback notices are not what is tested
        torch.npu.synchronize()
        start = time.perf_counter()
        with torch.autograd.profiler.profile(use_device="npu") as prof:
            fn()
        wall_us = (time.perf_counter() - start) * 1e6
    return prof, wall_us


def _work():
    x = torch.randn(512, 512, device="npu")
    for _ in range(3):
        y = x @ x
        z = (y + x).relu()
    return z.cpu()


def test_every_npu_op_has_a_non_negative_device_time_and_a_real_cpu_time():
    prof, wall_us = _profile(_work)
    events = prof.function_events
    names = {e.name for e in events}
    assert {"aten::mm", "aten::add", "aten::relu"} <= names
    for e in events:
        assert 0 <= e.cpu_time_total <= wall_us, (e.name, e.cpu_time_total)
        assert e.device_time_total >= 0, (e.name, e.device_time_total)
        assert e.self_device_time_total >= 0, (e.name, e.self_device_time_total)
        assert e.self_cpu_time_total >= 0, (e.name, e.self_cpu_time_total)
    # The products do real work: the device saw it.
    mms = [e for e in events if e.name == "aten::mm"]
    assert len(mms) == 3
    assert all(e.device_time_total > 0 for e in mms)


def test_device_times_nest_and_the_totals_are_plausible():
    prof, wall_us = _profile(_work)
    events = prof.function_events
    for e in events:
        # A parent's events enclose its children's on the same stream (the
        # times are rounded to microseconds one by one: 1 us per child).
        children = e.cpu_children
        assert e.device_time_total + len(children) >= sum(c.device_time_total for c in children), e.name
    top = [e for e in events if e.cpu_parent is None]
    device_total = sum(e.device_time_total for e in top)
    assert 0 < device_total <= wall_us
    # A 512^3 product is ~0.27 GFLOP: well over 10 us on any CPU, and each
    # matmul's device time covers its mm.
    for e in events:
        if e.name == "aten::matmul":
            (mm,) = [c for c in e.cpu_children if c.name == "aten::mm"]
            assert e.device_time_total >= mm.device_time_total > 10
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
    row = next(line for line in table.splitlines() if line.strip().startswith("aten::mm "))
    assert "-" not in row  # no negative figure in the summary table


def test_profiling_another_device_and_a_side_stream():
    def work():
        s = torch.npu.Stream(1)
        with torch.npu.device(1), torch.npu.stream(s):
            a = torch.randn(256, 256, device="npu:1")
            (a @ a).sum().item()

    prof, wall_us = _profile(work)
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == 1 and 0 < mm[0].device_time_total <= wall_us
    assert all(e.device_time_total >= 0 for e in prof.function_events)
