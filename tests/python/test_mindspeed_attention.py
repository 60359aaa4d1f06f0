"""mindspeed_like's flash attention: npu_fusion_attention (every layout, TND,
masks, GQA) and its grad called directly, and
torch.nn.functional.scaled_dot_product_attention on npu tensors routed to
it. Results are judged against float64 references on the CPU by npubridge's
error model (conftest.assert_judged), never by a fixed tolerance."""
import math

import pytest
import torch
import torch.nn.functional as F

import npubridge
from conftest import assert_judged

NO_BAND = 2147483647
OP = "mindspeed_like::npu_fusion_attention"
GRAD_OP = "mindspeed_like::npu_fusion_attention_grad"

# The in-tree plugin is built with the extension: not loaded is a failure,
# never a skip (a broken build must not shrink the suite).
@pytest.fixture(autouse=True)
def _mindspeed_like_is_loaded():
    assert any(p["name"] == "mindspeed_like" for p in npubridge.plugins()), \
        f"the mindspeed_like plugin is not loaded: {npubridge.load_failures()}"


def fusion_attention(*args, **kwargs):
    return torch.ops.mindspeed_like.npu_fusion_attention(*args, **kwargs)


def native_calls(op):
    return npubridge.stats().get(op, {}).get("native", {}).get("mindspeed_like", 0)


def reference_bnsd(q, k, v, scale, masked=None):
    """Attention that materialises the scores ([B, N, S, D]; masked: True =
    masked out, broadcast to [B, N, Sq, Skv]); GQA by repeating key/value heads."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


def judged_with_grads(npu_out, npu_inputs, fn, cpu_inputs, dy):
    """Output and input gradients of the npu computation against fn on the
    CPU (the inputs' dtype calibrates the bound, float64 is the reference)."""
    grads = torch.autograd.grad(npu_out, npu_inputs, dy.to(npu_out.device))
    host_in = [t.detach().clone().requires_grad_(True) for t in cpu_inputs]
    wide_in = [t.detach().double().requires_grad_(True) for t in cpu_inputs]
    host_out, wide_out = fn(*host_in), fn(*wide_in)
    assert_judged(npu_out, host_out, wide_out, "output")
    host_g = torch.autograd.grad(host_out, host_in, dy)
    wide_g = torch.autograd.grad(wide_out, wide_in, dy.double())
    for name, g, h, w in zip(("query", "key", "value"), grads, host_g, wide_g):
        assert_judged(g, h, w, f"gradient of {name}")


# --- scaled_dot_product_attention on npu tensors ---------------------------

SDPA_CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "bool mask [L, S]": dict(mask_shape=(1, 1)),
    "bool mask [B, 1, L, S]": dict(mask_shape=("B", 1)),
    "bool mask [B, N, L, S]": dict(mask_shape=("B", "N")),
    "GQA 4/2 causal": dict(kv_heads=2, is_causal=True, enable_gqa=True),
    "scale 0.3, GQA 4/1": dict(kv_heads=1, scale=0.3, enable_gqa=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_runs_flash_attention(case, dtype, npu):
    c = SDPA_CASES[case]
    torch.manual_seed(0)
    b, n, sq, skv, d = 2, 4, 70, 150, 16  # more than one block of queries (64) and keys (128)
    if c.get("is_causal"):
        skv = sq  # SDPA's causal mask is the top-left triangle
    nk = c.get("kv_heads", n)
    q, k, v = torch.randn(b, n, sq, d, dtype=dtype), torch.randn(b, nk, skv, d, dtype=dtype), torch.randn(
        b, nk, skv, d, dtype=dtype)
    mask = None
    if "mask_shape" in c:
        shape = [b if x == "B" else n if x == "N" else x for x in c["mask_shape"]] + [sq, skv]
        mask = torch.rand(shape) > 0.3  # True = takes part
        mask[..., 0] = True  # no row without keys
        if c["mask_shape"] == (1, 1):
            mask = mask[0, 0]
    kwargs = {k_: c[k_] for k_ in ("is_causal", "scale", "enable_gqa") if k_ in c}

    def fn(q_, k_, v_):
        return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, **kwargs)

    npubridge.reset_stats()
    npubridge.reset_sdpa_stats()
    ins = [t.to(npu).requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*ins, attn_mask=None if mask is None else mask.to(npu), **kwargs)
    judged_with_grads(out, ins, fn, (q, k, v), torch.randn(out.shape, dtype=dtype))
    assert npubridge.sdpa_stats()["flash_attention"] == 1 and npubridge.sdpa_stats()["math"] == 0
    assert native_calls(OP) == 1 and native_calls(GRAD_OP) == 1, npubridge.stats()


def test_sdpa_float64_gradcheck(npu):
    # float64 all the way (the kernel accumulates in double for float64).
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, device=npu, requires_grad=True)
    k = torch.randn(1, 1, 6, 4, dtype=torch.float64, device=npu, requires_grad=True)
    v = torch.randn(1, 1, 6, 4, dtype=torch.float64, device=npu, requires_grad=True)
    npubridge.reset_sdpa_stats()
    assert torch.autograd.gradcheck(lambda a, b_, c: F.scaled_dot_product_attention(a, b_, c, enable_gqa=True),
                                    (q, k, v))
    assert npubridge.sdpa_stats()["math"] == 0


