"""npubridge.mindspeed's functional wrappers: the same kernels as
torch.ops.mindspeed_like.*, with torch_npu's argument order and defaults,
and autograd through the plugin's derivatives. The kernels themselves are
judged by the plugin's conformance file; here, only that the wrappers pass
the arguments through."""
import functools

import pytest
import torch

import npubridge
import npubridge.mindspeed as ms
from npubridge.mindspeed import functional


def needs(op):
    """The test fails (never skips) when mindspeed_like's `op` cannot run: the
    plugin is built with the extension, so a missing op is a broken build."""
    def decorate(test):
        @functools.wraps(test)
        def checked(*args, **kwargs):
            reason = functional.missing_reason(op)
            assert reason is None, reason
            return test(*args, **kwargs)
        return checked
    return decorate


def _npu(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).to("npu").requires_grad_(grad)


@needs("npu_rms_norm")
def test_npu_rms_norm_is_the_op_and_backprops():
    x, g = _npu(3, 5, 8, grad=True), _npu(8, grad=True)
    y, rstd = ms.npu_rms_norm(x, g)
    y2, rstd2 = torch.ops.mindspeed_like.npu_rms_norm(x, g, 1e-6)
    assert torch.equal(y.cpu(), y2.cpu()) and torch.equal(rstd.cpu(), rstd2.cpu()) and rstd.dtype == torch.float32
    assert not torch.equal(ms.npu_rms_norm(x, g, epsilon=10.0)[0].cpu(), y.cpu())
    y.sum().backward()
    assert x.grad is not None and g.grad is not None and x.grad.shape == x.shape


@needs("npu_add_rms_norm")
def test_npu_add_rms_norm_returns_y_rstd_and_the_sum():
    x1, x2, g = _npu(4, 8, grad=True), _npu(4, 8, grad=True), _npu(8, grad=True)
    y, rstd, x = ms.npu_add_rms_norm(x1, x2, g)
    assert torch.equal(x.cpu(), (x1 + x2).cpu()) and rstd.dtype == torch.float32
    assert torch.equal(y.cpu(), torch.ops.mindspeed_like.npu_add_rms_norm(x1, x2, g, 1e-6)[0].cpu())
    (y.sum() + x.sum()).backward()
    assert x1.grad is not None and x2.grad is not None and g.grad is not None


@needs("npu_rotary_mul")
def test_npu_rotary_mul_modes():
    x, c, s = _npu(2, 3, 4, 8, grad=True), _npu(1, 1, 4, 8), _npu(1, 1, 4, 8)
    half = ms.npu_rotary_mul(x, c, s)
    assert torch.equal(half.cpu(), torch.ops.mindspeed_like.npu_rotary_mul(x, c, s, "half").cpu())
    inter = ms.npu_rotary_mul(x, c, s, rotary_mode="interleave")
    assert torch.equal(inter.cpu(), torch.ops.mindspeed_like.npu_rotary_mul(x, c, s, "interleave").cpu())
    half.sum().backward()
    assert x.grad is not None


@needs("npu_rotary_position_embedding")
def test_npu_rotary_position_embedding_modes():
    x, c, s = _npu(2, 3, 4, 8, grad=True), _npu(1, 1, 4, 8), _npu(1, 1, 4, 8)
    for mode in (0, 1):
        got = ms.npu_rotary_position_embedding(x, c, s, mode=mode)
        assert torch.equal(got.cpu(), torch.ops.mindspeed_like.npu_rotary_position_embedding(x, c, s, mode).cpu())
    ms.npu_rotary_position_embedding(x, c, s).sum().backward()
    assert x.grad is not None


@needs("npu_swiglu")
def test_npu_swiglu_dim():
    x = _npu(3, 4, 10, grad=True)
    assert ms.npu_swiglu(x).shape == (3, 4, 5) and ms.npu_swiglu(x, dim=1).shape == (3, 2, 10)
    assert torch.equal(ms.npu_swiglu(x, dim=1).cpu(), torch.ops.mindspeed_like.npu_swiglu(x, 1).cpu())
    ms.npu_swiglu(x).sum().backward()
    assert x.grad is not None


@needs("npu_fusion_attention")
def test_npu_fusion_attention_keywords_reach_the_op():
    q, k, v = _npu(1, 4, 6, 8, grad=True), _npu(1, 2, 6, 8), _npu(1, 2, 6, 8)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1).to("npu")
    out = ms.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=mask, scale=0.3)
    assert len(out) == 4
    ref = torch.ops.mindspeed_like.npu_fusion_attention(q, k, v, 4, "BNSD", None, None, mask, 0.3)
    assert torch.equal(out[0].cpu(), ref[0].cpu())
    causal = ms.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3, sparse_mode=2)[0]
    assert torch.equal(causal.cpu(), out[0].cpu())
    out[0].sum().backward()
    assert q.grad is not None
    with pytest.raises(TypeError):
        ms.npu_fusion_attention(q, k, v, 4, "BNSD", None)  # torch_npu's options are keyword-only


@needs("npu_matmul_add_fp32")
def test_npu_matmul_add_fp32_accumulates_in_place():
    x, w = _npu(5, 3), _npu(5, 4)
    c = torch.ones(3, 4).to("npu")
    assert ms.npu_matmul_add_fp32(x, w, c) is None
    host = torch.ones(3, 4) + x.cpu().T @ w.cpu()
    wide = torch.ones(3, 4, dtype=torch.float64) + x.cpu().double().T @ w.cpu().double()
    assert not npubridge._C.judge(c.cpu(), host, wide)


@needs("npu_rms_norm")
def test_what_autograd_saves_is_freed():
    # A forward result kept for the backward used to form a cycle through
    # the C++ autograd node that nothing collected: every call leaked it.
    x, g = _npu(64, 256, grad=True), _npu(256, grad=True)
    x.grad, g.grad = torch.zeros_like(x), torch.zeros_like(g)
    torch.npu.synchronize()
    base = torch.npu.memory_allocated()
    for _ in range(4):
        y, rstd = ms.npu_rms_norm(x, g)
        y.sum().backward()
        del y, rstd
    torch.npu.synchronize()
    assert torch.npu.memory_allocated() == base


def test_cpu_tensors_get_a_clear_error():
    with pytest.raises(RuntimeError, match=r"npubridge.mindspeed.npu_rms_norm: expected input on the npu \(mindspeed_like's "
                                           r"kernels run there\) but found a cpu tensor; move it with .to\('npu'\)"):
        ms.npu_rms_norm(torch.ones(2, 4), torch.ones(4, device="npu"))
    with pytest.raises(RuntimeError, match=r"npu_fusion_attention: expected key on the npu"):
        q = torch.ones(1, 1, 2, 4, device="npu")
        ms.npu_fusion_attention(q, q.cpu(), q, 1, "BNSD")
