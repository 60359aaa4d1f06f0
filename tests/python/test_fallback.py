"""Calls no plugin serves run on the CPU, their results on the npu (Note
[One way to the CPU], python_ext/csrc/aten/fallback.cpp): npubridge.stats()
counts each op's native calls and fallbacks, the ops of a disabled plugin
fall back, a call the dispatcher falls back returns on the npu whatever its
first operand, and NPUB_FALLBACK=error makes a fallback an error."""
import warnings

import torch

import npubridge
from conftest import assert_matches, run_python


def test_statistics_count_native_calls_and_fallbacks():
    npubridge.reset_stats()
    a = torch.randn(5).npu()
    (a + a).cpu()
    torch.tan(a).cpu()  # no plugin serves tan: CPU fallback
    s = npubridge.stats()
    assert s["aten::add.out"]["native"]["cann_like"] >= 1
    assert s["aten::tan"]["fallbacks"] >= 1 if "aten::tan" in s else s["aten::tan.out"]["fallbacks"] >= 1


def test_plugin_control():
    names = [p["name"] for p in npubridge.plugins()]
    assert "cann_like" in names
    a = torch.randn(4, 4).npu()
    npubridge.disable_plugin("cann_like")
    try:
        npubridge.reset_stats()
        assert_matches(a @ a, lambda v: v @ v, a.cpu())
        assert npubridge.stats()["aten::mm.out"]["fallbacks"] == 1
    finally:
        npubridge.enable_plugin("cann_like")


def test_a_call_the_dispatcher_falls_back_returns_on_the_npu():
    # With no eligible kernel (optimisation level 0 disables every plugin), a
    # CPU scalar first operand used to bring the result back on the CPU
    # (Note [One way to the CPU]).
    x = torch.arange(4.0, device="npu")
    npubridge.set_optim_level(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f, expect in [(lambda: torch.mul(torch.tensor(3.0), x), [0.0, 3, 6, 9]),
                              (lambda: torch.add(torch.tensor(3.0), x), [3.0, 4, 5, 6]),
                              (lambda: torch.tensor(2.0) - x, [2.0, 1, 0, -1])]:
                r = f()
                assert r.device == x.device
                assert r.cpu().tolist() == expect
    finally:
        npubridge.set_optim_level(2)


def test_fallback_error_mode():
    r = run_python("import torch, npubridge\ntorch.tan(torch.ones(3).npu())", NPUB_FALLBACK="error")
    assert r.returncode != 0
    assert "aten::tan" in r.stderr and "NPUB_FALLBACK=error" in r.stderr