def test_npu_fusion_attention_float64_gradcheck(npu):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 2, 3, dtype=torch.float64, device=npu, requires_grad=True)  # BSND, GQA 2/1
    k = torch.randn(1, 6, 1, 3, dtype=torch.float64, device=npu, requires_grad=True)
    v = torch.randn(1, 6, 1, 3, dtype=torch.float64, device=npu, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b_, c: fusion_attention(a, b_, c, 2, "BSND", scale=0.7, sparse_mode=3)[0], (q, k, v))


@pytest.mark.parametrize("why", ["dropout_p > 0", "a float (additive) attn_mask", "mindspeed_like is disabled"])
def test_sdpa_math_path(why, npu):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, device=npu) for _ in range(3))
    npubridge.reset_sdpa_stats()
    npubridge.reset_stats()
    kwargs = {}
    if why == "dropout_p > 0":
        kwargs["dropout_p"] = 0.5
    elif why == "a float (additive) attn_mask":
        kwargs["attn_mask"] = torch.randn(8, 8, device=npu)
    else:
        npubridge.disable_plugin("mindspeed_like")
    try:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    finally:
        npubridge.enable_plugin("mindspeed_like")
    assert npubridge.sdpa_stats() == {"flash_attention": 0, "math": 1, "math_reasons": {why: 1}}
    assert native_calls(OP) == 0
    if why != "dropout_p > 0":
        cpu = [t.cpu() for t in (q, k, v)]
        mask = kwargs.get("attn_mask")
        assert_judged(out, F.scaled_dot_product_attention(*cpu, attn_mask=None if mask is None else mask.cpu()),
                      F.scaled_dot_product_attention(*[t.double() for t in cpu],
                                                     attn_mask=None if mask is None else mask.cpu().double()))


# --- npu_fusion_attention directly --------------------------------------------


def to_layout(x, layout):
    """[B, N, S, D] -> layout."""
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).flatten(2).contiguous()
    return x.permute(2, 0, 1, 3).flatten(2).contiguous()  # SBH


def from_layout(x, layout, n):
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.unflatten(2, (n, -1)).transpose(1, 2)
    return x.unflatten(2, (n, -1)).permute(1, 2, 0, 3)  # SBH


