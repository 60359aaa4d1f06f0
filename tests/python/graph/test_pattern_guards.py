"""The fusion-pattern matcher's guards, at the level of one rewrite
(docs/graph-mode.md, "Fusion patterns": where lines, insertion point,
mutations and grad-mode switches inside a match): each case the rewrite
once got silently wrong, asserting the match is skipped with its reason (or
fires where it is right) and the result equals eager.

The pre-dispatch graph of a function, rewritten (predispatch.trace +
patterns.rewrite, as the backend does), then run as FX on the npu: where a
match is skipped the graph runs the very ops eager runs, in the same order,
so the result is bit-equal to eager; where it fires, within the fused
kernel's roundings."""
import torch

import npubridge  # noqa: F401  (the npu device)
from npubridge._compile import patterns, predispatch

U32 = 2.0 ** -24  # float32 unit roundoff


def _rewritten(f, args, requires_grad=None):
    traced = predispatch.trace(f, args)
    res = patterns.rewrite(traced, True, requires_grad or [False] * len(args))
    return traced, res


def _run(traced, *args):
    out = traced(*args)
    return out[0] if isinstance(out, (tuple, list)) else out


def _rms(x, g):
    return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rms_norm_needs_a_1d_gamma_over_the_last_dim():
    # npu_rms_norm normalises over every dim gamma covers: a [4, 8] gamma,
    # a full-shape gate or a broadcast [1] would change what it computes.
    torch.manual_seed(10)
    x = torch.randn(2, 4, 8).npu()
    for g, why in ((torch.randn(4, 8), "where %gamma.dim() == 1 does not hold (2 == 1 is false)"),
                   (torch.randn(2, 4, 8), "where %gamma.dim() == 1 does not hold (3 == 1 is false)"),
                   (torch.randn(1), "where %gamma.size(0) == %x.size(-1) does not hold (1 == 8 is false)")):
        g = g.npu()
        traced, res = _rewritten(_rms, [x, g])
        assert res["fired"] == {} and res["skipped"]["rms_norm"] == {why: 1}, list(g.shape)
        assert torch.equal(_run(traced, x, g).cpu(), _rms(x, g).cpu()), list(g.shape)
    g = torch.randn(8).npu()
    traced, res = _rewritten(_rms, [x, g])
    assert res["fired"] == {"rms_norm": 1}
    ref = _rms(x, g)
    assert (_run(traced, x, g) - ref).abs().max().item() <= 8 * U32 * ref.abs().max().item()


def test_a_cast_that_changes_the_value_is_not_fused_away():
    # gamma(f32) * n.to(int32 | bfloat16 | float16) is float32 again: the
    # output dtype matches, but the cast truncates or rounds.
    torch.manual_seed(11)
    x, g = torch.randn(2, 4, 8).npu(), torch.randn(8).npu()
    for dt in (torch.int32, torch.bfloat16, torch.float16):
        f = _cast_norm(dt)
        traced, res = _rewritten(f, [x, g])
        name = str(dt).replace("torch.", "")
        assert res["fired"] == {}, dt
        assert res["skipped"]["rms_norm_cast"] == {
            f"where $dtype == %x.dtype does not hold ({name} == float32 is false)": 1}, dt
        assert torch.equal(_run(traced, x, g).cpu(), f(x, g).cpu()), dt


def _cast_norm(dt):
    def f(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt)
    return f


def _upcast_norm(up, back):
    def f(h, g):
        x = h.to(up)
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return g * n.to(back)
    return f


def test_rms_norm_upcast_only_for_a_float32_round_trip():
    torch.manual_seed(12)
    f32, f64, bf16, f16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
    cases = (  # h, gamma dtypes, the casts, the condition that fails
        (f32, f32, f64, f32, "where $dt0 == float32 does not hold (float64 == float32 is false)"),
        (f64, f64, f32, f64, "where %h.dtype != float64 does not hold (float64 != float64 is false)"),
        (bf16, f32, f32, f16, "where $dtype == %h.dtype does not hold (float16 == bfloat16 is false)"))
    for hd, gd, up, back, why in cases:
        h, g = torch.randn(3, 16, dtype=hd).npu(), torch.randn(16, dtype=gd).npu()
        f = _upcast_norm(up, back)
        traced, res = _rewritten(f, [h, g])
        assert res["fired"] == {} and res["skipped"]["rms_norm_upcast"] == {why: 1}, (hd, up, back)
        assert torch.equal(_run(traced, h, g).cpu(), f(h, g).cpu()), (hd, up, back)
    # HF's bfloat16 RMSNorm: up to float32 and back fuses (the kernel
    # computes in float32 and rounds once to bfloat16, as the composite).
    h, g = torch.randn(3, 16, dtype=bf16).npu(), torch.randn(16, dtype=bf16).npu()
    hf = _upcast_norm(f32, bf16)
    traced, res = _rewritten(hf, [h, g])
    assert res["fired"] == {"rms_norm_upcast": 1}
    ref = hf(h, g).float()
    # the normalised value may round to the other side in bfloat16 (one
    # ulp, 2^-8 relative), then one more rounding of the product by gamma.
    assert (_run(traced, h, g).float() - ref).abs().max().item() <= 2 * 2.0 ** -8 * ref.abs().max().item()


