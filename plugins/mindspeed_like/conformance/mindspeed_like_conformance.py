"""npubridge.testing samples and references of mindspeed_like's ops
(plugins/mindspeed_like), for `python3 -m npubridge conformance --plugin
libnpub_mindspeed_like.so --tests this file` (CTest conformance.torch.mindspeed_like)."""
import torch
from torch.optim.adam import adam as adam_step

from npubridge import testing

SHAPES = (((4, 16), (16,)), ((2, 3, 8), (3, 8)), ((5, 7), (7,)), ((0, 8), (8,)), ((64, 256), (256,)))


def _dims(x, gamma):
    return list(range(x.dim() - gamma.dim(), x.dim()))


def _large(shape, dtype):
    # gradcheck (float64) builds the dense Jacobian: keep that one small
    return tuple(max(1, s // 8) for s in shape) if dtype == torch.float64 else shape


def _rms_shapes(dtype):
    return [(_large(x, dtype), _large(g, dtype)) for x, g in SHAPES]


def _stats_dtype(x):
    # rstd is float32 whatever the input, float64 for float64 (and in the float64 reference run)
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_rstd(x, gamma, rstd):
    shape = list(x.shape[:x.dim() - gamma.dim()]) + [1] * gamma.dim()
    if list(rstd.shape) != shape or rstd.dtype != _stats_dtype(x):
        raise ValueError("rstd: expected the forward's statistics")


def _rstd(x, gamma, epsilon=1e-6):
    return torch.rsqrt(x.to(_stats_dtype(x)).pow(2).mean(_dims(x, gamma), keepdim=True) + epsilon)


@testing.reference("mindspeed_like::npu_rms_norm")
def npu_rms_norm(x, gamma, epsilon=1e-6):
    if gamma.dim() < 1 or gamma.dim() > x.dim() or x.shape[x.dim() - gamma.dim():] != gamma.shape:
        raise ValueError("gamma must match the trailing shape of self")
    rstd = torch.rsqrt(x.pow(2).mean(_dims(x, gamma), keepdim=True) + epsilon)
    return x * rstd * gamma, rstd.to(_stats_dtype(x))


@testing.samples("mindspeed_like::npu_rms_norm")
def npu_rms_norm_samples(dtype):
    for x, g in _rms_shapes(dtype):
        yield testing.Sample(torch.randn(*x, dtype=dtype), torch.randn(*g, dtype=dtype), 1e-6, name=f"{list(x)}")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, dtype=dtype), name="gamma mismatch (error)")


@testing.reference("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward(dy, x, gamma, rstd):
    # The gradients of y = x * rstd(x) * gamma by autograd; rstd recomputed
    # from x (equal in value to the sample's).
    _check_rstd(x, gamma, rstd)
    dims = _dims(x, gamma)
    with torch.enable_grad():
        xd, gd = x.detach().requires_grad_(True), gamma.detach().requires_grad_(True)
        r = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + 1e-6)
        dx, dgamma = torch.autograd.grad(xd * r * gd, (xd, gd), dy)
    return dx, dgamma


@testing.samples("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward_samples(dtype):
    for x_shape, g_shape in _rms_shapes(dtype):
        x, g = torch.randn(*x_shape, dtype=dtype), torch.randn(*g_shape, dtype=dtype)
        yield testing.Sample(torch.randn(*x_shape, dtype=dtype), x, g, _rstd(x, g), name=f"{list(x_shape)}")
    x, g = torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype)
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), x, g, _rstd(x, g).squeeze(-1),
                         name="rstd of the wrong shape (error)")
    # (a float16 call's float16 rstd would be converted to float32 with the call: not an error)
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), x, g, _rstd(x, g).to(other),
                         name="rstd of a half dtype (error)")


# --- mindspeed_like's fused training ops other than attention (adamw.cpp, swiglu.cpp, rms_norm.cpp's
# npu_add_rms_norm, rotary.cpp, matmul_add.cpp) ---