@pytest.mark.parametrize("layout", ["BSND", "BNSD", "BSH", "SBH"])
def test_each_layout(layout, npu):
    torch.manual_seed(0)
    b, n, nk, sq, skv, d, scale = 2, 4, 2, 20, 37, 8, 0.4
    q, k, v = torch.randn(b, n, sq, d), torch.randn(b, nk, skv, d), torch.randn(b, nk, skv, d)
    masked = torch.ones(sq, skv, dtype=torch.bool).triu(1 + skv - sq)  # rightDownCausal

    def fn(q_, k_, v_):
        return to_layout(reference_bnsd(q_, k_, v_, scale, masked), layout)

    ins = [to_layout(t, layout).to(npu).requires_grad_(True) for t in (q, k, v)]
    out, smax, ssum, sout = fusion_attention(*ins, n, layout, scale=scale, sparse_mode=3)
    assert out.shape == ins[0].shape and sout.numel() == 0
    assert smax.shape == ssum.shape == (b, n, sq, 8) and smax.dtype == ssum.dtype == torch.float32
    # The statistics: row max of the masked scaled scores, sum of exp(score - max),
    # against the same on the CPU in float32 (the bound) and float64 (the reference).
    def stats(dtype):
        s = torch.matmul(q.to(dtype), k.to(dtype).repeat_interleave(2, 1).transpose(-1, -2)) * scale
        s = s.masked_fill(masked, float("-inf"))
        mx = s.amax(-1)
        return mx, torch.exp(s - mx.unsqueeze(-1)).sum(-1)

    (mx32, sum32), (mx64, sum64) = stats(torch.float32), stats(torch.float64)
    assert_judged(smax[..., 3], mx32, mx64)
    assert_judged(ssum[..., 0], sum32, sum64)
    judged_with_grads(out, ins, lambda *t: fn(*(from_layout(x, layout, h) for x, h in zip(t, (n, nk, nk)))),
                      [to_layout(t, layout) for t in (q, k, v)], torch.randn(out.shape))


def test_tnd_uneven_lengths(npu):
    torch.manual_seed(0)
    n, nk, d, scale = 4, 2, 8, 0.3
    qlens, kvlens = [3, 70, 1, 9], [5, 130, 4, 9]
    cq = torch.tensor(qlens).cumsum(0).tolist()
    ckv = torch.tensor(kvlens).cumsum(0).tolist()
    q, k, v = torch.randn(cq[-1], n, d), torch.randn(ckv[-1], nk, d), torch.randn(ckv[-1], nk, d)

    def fn(q_, k_, v_):
        outs = []
        for qb, kb, vb in zip(q_.split(qlens), k_.split(kvlens), v_.split(kvlens)):
            sq, skv = qb.shape[0], kb.shape[0]
            masked = torch.ones(sq, skv, dtype=torch.bool).triu(1 + skv - sq)
            bnsd = [x.transpose(0, 1).unsqueeze(0) for x in (qb, kb, vb)]
            outs.append(reference_bnsd(*bnsd, scale, masked)[0].transpose(0, 1))
        return torch.cat(outs)

    npubridge.reset_stats()
    ins = [t.to(npu).requires_grad_(True) for t in (q, k, v)]
    out, smax, ssum, _ = fusion_attention(*ins, n, "TND", scale=scale, actual_seq_qlen=cq, actual_seq_kvlen=ckv,
                                          sparse_mode=3)
    assert smax.shape == (cq[-1], n, 8)
    judged_with_grads(out, ins, fn, (q, k, v), torch.randn(out.shape))
    assert native_calls(OP) == 1 and native_calls(GRAD_OP) == 1


def test_band_and_explicit_mask(npu):
    # sparse_mode 0: keys j with i - pre_tockens <= j <= i + next_tockens, and not masked.
    torch.manual_seed(0)
    b, n, s, d = 1, 2, 40, 8
    q, k, v = (torch.randn(b, n, s, d) for _ in range(3))
    mask = torch.rand(b, 1, s, s) < 0.3
    mask[..., torch.arange(s), torch.arange(s)] = False
    i, j = torch.arange(s).unsqueeze(1), torch.arange(s).unsqueeze(0)
    masked = mask | (j < i - 5) | (j > i + 2)
    ins = [t.to(npu).requires_grad_(True) for t in (q, k, v)]
    out = fusion_attention(*ins, n, "BNSD", atten_mask=mask.to(npu), scale=0.5, pre_tockens=5, next_tockens=2)[0]
    judged_with_grads(out, ins, lambda *t: reference_bnsd(*t, 0.5, masked), (q, k, v), torch.randn(out.shape))


