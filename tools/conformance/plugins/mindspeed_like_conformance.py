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