@testing.reference("mindspeed_like::npu_add_rms_norm")
def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    if x1.shape != x2.shape:
        raise ValueError("x2 must have the shape of x1")
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


@testing.samples("mindspeed_like::npu_add_rms_norm")
def npu_add_rms_norm_samples(dtype):
    for x, g in _rms_shapes(dtype):
        yield testing.Sample(torch.randn(*x, dtype=dtype), torch.randn(*x, dtype=dtype), torch.randn(*g, dtype=dtype),
                             1e-5, name=f"{list(x)}")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype), torch.randn(4, dtype=dtype),
                         name="gamma mismatch (error)")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype),
                         name="x2 of another shape (error)")


@testing.reference("mindspeed_like::npu_add_rms_norm_backward")
def npu_add_rms_norm_backward(dy, dx, x, gamma, rstd):
    # (dx1, dx2, dgamma) of (y, x) = (rms_norm(x1 + x2), x1 + x2) by autograd,
    # dy flowing into y and dx into the sum.
    _check_rstd(x, gamma, rstd)
    if dx.shape != x.shape:
        raise ValueError("dx: expected the shape of x")
    dims = _dims(x, gamma)
    with torch.enable_grad():
        x1 = x.detach().requires_grad_(True)
        x2 = torch.zeros_like(x).requires_grad_(True)
        gd = gamma.detach().requires_grad_(True)
        s = x1 + x2
        y = s * torch.rsqrt(s.pow(2).mean(dims, keepdim=True) + 1e-6) * gd
        return torch.autograd.grad((y, s), (x1, x2, gd), (dy, dx))


@testing.samples("mindspeed_like::npu_add_rms_norm_backward")
def npu_add_rms_norm_backward_samples(dtype):
    for x_shape, g_shape in _rms_shapes(dtype):
        x, g = torch.randn(*x_shape, dtype=dtype), torch.randn(*g_shape, dtype=dtype)
        yield testing.Sample(torch.randn(*x_shape, dtype=dtype), torch.randn(*x_shape, dtype=dtype), x, g, _rstd(x, g),
                             name=f"{list(x_shape)}")
    x, g = torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype)
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, 7, dtype=dtype), x, g, _rstd(x, g),
                         name="dx of the wrong shape (error)")


@testing.reference("mindspeed_like::npu_apply_adam_w")
def npu_apply_adam_w(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps,
                     weight_decay, amsgrad, maximize):
    # torch.optim.AdamW's own single-tensor step (decoupled weight decay) on
    # the sample's tensors; returns the written tensors in schema order.
    n = len(params)
    for name, lst in (("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)) + (
            (("max_exp_avg_sqs", max_exp_avg_sqs),) if amsgrad else ()):
        if len(lst) != n:
            raise ValueError(f"{name}: expected as many tensors as params")
        if any(t.shape != p.shape or t.dtype != p.dtype for t, p in zip(lst, params)):
            raise ValueError(f"{name}: expected the shapes and dtypes of params")
    if step < 1:
        raise ValueError("step: expected a step count >= 1")
    steps = [torch.tensor(float(step - 1)) for _ in params]
    adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], steps,
              foreach=False, decoupled_weight_decay=True, amsgrad=amsgrad, beta1=beta1, beta2=beta2,
              lr=lr, weight_decay=weight_decay, eps=eps, maximize=maximize)
    return list(params) + list(exp_avgs) + list(exp_avg_sqs) + list(max_exp_avg_sqs)