def test_fully_masked_rows(npu):
    # A row that sees no key: output 0, softmax_max -inf, softmax_sum 0, and no gradient from it.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, device=npu, requires_grad=True) for _ in range(3))
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[1] = True
    out, smax, ssum, _ = fusion_attention(q, k, v, 1, "BNSD", atten_mask=mask.to(npu))
    assert torch.equal(out[0, 0, 1].cpu(), torch.zeros(8))
    assert torch.isneginf(smax[0, 0, 1].cpu()).all() and torch.equal(ssum[0, 0, 1].cpu(), torch.zeros(8))
    assert torch.isfinite(out.cpu()).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad.cpu()).all() for t in (q, k, v))
    assert torch.equal(q.grad[0, 0, 1].cpu(), torch.zeros(8))


PREFIX = "op 'mindspeed_like::npu_fusion_attention' failed in the kernel of plugin 'mindspeed_like': " \
         "mindspeed_like::npu_fusion_attention: "


@pytest.mark.parametrize("args, kwargs, message", [
    ((4, 2, 4, 8), dict(layout="BXND"), "input_layout: expected one of BSND, BNSD, BSH, SBH, TND but found 'BXND'"),
    ((4, 12), dict(layout="BSH", head_num=5), "head_num: expected a divisor of the query's hidden size 12 but found 5"),
    ((1, 2, 4, 8), dict(head_num=3), "head_num: expected the query's 2 heads (BNSD) but found 3"),
    ((1, 2, 4, 8), dict(kv_shape=(1, 3, 4, 8), head_num=2),
     "key: expected a number of heads dividing head_num 2 but found 3"),
    ((1, 2, 4, 8), dict(atten_mask=(4, 5)),
     "atten_mask: expected shape [4, 4] or [B or 1, N or 1, 4, 4] but found [4, 5]"),
    ((1, 2, 4, 8), dict(layout="TND_no_lengths"), "actual_seq_qlen, actual_seq_kvlen: required for input_layout TND"),
])
def test_invalid_arguments(args, kwargs, message, npu):
    layout = kwargs.get("layout", "BNSD")
    q = torch.randn(*args, device=npu) if layout != "BSH" else torch.randn(1, *args, device=npu)
    k = torch.randn(*kwargs["kv_shape"], device=npu) if "kv_shape" in kwargs else q
    mask = torch.zeros(kwargs["atten_mask"], dtype=torch.bool, device=npu) if "atten_mask" in kwargs else None
    if layout == "TND_no_lengths":
        q = k = torch.randn(4, 2, 8, device=npu)
        layout = "TND"
    with pytest.raises(RuntimeError) as e:
        fusion_attention(q, k, k, kwargs.get("head_num", q.shape[1] if layout != "BSH" else 2), layout,
                         atten_mask=mask)
    assert str(e.value) == PREFIX + message


@pytest.mark.parametrize("kwargs, message", [
    (dict(keep_prob=0.9), "keep_prob: dropout is not supported (expected 1) but found 0.9"),
    (dict(pse="q"), "pse: not supported (expected None)"),
    (dict(sparse_mode=4), "sparse_mode: expected 0 (mask and band), 1 (mask), 2 (leftUpCausal) or 3 "
                          "(rightDownCausal) but found 4"),
])
def test_unsupported_arguments(kwargs, message, npu):
    q = torch.randn(1, 2, 4, 8, device=npu)
    kwargs = {k: (q if v == "q" else v) for k, v in kwargs.items()}
    with pytest.raises(RuntimeError) as e:
        fusion_attention(q, q, q, 2, "BNSD", **kwargs)
    assert str(e.value) == ("npubridge: op 'mindspeed_like::npu_fusion_attention' cannot run on the npu: " + PREFIX +
                            message + "; and PyTorch has no CPU implementation of it to fall back to")


