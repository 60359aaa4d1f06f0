"""Fusion patterns in the compiler (B1's part): each rewrite checked
numerically against the unfused subgraph (the same graph compiled with
patterns off) and float64 CPU; the matcher's rules (commutative operands,
users outside the match, dtype and meta checks) with the skip reasons."""
import pytest
import torch
import torch.nn.functional as F

import npubridge

U32 = 2.0 ** -24  # float32 unit roundoff


class _RMSNorm(torch.nn.Module):
    """The composite as models write it; ``swap`` puts gamma second."""

    def __init__(self, dim, swap=False, expose_rsqrt=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.swap, self.expose_rsqrt = swap, expose_rsqrt

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        n = x * r
        y = n * self.weight if self.swap else self.weight * n
        return (y, r) if self.expose_rsqrt else y


class _Block(torch.nn.Module):
    """residual add + RMSNorm, then SwiGLU: the transformer MLP's shape."""

    def __init__(self, dim=32):
        super().__init__()
        self.norm = _RMSNorm(dim)
        self.gate, self.up = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(dim, 2 * dim)

    def forward(self, x, res):
        s = x + res
        h = self.norm(s)
        return F.silu(self.gate(h)) * self.up(h), s


def _fired(compiled):
    return npubridge.compile_report(compiled)["patterns_fired"]


def _skipped(compiled):
    return npubridge.compile_report(compiled)["graphs"][0]["patterns_skipped"]


def _grads(model, outs, args):
    loss = sum((o * torch.linspace(-1, 1, o.numel(), device=o.device).view(o.shape)).sum() for o in outs)
    params = list(model.parameters())
    return torch.autograd.grad(loss, params + [a for a in args if a.requires_grad])


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = _Block().npu()
    x, res = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    runs = {}
    for name, opts in (("fused", {"patterns": True}), ("unfused", {"patterns": False})):
        compiled = npubridge.compile(model, options=opts)
        args = [x.npu().requires_grad_(), res.npu().requires_grad_()]
        outs = compiled(*args)
        runs[name] = (compiled, [o.detach() for o in outs], _grads(model, outs, args))
    cpu = _Block().double()
    cpu.load_state_dict({k: v.cpu().double() for k, v in model.state_dict().items()})
    args = [x.double().requires_grad_(), res.double().requires_grad_()]
    outs = cpu(*args)
    runs["ref"] = (None, [o.detach() for o in outs], _grads(cpu, outs, args))
    return runs


def test_block_fires_add_rms_norm_and_swiglu(block):
    # rms_norm first, then add_rms_norm over the fused norm (its priority is lower).
    assert _fired(block["fused"][0]) == {"rms_norm": 1, "add_rms_norm": 1, "swiglu": 1}
    assert _fired(block["unfused"][0]) == {}


def test_fused_block_matches_the_unfused_graph_and_float64(block):
    # The fused kernels compute the same sums in float32 in another order:
    # each result within eager-size error of float64, i.e. 2x the unfused
    # graph's error plus 8 roundings of the largest value.
    _, fused_out, fused_grads = block["fused"]
    _, plain_out, plain_grads = block["unfused"]
    _, ref_out, ref_grads = block["ref"]
    for i, (f, p, r) in enumerate(zip(fused_out + list(fused_grads), plain_out + list(plain_grads),
                                      ref_out + list(ref_grads))):
        err = (f.double().cpu() - r).abs().max().item()
        plain_err = (p.double().cpu() - r).abs().max().item()
        assert err <= 2 * plain_err + 8 * U32 * r.abs().max().item(), (i, err, plain_err)


def test_the_residual_sum_is_the_fused_ops_second_output(block):
    # The sum x + res is also returned: the extra output of add_rms_norm
    # replaced it, and adding two floats is exact the same way in both.
    assert torch.equal(block["fused"][1][1].cpu(), block["unfused"][1][1].cpu())


def _compile_run(module, *inputs, grad=False):
    compiled = npubridge.compile(module)
    if grad:
        out = compiled(*inputs)
    else:
        with torch.no_grad():
            out = compiled(*inputs)
    return compiled, out


def test_gamma_on_either_side_matches():
    torch.manual_seed(1)
    x = torch.randn(3, 16).npu()
    for swap in (False, True):
        model = _RMSNorm(16, swap=swap).npu()
        compiled, out = _compile_run(model, x)
        assert _fired(compiled) == {"rms_norm": 1}, swap
        with torch.no_grad():
            eager = model(x)
        # One fused kernel vs five ops: a few float32 roundings of |y|.
        assert (out - eager).abs().max().item() <= 8 * U32 * eager.abs().max().item()


def test_a_value_used_outside_the_match_blocks_the_rewrite():
    torch.manual_seed(2)
    model = _RMSNorm(16, expose_rsqrt=True).npu()
    x = torch.randn(3, 16).npu()
    compiled, (y, r) = _compile_run(model, x)
    assert _fired(compiled) == {}
    skipped = _skipped(compiled)["rms_norm"]
    assert len(skipped) == 1 and next(iter(skipped)).startswith("rsqrt has users outside the match")
    with torch.no_grad():
        ey, er = model(x)
    assert torch.equal(y.cpu(), ey.cpu()) and torch.equal(r.cpu(), er.cpu())  # the unfused ops, unchanged


def test_a_dtype_without_a_kernel_is_skipped_with_the_reason():
    # cann_like's conv2d_bias_relu takes float32 only.
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(2, 4, 3).double().npu()
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64).npu()
    compiled, out = _compile_run(torch.nn.Sequential(conv, torch.nn.ReLU()), x)
    assert _fired(compiled) == {}
    assert _skipped(compiled)["conv2d_bias_relu"] == {
        "cann_like::conv2d_bias_relu has no npu kernel for torch.float64 (takes float32)": 1}
    with torch.no_grad():
        assert torch.equal(out.cpu(), F.relu(conv(x)).cpu())


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def test_sdpa_with_a_boolean_mask_becomes_flash_attention():
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True  # every row sees a key
    compiled, out = _compile_run(_Attention(), q.npu(), k.npu(), v.npu(), mask.npu())
    assert _fired(compiled) == {"sdpa_bool_mask": 1}
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=0.3)
    # softmax over 5 keys and a 5-term weighted sum in float32: within
    # ~16 roundings of the largest |value| (|P| <= 1, the sums are short).
    assert (out.cpu().double() - ref).abs().max().item() <= 16 * U32 * v.abs().max().item()


def test_sdpa_with_an_additive_mask_stays_unfused():
    # The flash kernel takes a boolean mask only: where(mask, False, True)
    # rejects a float one in its meta check, so the match is skipped.
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 4, 8).npu() for _ in range(3))
    mask = torch.randn(1, 1, 4, 4).npu()
    compiled, out = _compile_run(_Attention(), q, k, v, mask)
    assert _fired(compiled) == {}
    (why,) = _skipped(compiled)["sdpa_bool_mask"]
    assert "aten::where.Scalar rejects the matched values" in why and "bool" in why
    with torch.no_grad():
        assert torch.equal(out.cpu(), _Attention()(q, k, v, mask).cpu())
