"""A plugin's own ops under PyTorch (torch.ops.<plugin>.<op>, from
mindspeed_like, vllm_like and cann_like): computed on npu as their
references compute them on the CPU, differentiated through the plugin's
derivative formulas, and traced through fake kernels made from its meta
functions (meta and fake tensors, torch.library.opcheck, torch.compile,
torch.export); an op whose schema PyTorch refuses is disabled alone."""
import pytest
import torch
import torch.nn.functional as F

import npubridge
from conftest import assert_judged, assert_matches, run_python


def test_plugin_ops_appear_under_torch_ops():
    torch.npu.init()  # the plugins' ops are routed when the runtime starts
    assert set(npubridge.routed_ops()["custom"]) >= {"mindspeed_like::npu_rms_norm", "vllm_like::silu_and_mul",
                                                      "cann_like::conv2d_bias_relu"}
    x, g = torch.randn(2, 3, 16), torch.randn(16)
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(x.npu(), g.npu(), 1e-6)
    assert_matches(y, lambda v, w: v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, g)
    assert_matches(rstd, lambda v: torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6), x)
    inp = torch.randn(4, 32)
    out = torch.empty(4, 16, device="npu")
    torch.ops.vllm_like.silu_and_mul(out, inp.npu())
    assert_matches(out, lambda v: F.silu(v[:, :16]) * v[:, 16:], inp)
    xc, w, b = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    yc = torch.ops.cann_like.conv2d_bias_relu(xc.npu(), w.npu(), b.npu(), [1, 1], [1, 1], [1, 1], 1)
    assert_matches(yc, lambda v, k, c: F.relu(F.conv2d(v, k, c, padding=1)), xc, w, b)


def _rms_norm_reference(x, g, eps=1e-6):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * g, rstd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plugin_op_autograd_comes_from_the_plugins_derivative_formula(dtype):
    assert "mindspeed_like::npu_rms_norm" in [d["op"] for d in npubridge._C.derivatives()]
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    g = torch.randn(16, dtype=dtype, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    gn = g.detach().npu().requires_grad_()
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(xn, gn)
    # The oracle: PyTorch's own autograd through the formula, in float64.
    x64, g64 = x.detach().double().requires_grad_(), g.detach().double().requires_grad_()
    y64, _ = _rms_norm_reference(x64, g64)
    dy = torch.randn(3, 5, 16, dtype=dtype)
    (y * dy.npu()).sum().backward()
    (y64 * dy.double()).sum().backward()
    # Judged by the error model (conftest.assert_judged): the same formula's
    # autograd on the CPU in `dtype` calibrates the bound.
    y_host, _ = _rms_norm_reference(x, g)
    (y_host * dy).sum().backward()
    assert_judged(xn.grad, x.grad, x64.grad, "d x")
    assert_judged(gn.grad, g.grad, g64.grad, "d gamma")
    assert npubridge.stats()["mindspeed_like::npu_rms_norm_backward"]["native"]["mindspeed_like"] >= 1
    # Only the second output reaches the loss: the backward gets zeros for dy.
    xn.grad = None
    _, rstd = torch.ops.mindspeed_like.npu_rms_norm(xn, gn)
    rstd.sum().backward()
    assert xn.grad is not None and torch.count_nonzero(xn.grad.cpu()) == 0


def test_plugin_ops_have_fake_kernels_for_compile_and_export():
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Meta tensors and fake tensors: shapes from the plugin's meta function.
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(torch.empty(3, 5, 8, device="meta"), torch.empty(8, device="meta"))
    assert (y.shape, rstd.shape, rstd.dtype) == ((3, 5, 8), (3, 5, 1), torch.float32)
    with FakeTensorMode():
        y, rstd = torch.ops.mindspeed_like.npu_rms_norm(torch.empty(2, 8, dtype=torch.bfloat16, device="npu"),
                                                        torch.empty(8, dtype=torch.bfloat16, device="npu"))
        assert (y.shape, y.dtype, y.device, rstd.dtype) == ((2, 8), torch.bfloat16, torch.device("npu:0"), torch.float32)
    # The meta function rejects what the kernel rejects, with its message.
    with pytest.raises(RuntimeError, match=r"npu_rms_norm' \(plugin 'mindspeed_like'\): gamma: expected the trailing shape"):
        torch.ops.mindspeed_like.npu_rms_norm(torch.empty(3, 8, device="meta"), torch.empty(7, device="meta"))
    with pytest.raises(RuntimeError, match=r"silu_and_mul.*out: expected shape \[3, 8\] but found \[3, 9\]"):
        torch.ops.vllm_like.silu_and_mul(torch.empty(3, 9, device="meta"), torch.empty(3, 16, device="meta"))

    # PyTorch's own custom-op checker: schema, fake tensor and AOT dispatch
    # (its autograd-registration check supports only CPU/CUDA/XPU devices).
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    x, g = torch.randn(4, 8).npu().requires_grad_(), torch.randn(8).npu().requires_grad_()
    r = torch.library.opcheck(torch.ops.mindspeed_like.npu_rms_norm.default, (x, g), test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r
    r = torch.library.opcheck(torch.ops.vllm_like.silu_and_mul.default,
                              (torch.empty(3, 8).npu(), torch.randn(3, 16).npu()), test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r
    xc, w, b = torch.randn(1, 3, 8, 8).npu(), torch.randn(4, 3, 3, 3).npu(), torch.randn(4).npu()
    r = torch.library.opcheck(torch.ops.cann_like.conv2d_bias_relu.default, (xc, w, b, [2, 2], [1, 1], [1, 1], 1),
                              test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            y, _ = torch.ops.mindspeed_like.npu_rms_norm(x, self.w)
            return (y * 2).sum()

    m = Block().npu()
    xx = torch.randn(4, 8).npu()
    eager = m(xx)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)(xx)
    torch.testing.assert_close(compiled.cpu(), eager.cpu())
    ep = torch.export.export(m, (xx,))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.mindspeed_like.npu_rms_norm.default in targets
    torch.testing.assert_close(ep.module()(xx).cpu(), eager.cpu())


def test_an_op_pytorch_refuses_is_disabled_alone():
    # refused::named takes a Dimname, a type PyTorch's schema parser refuses
    # outside ATen: npubridge accepts the schema, PyTorch does not. That op is disabled with
    # a warning naming it, its plugin and PyTorch's reason; import torch and
    # the plugin's other op work.
    import os

    code = """
import torch, npubridge
x = torch.arange(3.0).npu()  # plugin ops exist under torch.ops once the runtime started
print(torch.ops.refused.twice(x).cpu().tolist())
"""
    r = run_python(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_REFUSED_PLUGIN_DIR"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "[0.0, 2.0, 4.0]", r.stdout + r.stderr
    assert ("op 'refused::named' of plugin 'refused' is not available under PyTorch: PyTorch refuses its schema"
            in r.stderr), r.stderr
    assert "unknown type specifier" in r.stderr, r.stderr