def test_grad_needs_saved_statistics(npu):
    q = torch.randn(1, 2, 4, 8, device=npu)
    with pytest.raises(RuntimeError) as e:
        torch.ops.mindspeed_like.npu_fusion_attention_grad(q, q, q, q, 2, "BNSD")
    assert str(e.value) == ("op 'mindspeed_like::npu_fusion_attention_grad' failed in the kernel of plugin "
                            "'mindspeed_like': mindspeed_like::npu_fusion_attention_grad: softmax_max: required "
                            "(the forward's statistics)")


def test_scale_default_matches_sdpa(npu):
    # SDPA's default scale is 1/sqrt(D); the op's is 1.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, device=npu) for _ in range(3))
    out = fusion_attention(q, k, v, 2, "BNSD", scale=1 / math.sqrt(16))[0]
    sd = F.scaled_dot_product_attention(q, k, v)
    cpu = [t.cpu() for t in (q, k, v)]
    assert_judged(out, F.scaled_dot_product_attention(*cpu), F.scaled_dot_product_attention(*[t.double() for t in cpu]))
    assert_judged(sd, F.scaled_dot_product_attention(*cpu), F.scaled_dot_product_attention(*[t.double() for t in cpu]))


def test_causal_modes_take_the_compressed_mask(npu):
    # sparse_mode 2/3 take torch_npu's [2048, 2048] compressed causal mask,
    # which restates the triangle: the triangle is computed, its contents are not read.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, device=npu) for _ in range(3))
    compressed = torch.ones(2048, 2048, dtype=torch.bool, device=npu).triu(1)
    for mode in (2, 3):
        alone = fusion_attention(q, k, v, 2, "BNSD", sparse_mode=mode)[0]
        with_mask = fusion_attention(q, k, v, 2, "BNSD", atten_mask=compressed, sparse_mode=mode)[0]
        assert torch.equal(alone.cpu(), with_mask.cpu())
    with pytest.raises(RuntimeError) as e:
        fusion_attention(q, k, v, 2, "BNSD", atten_mask=torch.zeros(9, 9, dtype=torch.bool, device=npu),
                         sparse_mode=2)
    assert str(e.value) == PREFIX + ("atten_mask: sparse_mode 2 takes None or torch_npu's [2048, 2048] compressed "
                                     "causal mask but found [9, 9]")


def test_overrideable_backward_from_logsumexp_alone(npu):
    # The overrideable backward called with logsumexp but without the
    # forward's statistics (another caller's forward): P = exp(S - lse).
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(1, 2, 20, 8) for _ in range(4))
    ins = [t.to(npu) for t in (q, k, v)]
    out, lse, *_ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(*ins, is_causal=True)
    empty = torch.empty(0, device=npu)
    dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
        g.to(npu), *ins, empty, [True, True, True, False], out, lse, empty, empty, 20, 20, 0.0, True, empty, empty)

    def grads(dtype):
        t = [x.to(dtype).requires_grad_(True) for x in (q, k, v)]
        return torch.autograd.grad(F.scaled_dot_product_attention(*t, is_causal=True), t, g.to(dtype))

    for name, got, host, wide in zip(("query", "key", "value"), (dq, dk, dv), grads(torch.float32),
                                     grads(torch.float64)):
        assert_judged(got, host, wide, f"gradient of {name}")


def test_a_band_wider_than_int64_arithmetic_is_no_band(npu):
    # next_tockens = INT64_MAX once overflowed i + next + 1 and masked every key.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    for band in (2**63 - 1, 2**62, -(2**63)):
        pre = band if band > 0 else 2**63 - 1
        out = fusion_attention(q.to(npu), k.to(npu), v.to(npu), 2, "BNSD", scale=0.5, pre_tockens=pre,
                               next_tockens=band)[0].cpu()
        ref = reference_bnsd(q, k, v, 0.5, None) if band > 0 else None
        if ref is not None:
            torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        else:  # no key at or below next_tockens = -2^63: every row fully masked, output 0
            assert torch.equal(out, torch.zeros_like(out))