@testing.samples("mindspeed_like::npu_apply_adam_w")
def npu_apply_adam_w_samples(dtype):
    def state(shapes, amsgrad):
        ps = [torch.randn(*s, dtype=dtype) for s in shapes]
        gs = [torch.randn(*s, dtype=dtype) for s in shapes]
        ms = [0.1 * torch.randn(*s, dtype=dtype) for s in shapes]
        vs = [0.01 * torch.rand(*s, dtype=dtype) for s in shapes]
        mx = [v + 0.01 * torch.rand_like(v) * (torch.rand_like(v) > 0.5) for v in vs] if amsgrad else []
        return ps, gs, ms, vs, mx

    hyper = (1e-3, 0.9, 0.999, 1e-8)
    for shapes, step, wd, amsgrad, maximize, name in (
            (((64, 33), (7,), (2, 3, 5)), 1, 0.01, False, False, "three tensors, step 1"),
            (((1000,),), 10, 0.1, False, False, "step 10"),
            (((16, 16), (5,)), 3, 0.0, True, False, "amsgrad, no weight decay"),
            (((300,), (0, 4)), 7, 0.01, False, True, "maximize, a zero-size tensor")):
        yield testing.Sample(*state(shapes, amsgrad), step, *hyper, wd, amsgrad, maximize, name=name)
    ps, gs, ms, vs, _ = state(((8,), (4, 2)), False)
    yield testing.Sample(ps, gs[:1], ms, vs, [], 1, *hyper, 0.01, False, False, name="grads too short (error)")
    yield testing.Sample(ps, gs, ms, [vs[1], vs[0]], [], 1, *hyper, 0.01, False, False,
                         name="exp_avg_sqs shapes differ (error)")
    yield testing.Sample(ps, gs, ms, vs, [], 1, *hyper, 0.01, True, False,
                         name="amsgrad without max_exp_avg_sqs (error)")
    yield testing.Sample(ps, gs, ms, vs, [], 0, *hyper, 0.01, False, False, name="step 0 (error)")
# ---------------------------------------------------------------------------
# aten::_fused_adam_ / aten::_fused_adamw_ and their .tensor_lr overloads
# (plugins/mindspeed_like/src/fused_adam.cpp): PyTorch's OpInfo database has
# no entry for them, so they run as the plugin's own ops (conformance.py),
# against the CPU's own fused kernel.
# ---------------------------------------------------------------------------


