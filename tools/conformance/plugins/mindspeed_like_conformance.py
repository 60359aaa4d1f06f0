"""npubridge.testing samples and references of mindspeed_like's ops
(plugins/mindspeed_like), for `python3 -m npubridge conformance --plugin
libnpub_mindspeed_like.so --tests this file` (CTest conformance.torch.mindspeed_like)."""
import torch

from npubridge import testing

SHAPES = (((4, 16), (16,)), ((2, 3, 8), (3, 8)), ((5, 7), (7,)), ((0, 8), (8,)), ((64, 256), (256,)))


def _dims(x, gamma):
    return list(range(x.dim() - gamma.dim(), x.dim()))


@testing.reference("mindspeed_like::npu_rms_norm")
def npu_rms_norm(x, gamma, epsilon=1e-6):
    if gamma.dim() < 1 or gamma.dim() > x.dim() or x.shape[x.dim() - gamma.dim():] != gamma.shape:
        raise ValueError("gamma must match the trailing shape of self")
    rstd = torch.rsqrt(x.pow(2).mean(_dims(x, gamma), keepdim=True) + epsilon)
    # rstd is float32 whatever the input (float64 in the float64 reference run)
    return x * rstd * gamma, rstd.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


@testing.samples("mindspeed_like::npu_rms_norm")
def npu_rms_norm_samples(dtype):
    for x, g in SHAPES:
        yield testing.Sample(torch.randn(*x, dtype=dtype), torch.randn(*g, dtype=dtype), 1e-6, name=f"{list(x)}")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, dtype=dtype), name="gamma mismatch (error)")


@testing.reference("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward(dy, x, gamma, rstd):
    # The gradients of y = x * rstd(x) * gamma by autograd; rstd recomputed
    # from x (equal in value to the sample's).
    dims = _dims(x, gamma)
    with torch.enable_grad():
        xd, gd = x.detach().requires_grad_(True), gamma.detach().requires_grad_(True)
        r = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + 1e-6)
        dx, dgamma = torch.autograd.grad(xd * r * gd, (xd, gd), dy)
    return dx, dgamma