def test_a_write_through_a_view_before_the_norm_is_kept_in_order():
    # y[..., 0] = 0 is select + an in-place write; later uses still point
    # at y's node. The fused op goes where the norm's output was: after it.
    torch.manual_seed(13)
    x, g = torch.randn(2, 4, 8).npu(), torch.randn(8).npu()

    def f(x, g):
        y = x * 1.0
        y[..., 0] = 0.0
        return _rms(y, g)

    traced, res = _rewritten(f, [x, g])
    assert res["fired"] == {"rms_norm": 1}
    ref = f(x, g)
    assert (_run(traced, x, g) - ref).abs().max().item() <= 8 * U32 * ref.abs().max().item()


def test_a_write_inside_the_matched_span_blocks_the_rewrite():
    # The mean reads y before the write, the product after it: one fused op
    # cannot read both.
    torch.manual_seed(14)
    x, g = torch.randn(2, 4, 8).npu(), torch.randn(8).npu()

    def f(x, g):
        y = x * 1.0
        v = y.pow(2).mean(-1, keepdim=True)
        y[..., 0] = 0.0
        return g * (y * torch.rsqrt(v + 1e-6))

    traced, res = _rewritten(f, [x, g])
    assert res["fired"] == {}
    assert res["skipped"]["rms_norm"] == {"copy_ (aten::copy_) between the matched nodes mutates or switches a "
                                          "mode: the fused op would move across it": 1}
    assert torch.equal(_run(traced, x, g).cpu(), f(x, g).cpu())


def _norm_after_no_grad(x, w, g):
    with torch.no_grad():
        feats = x @ w  # a frozen encoder
    return (_rms(feats, g),)


def _norm_straddling_no_grad(x, w, g):
    feats = x @ w
    with torch.no_grad():
        v = feats.pow(2).mean(-1, keepdim=True)
    return (g * (feats * torch.rsqrt(v + 1e-6)),)


def test_grad_mode_regions_keep_the_fused_op_outside():
    # A trainable norm after a no_grad block: the fused op must stay in the
    # grad-enabled part (gamma gets its gradient); a norm whose ops straddle
    # the switch is not fused.
    torch.manual_seed(15)
    x, w = torch.randn(4, 8).npu(), torch.randn(8, 8).npu()
    for f, fires in ((_norm_after_no_grad, True), (_norm_straddling_no_grad, False)):
        g = torch.randn(8).npu().requires_grad_()
        traced, res = _rewritten(f, [x, w, g], requires_grad=[False, False, True])
        y = _run(traced, x, w, g)
        assert y.requires_grad, f.__name__
        (gg,) = torch.autograd.grad(y.sum(), [g])
        ge = g.detach().clone().requires_grad_()
        ye = f(x, w, ge)[0]
        (gge,) = torch.autograd.grad(ye.sum(), [ge])
        if fires:
            assert res["fired"] == {"rms_norm": 1}
            assert (y - ye).abs().max().item() <= 8 * U32 * ye.abs().max().item()
            # gamma's gradient is the column sum of the 4 normalised rows,
            # each within a few roundings: 8 roundings of the sum of |n|.
            feats = x @ w
            n = feats * torch.rsqrt(feats.pow(2).mean(-1, keepdim=True) + 1e-6)
            assert (gg - gge).abs().max().item() <= 8 * U32 * n.abs().sum(0).max().item()
        else:
            assert res["fired"] == {}
            assert res["skipped"]["rms_norm"] == {
                "_set_grad_enabled_1 (_set_grad_enabled) between the matched nodes mutates or switches a mode: "
                "the fused op would move across it": 1}
            assert torch.equal(y.detach().cpu(), ye.detach().cpu()) and torch.equal(gg.cpu(), gge.cpu())