def _fused_adam_reference(name):
    def reference(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
                  weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        # What the kernel checks beyond ATen's CPU kernel (which reads out of
        # bounds instead): every list of params' shapes and dtypes.
        n = len(params)
        lists = [("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)]
        if amsgrad:
            lists.append(("max_exp_avg_sqs", max_exp_avg_sqs))
        for lname, lst in lists:
            if len(lst) != n:
                raise ValueError(f"{lname}: expected as many tensors as self")
            if any(t.shape != p.shape or t.dtype != p.dtype for t, p in zip(lst, params)):
                raise ValueError(f"{lname}: expected the shapes and dtypes of self")
        if any(s.numel() != 1 for s in state_steps):
            raise ValueError("state_steps: expected one-element tensors")
        # The float64 reference run widens every floating tensor; ATen's CPU
        # kernel reads grad_scale and found_inf as float32.
        f32 = lambda t: None if t is None else t.float()  # noqa: E731
        getattr(torch, name)(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr=lr, beta1=beta1,
                             beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad, maximize=maximize,
                             grad_scale=f32(grad_scale), found_inf=f32(found_inf))
        return list(params) + list(grads) + list(exp_avgs) + list(exp_avg_sqs) + list(max_exp_avg_sqs)

    return reference


def _fused_adam_samples(tensor_lr):
    def samples(dtype):
        def state(shapes, amsgrad, step):
            ps = [torch.randn(*s, dtype=dtype) for s in shapes]
            gs = [torch.randn(*s, dtype=dtype) for s in shapes]
            ms = [0.1 * torch.randn(*s, dtype=dtype) for s in shapes]
            vs = [0.01 * torch.rand(*s, dtype=dtype) for s in shapes]
            mx = [v + 0.01 * torch.rand_like(v) * (torch.rand_like(v) > 0.5) for v in vs] if amsgrad else []
            steps = [torch.tensor(float(step)) for _ in shapes]
            return ps, gs, ms, vs, mx, steps

        lr = torch.tensor(1e-3) if tensor_lr else 1e-3

        def hyper(amsgrad, maximize, wd, beta1=0.9, **extra):
            return dict(lr=lr, beta1=beta1, beta2=0.999, weight_decay=wd, eps=1e-8, amsgrad=amsgrad,
                        maximize=maximize, **extra)

        for shapes, step, kw, name in (
                (((64, 33), (7, ), (2, 3, 5)), 1, hyper(False, False, 0.01), "three tensors, step 1"),
                (((1000, ), ), 10, hyper(False, False, 0.1), "step 10"),
                (((16, 16), (5, )), 3, hyper(True, False, 0.0), "amsgrad, no weight decay"),
                (((300, ), (0, 4)), 7, hyper(False, True, 0.01), "maximize, a zero-size tensor"),
                (((37, ), ), 2, hyper(False, False, 0.01, beta1=0.2), "the lerp's other branch"),
                (((20, 3), (9, )), 4,
                 hyper(True, False, 0.01, grad_scale=torch.tensor(1024.0), found_inf=torch.tensor(0.0)),
                 "grad_scale, grads written back unscaled"),
                (((20, 3), ), 4,
                 hyper(False, False, 0.01, grad_scale=torch.tensor(8.0), found_inf=torch.tensor(1.0)),
                 "found_inf: no update")):
            amsgrad = kw["amsgrad"]
            yield testing.Sample(*state(shapes, amsgrad, step), name=name, **kw)
        ps, gs, ms, vs, _, st = state(((8, ), (4, 2)), False, 1)
        yield testing.Sample(ps, gs[:1], ms, vs, [], st, name="grads too short (error)", **hyper(False, False, 0.01))
        yield testing.Sample(ps, gs, ms, [vs[1], vs[0]], [], st, name="exp_avg_sqs shapes differ (error)",
                             **hyper(False, False, 0.01))
        yield testing.Sample(ps, gs, ms, vs, [], st, name="amsgrad without max_exp_avg_sqs (error)",
                             **hyper(True, False, 0.01))
        yield testing.Sample(ps, gs, ms, vs, [], st[:1], name="state_steps too short (error)",
                             **hyper(False, False, 0.01))

    return samples


for _name in ("_fused_adam_", "_fused_adamw_"):
    for _tensor_lr in (False, True):
        _op = f"aten::{_name}" + (".tensor_lr" if _tensor_lr else "")
        testing.reference(_op)(_fused_adam_reference(_name))
        testing.samples(_op)(_fused_adam_samples(_tensor_lr))


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


def _swiglu_halves(x, dim):
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise IndexError(f"dim {dim} out of range")
    if x.shape[dim] % 2:
        raise ValueError("self: expected an even size along dim")
    return x.chunk(2, dim)


@testing.reference("mindspeed_like::npu_swiglu")
def npu_swiglu(x, dim=-1):
    a, b = _swiglu_halves(x, dim)
    return torch.nn.functional.silu(a) * b


# At most 8 samples per op and dtype: what conformance runs by default.
SWIGLU_SHAPES = (((4, 16), -1), ((3, 8, 5), 1), ((6, 5, 4), 0), ((2, 4, 6), -2), ((0, 8), -1), ((8, 0), 0))


@testing.samples("mindspeed_like::npu_swiglu")
def npu_swiglu_samples(dtype):
    for shape, dim in SWIGLU_SHAPES + ((_large((64, 512), dtype), -1),):
        yield testing.Sample(4 * torch.randn(*shape, dtype=dtype), dim, name=f"{list(shape)} dim {dim}")
    yield testing.Sample(torch.tensor([-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, 2.5], dtype=dtype),
                         name="large and tiny")
    yield testing.Sample(torch.randn(4, 7, dtype=dtype), name="odd size (error)")


@testing.reference("mindspeed_like::npu_swiglu_backward")
def npu_swiglu_backward(grad_output, x, dim=-1):
    with torch.enable_grad():
        xd = x.detach().requires_grad_(True)
        a, b = _swiglu_halves(xd, dim)
        (dx,) = torch.autograd.grad(torch.nn.functional.silu(a) * b, xd, grad_output)
    return dx


@testing.samples("mindspeed_like::npu_swiglu_backward")
def npu_swiglu_backward_samples(dtype):
    for shape, dim in SWIGLU_SHAPES + (((64, 512), -1),):
        x = 4 * torch.randn(*shape, dtype=dtype)
        half = list(shape)
        half[dim] //= 2
        yield testing.Sample(torch.randn(*half, dtype=dtype), x, dim, name=f"{list(shape)} dim {dim}")
    yield testing.Sample(torch.randn(4, 4, dtype=dtype), torch.randn(4, 6, dtype=dtype), -1,
                         name="grad_output of the wrong shape (error)")


def _rotate(x, interleaved):
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((-x1, x0), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rotary_reference(x, r1, r2, interleaved):
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError("self: expected an even last dim")
    for r in (r1, r2):
        if r.dim() < 1 or r.dim() > x.dim() or r.shape[-1] != x.shape[-1]:
            raise ValueError("r: expected a shape that broadcasts to self")
        torch.broadcast_shapes(r.shape, x.shape)  # raises when it does not
        if torch.broadcast_shapes(r.shape, x.shape) != x.shape:
            raise ValueError("r: expected a shape that broadcasts to self")
    return x * r1 + _rotate(x, interleaved) * r2


def _rotary_backward_reference(grad, x, r1, r2, interleaved):
    with torch.enable_grad():
        xd, a, b = (t.detach().requires_grad_(True) for t in (x, r1, r2))
        return torch.autograd.grad(_rotary_reference(xd, a, b, interleaved), (xd, a, b), grad)


_ROTARY_MODES = {"half": False, "interleave": True}


@testing.reference("mindspeed_like::npu_rotary_mul")
def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    if rotary_mode not in _ROTARY_MODES:
        raise ValueError("rotary_mode: expected 'half' or 'interleave'")
    return _rotary_reference(x, r1, r2, _ROTARY_MODES[rotary_mode])


# (x, r) shapes: [B, S, N, D] with r [1, S, 1, D], [B, S, 1, D], [S, D], x's own, [1, 1, 1, D]; a 3-d x; zero-size
ROTARY_SHAPES = (((2, 6, 3, 8), (1, 6, 1, 8)), ((2, 5, 2, 16), (2, 5, 1, 16)), ((3, 4, 2, 6), (4, 1, 6)),
                 ((1, 4, 2, 8), (1, 4, 2, 8)), ((2, 3, 4, 4), (1, 1, 1, 4)), ((5, 3, 10), (5, 1, 10)),
                 ((2, 0, 2, 8), (1, 0, 1, 8)))


def _rotary_samples(dtype, modes, with_grad):
    for i, (xs, rs) in enumerate(ROTARY_SHAPES):
        mode = modes[i % 2]
        x = torch.randn(*xs, dtype=dtype)
        ang = torch.randn(*rs, dtype=torch.float64)
        args = (x, ang.cos().to(dtype), ang.sin().to(dtype), mode)
        if with_grad:
            args = (torch.randn(*xs, dtype=dtype),) + args
        yield args, f"x {list(xs)} r {list(rs)} {mode}"


@testing.samples("mindspeed_like::npu_rotary_mul")
def npu_rotary_mul_samples(dtype):
    for args, name in _rotary_samples(dtype, ("half", "interleave"), False):
        yield testing.Sample(*args, name=name)
    yield testing.Sample(torch.randn(2, 4, 1, 8, dtype=dtype), torch.randn(1, 3, 1, 8, dtype=dtype),
                         torch.randn(1, 4, 1, 8, dtype=dtype), name="r1 does not broadcast (error)")


@testing.reference("mindspeed_like::npu_rotary_mul_backward")
def npu_rotary_mul_backward(grad, x, r1, r2, rotary_mode="half"):
    if rotary_mode not in _ROTARY_MODES:
        raise ValueError("rotary_mode: expected 'half' or 'interleave'")
    return _rotary_backward_reference(grad, x, r1, r2, _ROTARY_MODES[rotary_mode])


@testing.samples("mindspeed_like::npu_rotary_mul_backward")
def npu_rotary_mul_backward_samples(dtype):
    for args, name in _rotary_samples(dtype, ("half", "interleave"), True):
        yield testing.Sample(*args, name=name)
    yield testing.Sample(torch.randn(2, 4, 1, 8, dtype=dtype), torch.randn(2, 4, 1, 8, dtype=dtype),
                         torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype), "halves",
                         name="unknown mode (error)")


@testing.reference("mindspeed_like::npu_rotary_position_embedding")
def npu_rotary_position_embedding(x, cos, sin, mode=0):
    if mode not in (0, 1):
        raise ValueError("mode: expected 0 or 1")
    return _rotary_reference(x, cos, sin, mode == 1)


@testing.samples("mindspeed_like::npu_rotary_position_embedding")
def npu_rotary_position_embedding_samples(dtype):
    for args, name in _rotary_samples(dtype, (0, 1), False):
        yield testing.Sample(*args, name=name)
    yield testing.Sample(torch.randn(2, 4, 1, 7, dtype=dtype), torch.randn(4, 7, dtype=dtype),
                         torch.randn(4, 7, dtype=dtype), 0, name="odd head dim (error)")


@testing.reference("mindspeed_like::npu_rotary_position_embedding_backward")
def npu_rotary_position_embedding_backward(grad, cos, sin, x, mode=0):
    if mode not in (0, 1):
        raise ValueError("mode: expected 0 or 1")
    dx, dcos, dsin = _rotary_backward_reference(grad, x, cos, sin, mode == 1)
    return dx, dcos, dsin


@testing.samples("mindspeed_like::npu_rotary_position_embedding_backward")
def npu_rotary_position_embedding_backward_samples(dtype):
    for (grad, x, cos, sin, mode), name in _rotary_samples(dtype, (0, 1), True):
        yield testing.Sample(grad, cos, sin, x, mode, name=name)
    yield testing.Sample(torch.randn(2, 4, 1, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype),
                         torch.randn(4, 8, dtype=dtype), torch.randn(2, 4, 1, 8, dtype=dtype), 2,
                         name="mode 2 (error)")


@testing.reference("mindspeed_like::npu_matmul_add_fp32")
def npu_matmul_add_fp32(x, weight, c):
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[0] or weight.dtype != x.dtype:
        raise ValueError("weight: expected [k, n] with x's k and dtype")
    if c.shape != (x.shape[1], weight.shape[1]) or c.dtype not in (torch.float32, torch.float64):
        raise ValueError("C: expected float32 [m, n]")  # float64: the float64 reference run's copy
    # the written C's expected value; half operands widen exactly to float32
    c += x.to(c.dtype).t() @ weight.to(c.dtype)
    return c


@testing.samples("mindspeed_like::npu_matmul_add_fp32")
def npu_matmul_add_fp32_samples(dtype):
    for k, m, n in ((16, 8, 12), (1, 5, 7), (64, 33, 17), (0, 4, 5), (7, 0, 3), (256, 128, 96)):
        yield testing.Sample(torch.randn(k, m, dtype=dtype), torch.randn(k, n, dtype=dtype), torch.randn(m, n),
                             name=f"k {k} m {m} n {n}")
    yield testing.Sample(torch.randn(8, 4, dtype=dtype), torch.randn(6, 5, dtype=dtype), torch.randn(4, 5),
                         name="k differs (error)")
    yield testing.Sample(torch.randn(8, 4, dtype=dtype), torch.randn(8, 5, dtype=dtype), torch.randn(5, 4),
                         name="C of the wrong shape (error)")
