"""npubridge.precision_check: every plugin kernel's outputs judged against
ATen's CPU kernels by npubridge's error model while it is on. Correct
kernels pass through a training step; the sloppy test plugin's float32
aten::neg.out (tests/plugins/sloppy_plugin.cpp, off by 1e-3) is caught,
listed with the op, the plugin, the output and the bound, counted in
npubridge.stats(), and raised when asked; off, nothing is judged. The
argument checks: tests/python/test_api_arguments.py."""
import os

import torch

import npubridge
from conftest import run_python


def test_precision_check_agrees_with_atens_cpu_kernels_on_a_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).to("npu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16).npu(), torch.randint(0, 4, (8,)).npu()
    npubridge.reset_stats()
    npubridge.precision_check(True, raise_on_mismatch=True)
    try:
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert npubridge.precision_mismatches() == []
    finally:
        npubridge.precision_check(False)
    stats = npubridge.stats()
    assert stats["aten::addmm.out"]["native"]["cann_like"] >= 2
    assert all(s.get("precision_mismatches", 0) == 0 for s in stats.values())


def test_precision_check_catches_a_wrong_kernel():
    # The sloppy test plugin serves aten::neg.out (float32) off by 1e-3.
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
x = torch.randn(64)
assert torch.allclose((-x.npu()).cpu(), -x, atol=2e-3)  # unchecked: runs, slightly wrong
npubridge.precision_check(True)
y = (-x.npu()).cpu()
m = npubridge.precision_mismatches()
assert len(m) == 1, m
m = m[0]
assert (m["op"], m["plugin"], m["output"]) == ("aten::neg.out", "sloppy", "argument 'out'"), m
assert m["mismatched"] == 64 and m["numel"] == 64, m
assert abs(m["abs_error"] - 1e-3) < 1e-5, m
assert "precision check failed for op 'aten::neg.out' (plugin 'sloppy')" in m["message"], m
assert "exceed their error bound" in m["message"] and "exact (" in m["message"], m  # neg computes nothing: exact
assert m["bound"] == 0, m
assert npubridge.stats()["aten::neg.out"]["precision_mismatches"] == 1
npubridge.precision_check(True, raise_on_mismatch=True)
try:
    -x.npu()
    raise SystemExit("no error")
except RuntimeError as e:
    assert "precision check failed for op 'aten::neg.out' (plugin 'sloppy')" in str(e), e
npubridge.precision_check(True)
(x.npu() @ x.npu().unsqueeze(1), x.npu().sum(), x.npu() * 3)  # accurate kernels pass, whatever their summation order
assert npubridge.precision_mismatches() == [], npubridge.precision_mismatches()
print("ok")
"""
    r = run_python(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_precision_check_on_and_off():
    """With the sloppy test plugin (its float32 aten::neg.out is off by 1e-3):
    off (the default), its calls are not judged; on without raising, each
    call returns the kernel's result and its mismatch is listed and counted;
    precision_check() starts a new list; off again, nothing is judged."""
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
x = torch.randn(64)
def counted():
    return npubridge.stats()["aten::neg.out"].get("precision_mismatches", 0)
def listed():
    return [(m["op"], m["plugin"], m["output"]) for m in npubridge.precision_mismatches()]
sloppy = (-x.npu()).cpu()
assert (sloppy + x - 1e-3).abs().max() < 1e-5, "the sloppy plugin's neg did not serve the call"
assert listed() == [] and counted() == 0, (listed(), counted())
npubridge.precision_check(True, raise_on_mismatch=False)
assert torch.equal((-x.npu()).cpu(), sloppy)  # judged, not raised, not replaced
assert listed() == [("aten::neg.out", "sloppy", "argument 'out'")] and counted() == 1, (listed(), counted())
(-x.npu()).cpu()
assert len(listed()) == 2 and counted() == 2, (listed(), counted())
npubridge.precision_check(False)
assert listed() == [], listed()
assert torch.equal((-x.npu()).cpu(), sloppy)
assert listed() == [] and counted() == 2, (listed(), counted())
npubridge.precision_check(True)
(-x.npu()).cpu()
assert listed() == [("aten::neg.out", "sloppy", "argument 'out'")] and counted() == 3, (listed(), counted())
print("ok")
"""
    r = run_python(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"])
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_precision_check_judges_the_compiled_path_and_names_what_it_cannot_judge():
    """One check for every path (the dispatcher's): a compiled program's
    kernel step of the sloppy aten::neg.out is caught as the eager call is;
    a plugin's own op, which PyTorch cannot run as a reference, keeps its
    kernel's result and is named once as not judged."""
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
x = torch.randn(64)
compiled = npubridge.compile(lambda t: -t)
npubridge.precision_check(True)
got = compiled(x.npu()).cpu()
assert (got + x - 1e-3).abs().max() < 1e-5, "the sloppy plugin's neg did not serve the compiled step"
m = [(m["op"], m["plugin"], m["output"]) for m in npubridge.precision_mismatches()]
assert m == [("aten::neg.out", "sloppy", "argument 'out'")], m
npubridge.precision_check(True)
g = torch.ones(8)
y, rstd = torch.ops.mindspeed_like.npu_rms_norm(x.reshape(8, 8).npu(), g.npu(), 1e-6)
y, rstd = torch.ops.mindspeed_like.npu_rms_norm(x.reshape(8, 8).npu(), g.npu(), 1e-6)
want = x.double().reshape(8, 8) * torch.rsqrt(x.double().reshape(8, 8).pow(2).mean(-1, keepdim=True) + 1e-6)
assert (y.cpu().double() - want).abs().max() < 1e-5
assert npubridge.precision_mismatches() == []
print("ok")
"""
    r = run_python(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"], NPUB_LOG_LEVEL="warn")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    unjudged = [line for line in r.stderr.splitlines() if "is not judged" in line]
    assert len(unjudged) == 1 and "precision check: op 'mindspeed_like::npu_rms_norm' is not judged: " in unjudged[0], \
        r.stderr


def test_precision_check_judges_in_place_calls_and_changes_nothing_it_should_not():
    """In-place calls (out= self) are judged from copies taken before the
    kernel ran: the sloppy neg_ is caught. A Python number operand takes the
    call's dtype in the float64 reference too (x + 0.1 is exact to float32's
    0.1, not 0.1): no false mismatch. A BatchNorm's running statistics move
    once per step, as without the check (the reference writes its own
    copies). A random op is not judged and its draws are the same as
    without the check."""
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
torch.manual_seed(0)
x = torch.randn(1000)
npubridge.precision_check(True)
y = x.npu()
y.neg_()
m = [(m["op"], m["plugin"], m["output"]) for m in npubridge.precision_mismatches()]
assert m == [("aten::neg.out", "sloppy", "argument 'out'")], m
npubridge.precision_check(True)
z = x.npu() + 0.1
z.add_(0.1)
(torch.full((10,), -0.1).npu() + 0.1).cpu()
assert npubridge.precision_mismatches() == [], npubridge.precision_mismatches()
def bn_stats(check):
    npubridge.precision_check(check)
    torch.manual_seed(1)
    bn = torch.nn.BatchNorm2d(4).npu().train()
    for _ in range(2):
        bn(torch.randn(2, 4, 3, 3).npu())
    return bn.running_mean.cpu(), bn.running_var.cpu()
(m_off, v_off), (m_on, v_on) = bn_stats(False), bn_stats(True)
assert torch.equal(m_off, m_on) and torch.equal(v_off, v_on), (m_off, m_on, v_off, v_on)
def draws(check):
    npubridge.precision_check(check)
    torch.npu.manual_seed(3)
    a = torch.empty(64, device="npu").uniform_()
    b = torch.empty(64, device="npu").normal_()
    return a.cpu(), b.cpu()
(a0, b0), (a1, b1) = draws(False), draws(True)
assert torch.equal(a0, a1) and torch.equal(b0, b1)
assert npubridge.precision_mismatches() == [], npubridge.precision_mismatches()
print("ok")
"""
    r = run_python(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"], NPUB_LOG_LEVEL="warn")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    unjudged = [line for line in r.stderr.splitlines() if "is not judged" in line]
    assert any("a random op: its reference would draw other numbers" in line for line in unjudged), r.stderr