@testing.samples("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward_samples(dtype):
    for x_shape, g_shape in SHAPES[:3]:
        x, g = torch.randn(*x_shape, dtype=dtype), torch.randn(*g_shape, dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(_dims(x, g), keepdim=True) + 1e-6)
        yield testing.Sample(torch.randn(*x_shape, dtype=dtype), x, g, rstd, name=f"{list(x_shape)}")


# ---------------------------------------------------------------------------
# npu_fusion_attention and npu_fusion_attention_grad (plugins/mindspeed_like/src/attention*.cpp)
# ---------------------------------------------------------------------------
# The reference materialises the scores: per batch, query/key/value as
# [N, S, D] (key/value heads repeated for grouped-query attention), scores =
# scale * q k^T, masked_fill with the mask (True = masked out) and the
# causal or band pattern, softmax, @ v. torch_npu's statistics: the row max
# of the masked scaled scores and the sum of exp(score - max), each repeated
# 8 times ([B, N, Sq, 8]; TND [T, N, 8]). A row that sees no key gives 0,
# max -inf, sum 0 (the samples have none: the judge compares finite values).

_LAYOUTS = ("BSND", "BNSD", "BSH", "SBH", "TND")


def _attn_split(x, layout, heads, head_dim, lens):
    """x in `layout` -> per-batch [heads, S, D] views."""
    if layout == "BNSD":
        return list(x.unbind(0))
    if layout == "BSND":
        return list(x.transpose(1, 2).unbind(0))
    if layout == "BSH":
        return list(x.unflatten(2, (heads, head_dim)).transpose(1, 2).unbind(0))
    if layout == "SBH":
        return list(x.unflatten(2, (heads, head_dim)).permute(1, 2, 0, 3).unbind(0))
    return [t.transpose(0, 1) for t in x.split(lens, 0)]  # TND


def _attn_join(parts, layout):
    """Per-batch [N, S, D] -> `layout` (the inverse of _attn_split)."""
    if layout == "BNSD":
        return torch.stack(parts)
    if layout == "BSND":
        return torch.stack(parts).transpose(1, 2)
    if layout == "BSH":
        return torch.stack(parts).transpose(1, 2).flatten(2)
    if layout == "SBH":
        return torch.stack(parts).permute(2, 0, 1, 3).flatten(2)
    return torch.cat([p.transpose(0, 1) for p in parts], 0)


def _attn_lens(cum):
    return [b - a for a, b in zip([0] + list(cum[:-1]), cum)]


def _attn_reference(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                    scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                    prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0):
    if input_layout not in _LAYOUTS:
        raise ValueError(f"input_layout {input_layout!r}")
    if pse is not None or padding_mask is not None or prefix is not None or keep_prob != 1.0:
        raise ValueError("pse, padding_mask, prefix and dropout are not supported")
    if sparse_mode not in (0, 1, 2, 3):
        raise ValueError("sparse_mode")
    if input_layout in ("BSH", "SBH"):
        if query.shape[2] % head_num:
            raise ValueError("head_num must divide the hidden size")
        head_dim = query.shape[2] // head_num
        kv_heads = key.shape[2] // head_dim
    else:
        head_dim = query.shape[-1]
        kv_heads = key.shape[2 if input_layout == "BSND" else 1]
        if query.shape[2 if input_layout == "BSND" else 1] != head_num:
            raise ValueError("head_num must be the query's heads")
    if head_num % kv_heads:
        raise ValueError("kv heads must divide head_num")
    if input_layout == "TND":
        qlens, kvlens = _attn_lens(actual_seq_qlen), _attn_lens(actual_seq_kvlen)
    else:
        qlens = kvlens = None
    qs = _attn_split(query, input_layout, head_num, head_dim, qlens)
    ks = _attn_split(key, input_layout, kv_heads, head_dim, kvlens)
    vs = _attn_split(value, input_layout, kv_heads, head_dim, kvlens)
    group = head_num // kv_heads
    outs, maxes, sums = [], [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        sq, skv = q.shape[1], k.shape[1]
        s = torch.matmul(q, k.transpose(1, 2)) * scale
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(skv).unsqueeze(0)
        if sparse_mode == 2:
            masked = j > i
        elif sparse_mode == 3:
            masked = j > i + (skv - sq)
        elif sparse_mode == 1:
            masked = torch.zeros(sq, skv, dtype=torch.bool)
        else:
            masked = (j < i - pre_tockens) | (j > i + next_tockens)
        masked = masked.expand(head_num, sq, skv)
        if atten_mask is not None and sparse_mode in (0, 1):
            m = atten_mask.bool()
            m = m if m.dim() == 2 else m[b if m.shape[0] > 1 else 0]
            masked = masked | m[..., :sq, :skv]
        none = masked.all(-1, keepdim=True)
        s = s.masked_fill(masked, float("-inf"))
        mx = s.amax(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(none, 0.0), -1).masked_fill(none, 0.0)
        outs.append(torch.matmul(p, v))
        maxes.append(mx.squeeze(-1))
        sums.append(torch.exp(s - mx.masked_fill(none, 0.0)).sum(-1))
    stat = torch.float64 if query.dtype == torch.float64 else torch.float32
    if input_layout == "TND":
        smax = torch.cat([m.transpose(0, 1) for m in maxes], 0)
        ssum = torch.cat([m.transpose(0, 1) for m in sums], 0)
    else:
        smax, ssum = torch.stack(maxes), torch.stack(sums)
    smax = smax.to(stat).unsqueeze(-1).expand(*smax.shape, 8)
    ssum = ssum.to(stat).unsqueeze(-1).expand(*ssum.shape, 8)
    return _attn_join(outs, input_layout), smax, ssum, torch.empty(0, dtype=query.dtype)


@testing.reference("mindspeed_like::npu_fusion_attention")
def npu_fusion_attention(*args, **kwargs):
    return _attn_reference(*args, **kwargs)


def _attn_shape(layout, b, s, n, d):
    return {"BSND": (b, s, n, d), "BNSD": (b, n, s, d), "BSH": (b, s, n * d), "SBH": (s, b, n * d)}[layout]


def _attn_cases(dtype):
    """(name, args) of npu_fusion_attention, all positional (the tool moves
    positional tensors to the npu): every layout, GQA, both causal modes,
    explicit masks of three shapes, a band, TND of uneven lengths, more than
    one block of queries (64) and keys (128) where the dtype allows."""
    small = dtype == torch.float64  # gradcheck's finite differences: tiny problems

    def t(*shape):
        return torch.randn(*shape, dtype=dtype)

    def args(q, k, v, n, layout, mask=None, scale=0.5, pre=2147483647, nxt=2147483647, sq=None, skv=None, mode=0):
        return (q, k, v, n, layout, None, None, mask, scale, 1.0, pre, nxt, 0, None, sq, skv, mode)

    def keep_diagonal(m):  # a random mask whose rows keep at least their diagonal key
        m[..., torch.arange(m.shape[-2]), torch.arange(m.shape[-2])] = False
        return m

    b, d = 2, (4 if small else 16)
    sq, skv = (5, 7) if small else (70, 150)
    mask = keep_diagonal(torch.rand(sq, skv) < 0.3)
    yield "BNSD [Sq, Skv] mask + band", args(t(b, 2, sq, d), t(b, 2, skv, d), t(b, 2, skv, d), 2, "BNSD", mask,
                                             0.25, 6, 2)
    s = 6 if small else 140
    yield "BSND GQA 4/2 leftUpCausal", args(*(t(*_attn_shape("BSND", b, s, n, d)) for n in (4, 2, 2)), 4, "BSND",
                                            mode=2)
    sq, skv = (4, 9) if small else (20, 45)
    mask = keep_diagonal(torch.rand(b, 1, sq, skv) < 0.4)
    yield "BSH [B, 1, Sq, Skv] mask", args(t(*_attn_shape("BSH", b, sq, 3, d)), t(*_attn_shape("BSH", b, skv, 3, d)),
                                           t(*_attn_shape("BSH", b, skv, 3, d)), 3, "BSH", mask, 0.3)
    mask = keep_diagonal(torch.rand(b, 4, sq, skv) < 0.4)
    yield "SBH MQA 4/1 [B, N, Sq, Skv] mask", args(t(*_attn_shape("SBH", b, sq, 4, d)),
                                                   t(*_attn_shape("SBH", b, skv, 1, d)),
                                                   t(*_attn_shape("SBH", b, skv, 1, d)), 4, "SBH", mask)
    qlens, kvlens = ([2, 3, 1], [3, 3, 4]) if small else ([5, 17, 3, 70], [9, 17, 3, 130])
    cq, ckv = list(torch.tensor(qlens).cumsum(0).tolist()), list(torch.tensor(kvlens).cumsum(0).tolist())
    yield "TND uneven lengths, GQA 2/1, rightDownCausal", args(t(cq[-1], 2, d), t(ckv[-1], 1, d), t(ckv[-1], 1, d),
                                                               2, "TND", scale=0.4, sq=cq, skv=ckv, mode=3)


def _attn_error_cases(dtype):
    q = torch.randn(1, 2, 4, 8, dtype=dtype)
    base = (q, q.clone(), q.clone(), 2, "BNSD", None, None, None, 1.0, 1.0, 2147483647, 2147483647, 0, None, None,
            None, 0)
    yield "layout 'BXND' (error)", base[:4] + ("BXND",) + base[5:]
    h = torch.randn(1, 4, 12, dtype=dtype)
    yield "head_num 5 does not divide 12 (error)", (h, h.clone(), h.clone(), 5, "BSH") + base[5:]
    yield "keep_prob 0.9 (error)", base[:9] + (0.9,) + base[10:]


@testing.samples("mindspeed_like::npu_fusion_attention")
def npu_fusion_attention_samples(dtype):
    for name, a in _attn_cases(dtype):
        yield testing.Sample(*a, name=name)
    for name, a in _attn_error_cases(dtype):
        yield testing.Sample(*a, name=name)


@testing.reference("mindspeed_like::npu_fusion_attention_grad")
def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse=None, padding_mask=None,
                              atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None, attention_in=None,
                              scale_value=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647,
                              inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0):
    # The gradients of the reference forward by autograd; the saved
    # statistics are the forward's, so they are not read (the kernel needs
    # them; it does not read attention_in).
    if softmax_max is None or softmax_sum is None:
        raise ValueError("softmax_max and softmax_sum are required")
    with torch.enable_grad():
        q, k, v = (x.detach().requires_grad_(True) for x in (query, key, value))
        out = _attn_reference(q, k, v, head_num, input_layout, pse, padding_mask, atten_mask, scale_value, keep_prob,
                              pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen,
                              sparse_mode)[0]
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dy)
    return dq, dk, dv, torch.empty(0, dtype=query.dtype)


@testing.samples("mindspeed_like::npu_fusion_attention_grad")
def npu_fusion_attention_grad_samples(dtype):
    for name, a in _attn_cases(dtype):
        q, k, v, n, layout = a[:5]
        # The forward's saved tensors, from the float64 reference (what a
        # correct forward returns, rounded to the dtype it returns them in).
        wide = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in a]
        out, smax, ssum, _ = _attn_reference(*wide)
        stat = torch.float64 if dtype == torch.float64 else torch.float32
        dy = torch.randn(out.shape, dtype=dtype)
        yield testing.Sample(q, k, v, dy, n, layout, None, None, a[7], smax.to(stat).contiguous(),
                             ssum.to(stat).contiguous(), torch.empty(0, dtype=dtype), out.to(dtype), a[8], *a[9:],
                             name=name)
    q = torch.randn(1, 2, 4, 8, dtype=dtype)
    yield testing.Sample(q, q.clone(), q.clone(), q.clone(), 2, "BNSD", name="no saved statistics (error)")
