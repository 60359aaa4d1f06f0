"""mindspeed_like's fused training ops (plugins/mindspeed_like/src): gradcheck
in float64 through each op's derivative, AdamW against torch.optim.AdamW, and
the ops' error messages verbatim. Their samples against ATen references are
in plugins/mindspeed_like/conformance/mindspeed_like_conformance.py."""
import re

import pytest
import torch

import npubridge
from conftest import plugins_loaded_with

ops = torch.ops.mindspeed_like
PREFIX = "op 'mindspeed_like::{op}' failed in the kernel of plugin 'mindspeed_like': mindspeed_like::{op}: "


def kernel_error(op, message):
    return pytest.raises(RuntimeError, match="^" + re.escape(PREFIX.format(op=op) + message) + "$")


# --- npu_apply_adam_w ---

def _adamw_run(shapes, steps, dtype=torch.float32, **hyper):
    """The same `steps` AdamW steps by torch.optim.AdamW(foreach=False) on the
    CPU and by npu_apply_adam_w on npu copies; returns both parameter lists
    and both optimizer states."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]
    ref = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(ref, foreach=False, **hyper)
    group = opt.param_groups[0]
    npu = [p.to("npu") for p in params]
    m = [torch.zeros_like(p) for p in npu]
    v = [torch.zeros_like(p) for p in npu]
    vmax = [torch.zeros_like(p) for p in npu] if group["amsgrad"] else []
    for step in range(1, steps + 1):
        grads = [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]
        for r, gr in zip(ref, grads):
            r.grad = gr.clone()
        opt.step()
        ops.npu_apply_adam_w(npu, [gr.to("npu") for gr in grads], m, v, vmax, step, group["lr"],
                             group["betas"][0], group["betas"][1], group["eps"], group["weight_decay"],
                             group["amsgrad"], group["maximize"])
    states = [opt.state[r] for r in ref]
    return ref, npu, states, (m, v, vmax)


@pytest.mark.parametrize("hyper", [
    dict(lr=1e-3, weight_decay=0.01),
    dict(lr=1e-2, weight_decay=0.1, amsgrad=True),
    dict(lr=1e-3, weight_decay=0.01, maximize=True),
    dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0, amsgrad=True, maximize=True),
], ids=["weight_decay", "amsgrad", "maximize", "all"])
def test_adamw_tracks_torch_optim_over_100_float32_steps(hyper):
    # Note [AdamW's arithmetic follows torch.optim.AdamW] (adamw.cpp): the
    # same operations in the same order, so after 100 steps every element is
    # within 1e-6 of torch's relative to its magnitude (the one rounding that
    # differs is sqrt, correctly rounded here and MKL's within 1 ulp there;
    # the absolute floor covers parameters that pass through zero).
    ref, npu, states, (m, v, vmax) = _adamw_run([(257,), (33, 17), (4, 4, 8)], 100, **hyper)
    for r, p, st, mi, vi in zip(ref, npu, states, m, v):
        torch.testing.assert_close(p.cpu(), r.detach(), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(mi.cpu(), st["exp_avg"], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(vi.cpu(), st["exp_avg_sq"], rtol=1e-6, atol=1e-12)
    for vm, st in zip(vmax, states):
        torch.testing.assert_close(vm.cpu(), st["max_exp_avg_sq"], rtol=1e-6, atol=1e-12)


def test_adamw_float64_tracks_torch_optim():
    ref, npu, _, _ = _adamw_run([(64,), (8, 9)], 10, dtype=torch.float64, lr=1e-2, weight_decay=0.01)
    for r, p in zip(ref, npu):
        torch.testing.assert_close(p.cpu(), r.detach(), rtol=1e-12, atol=1e-12)


UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def _adamw_float64_with_bound(p0, grads, dtype, lr, b1, b2, eps, wd):
    """AdamW in float64 from the same start and gradients (the reference), and
    per element a bound on how far from it a correct half-type kernel may end.

    The error model of a kernel that keeps p, m and v in `dtype` (unit
    roundoff u) and computes in float32 (u32), to first order per element:
    storing m_k and v_k adds u|m_k| and u|v_k|, and earlier errors decay by b1
    and b2 (E_m, E_v); the update lr/bc1 * m/(sqrt(v/bc2) + eps) inherits
    E_m through m and E_v/2 relative through sqrt(v), plus a few float32
    roundings; storing p_k adds u|p_k|, and earlier errors shrink by the
    decay (1 - lr*wd). Twice that covers the second-order terms."""
    u, u32 = UNIT_ROUNDOFF[dtype], UNIT_ROUNDOFF[torch.float32]
    p = p0.double()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    e_p, e_m, e_v = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
    for k, g in enumerate(grads, start=1):
        g = g.double()
        bc1, bc2 = 1 - b1**k, 1 - b2**k
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        e_m = b1 * e_m + (u + 4 * u32) * m.abs()
        e_v = b2 * e_v + (u + 4 * u32) * v
        d = v.sqrt() / bc2**0.5 + eps
        update = lr / bc1 * m / d
        e_update = (lr / bc1 * e_m / d + update.abs() * (e_v / (2 * v)) * (v.sqrt() / bc2**0.5) / d
                    + 8 * u32 * update.abs())
        p = p - update
        e_p = (1 - lr * wd) * e_p + e_update + (u + 4 * u32) * p.abs()
    return p, 2 * e_p


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_adamw_half_types_within_their_error_bound_of_float64(dtype):
    # Half types keep p, m and v in their own dtype and compute in float32:
    # judged against AdamW in float64, within the bound of that error model
    # (_adamw_float64_with_bound), which must be far below how far the
    # parameters move, or a wrong update could hide in it. Parameters of an
    # initialised layer's scale (0.1): a bf16 rounding of a parameter near 1
    # (2^-8) is the size of a whole lr=1e-2 step.
    lr, b1, b2, eps, wd, steps = 1e-2, 0.9, 0.999, 1e-8, 0.01, 10
    g = torch.Generator().manual_seed(0)
    shapes = [(64,), (8, 9)]
    params = [(torch.randn(*s, generator=g) * 0.1).to(dtype) for s in shapes]
    grads = [[torch.randn(*s, generator=g).to(dtype) for s in shapes] for _ in range(steps)]
    npu = [p.to("npu") for p in params]
    m = [torch.zeros_like(p) for p in npu]
    v = [torch.zeros_like(p) for p in npu]
    for step in range(1, steps + 1):
        ops.npu_apply_adam_w(npu, [gr.to("npu") for gr in grads[step - 1]], m, v, [], step, lr, b1, b2, eps, wd,
                             False, False)
    for i, (p0, p) in enumerate(zip(params, npu)):
        want, bound = _adamw_float64_with_bound(p0, [gs[i] for gs in grads], dtype, lr, b1, b2, eps, wd)
        got = p.cpu()
        assert got.dtype == dtype
        err = (got.double() - want).abs()
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (
            f"param {i}: element {worst} is {err.flatten()[worst]:.3g} from float64's, over its bound "
            f"{bound.flatten()[worst]:.3g}")
        # The bound of the typical element is under half of how far it moved
        # (float16: ~3%, bfloat16: ~25%): an update 10% off fails.
        ratio = float((bound / (want - p0.double()).abs()).median())
        assert ratio < 0.5, f"param {i}: the bound is {ratio:.2f} of the movement: the test cannot tell"


def test_adamw_mixed_dtypes_in_one_call():
    p32, p16 = torch.ones(5, device="npu"), torch.ones(3, device="npu", dtype=torch.bfloat16)
    ts = [[torch.full_like(p, 0.5) for p in (p32, p16)] for _ in range(3)]
    ops.npu_apply_adam_w([p32, p16], ts[0], ts[1], ts[2], [], 1, 0.1, 0.9, 0.999, 1e-8, 0.0, False, False)
    assert npubridge.stats()["mindspeed_like::npu_apply_adam_w"]["native"]["mindspeed_like"] >= 1
    # g = m = 0.5 > 0: both parameters took a step down.
    assert p32.cpu().max().item() < 1 and p16.cpu().max().item() < 1


def _adamw_args(n=2, **over):
    z = [torch.zeros(4, device="npu") for _ in range(n)]
    args = dict(params=z, grads=[t.clone() for t in z], exp_avgs=[t.clone() for t in z],
                exp_avg_sqs=[t.clone() for t in z], max_exp_avg_sqs=[], step=1, lr=1e-3, beta1=0.9, beta2=0.999,
                eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False)
    args.update(over)
    return args


@pytest.mark.parametrize("over, message", [
    (dict(grads=[torch.zeros(4, device="npu")]), "grads: expected as many tensors as params (2) but found 1"),
    (dict(exp_avgs=[torch.zeros(4, device="npu"), torch.zeros(2, 2, device="npu")]),
     "exp_avgs[1]: expected the shape of params[1] [4] but found [2, 2]"),
    (dict(exp_avg_sqs=[torch.zeros(4, device="npu"), torch.zeros(4, device="npu", dtype=torch.float16)]),
     "exp_avg_sqs[1]: expected the dtype of params[1] (float32) but found float16"),
    (dict(amsgrad=True), "max_exp_avg_sqs: expected as many tensors as params (2) since amsgrad is set but found 0"),
    (dict(step=0), "step: expected a step count >= 1 but found 0"),
])
def test_adamw_errors(over, message):
    with kernel_error("npu_apply_adam_w", message):
        ops.npu_apply_adam_w(**_adamw_args(**over))


# --- npu_swiglu ---

def _gradcheck(fn, *inputs):
    inputs = [t.to("npu").requires_grad_(True) for t in inputs]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("shape, dim", [((3, 8), -1), ((4, 6, 5), 1), ((6, 3, 2), 0), ((2, 4, 3), -2)])
def test_swiglu_gradcheck(shape, dim):
    _gradcheck(lambda x: ops.npu_swiglu(x, dim), 3 * torch.randn(*shape, dtype=torch.float64))


def test_swiglu_matches_the_composite():
    x = 4 * torch.randn(5, 12)
    a, b = x.double().chunk(2, -1)
    torch.testing.assert_close(ops.npu_swiglu(x.to("npu")).cpu().double(), torch.nn.functional.silu(a) * b,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape, dim, message", [
    ((4, 7), -1, "self: expected an even size along dim -1 but found 7 (shape [4, 7])"),
    ((4, 8), 2, "dim: expected a dimension of the 2-d self (in [-2, 1]) but found 2"),
    ((4, 8), -3, "dim: expected a dimension of the 2-d self (in [-2, 1]) but found -3"),
])
def test_swiglu_errors(shape, dim, message):
    with kernel_error("npu_swiglu", message):
        ops.npu_swiglu(torch.randn(*shape, device="npu"), dim)


def test_swiglu_backward_errors():
    with kernel_error("npu_swiglu_backward", "grad_output: expected the shape of the forward's result [4, 3] but "
                      "found [4, 6]"):
        ops.npu_swiglu_backward(torch.randn(4, 6, device="npu"), torch.randn(4, 6, device="npu"), -1)


# --- npu_rms_norm, npu_add_rms_norm ---

@pytest.mark.parametrize("x_shape, g_shape", [((3, 8), (8,)), ((2, 3, 4), (3, 4)), ((1, 5), (5,))])
def test_rms_norm_gradcheck(x_shape, g_shape):
    x, g = torch.randn(*x_shape, dtype=torch.float64), torch.randn(*g_shape, dtype=torch.float64)
    _gradcheck(lambda a, b: ops.npu_rms_norm(a, b, 1e-6)[0], x, g)


def test_add_rms_norm_gradcheck_through_both_returns():
    # y and the sum both reach the loss: the sum's gradient joins the norm's
    x1, x2, g = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64), torch.randn(6)
    g = g.double()

    def fn(a, b, c):
        y, _, s = ops.npu_add_rms_norm(a, b, c, 1e-6)
        return y, s

    _gradcheck(fn, x1, x2, g)


def test_add_rms_norm_returns_the_sum_and_float32_rstd():
    x1, x2 = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16)
    g = torch.randn(8, dtype=torch.bfloat16)
    y, rstd, s = ops.npu_add_rms_norm(x1.to("npu"), x2.to("npu"), g.to("npu"))
    assert torch.equal(s.cpu(), x1 + x2)
    assert rstd.dtype == torch.float32 and rstd.shape == (3, 1)
    ref = torch.rsqrt((x1 + x2).float().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rstd.cpu(), ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("args, op, message", [
    (lambda: (torch.randn(4, 8), torch.randn(4)), "npu_rms_norm",
     "gamma: expected the trailing shape of self [4, 8] but found [4]"),
    (lambda: (torch.randn(4, 8), torch.randn(2, 4, 8)), "npu_rms_norm",
     "gamma: expected 1 to 2 dimensions but found 3"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 7), torch.randn(8)), "npu_add_rms_norm",
     "x2: expected the shape of x1 [4, 8] but found [4, 7]"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(7)), "npu_add_rms_norm",
     "gamma: expected the trailing shape of x1 [4, 8] but found [7]"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(4)), "npu_rms_norm_backward",
     "rstd: expected shape [4, 1] but found [4]"),
    (lambda: (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), torch.randn(4, 1).double()),
     "npu_add_rms_norm_backward", "rstd: expected float32 (the forward's statistics) but found float64"),
])
def test_rms_norm_errors(args, op, message):
    with kernel_error(op, message):
        getattr(ops, op)(*[t.to("npu") for t in args()])


# --- npu_rotary_mul, npu_rotary_position_embedding ---

@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("x_shape, r_shape", [((2, 3, 2, 4), (1, 3, 1, 4)), ((1, 2, 3, 6), (3, 6)),
                                              ((2, 2, 1, 4), (2, 2, 1, 4))])
def test_rotary_mul_gradcheck(mode, x_shape, r_shape):
    x, r1, r2 = (torch.randn(*s, dtype=torch.float64) for s in (x_shape, r_shape, r_shape))
    _gradcheck(lambda a, b, c: ops.npu_rotary_mul(a, b, c, mode), x, r1, r2)


@pytest.mark.parametrize("mode", [0, 1])
def test_rotary_position_embedding_gradcheck(mode):
    x, c, s = torch.randn(2, 3, 2, 4, dtype=torch.float64), torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
    _gradcheck(lambda a, b, d: ops.npu_rotary_position_embedding(a, b, d, mode), x, c.double(), s.double())


def test_rotary_position_embedding_is_rotary_mul():
    x, ang = torch.randn(2, 5, 3, 8), torch.randn(1, 5, 1, 8)
    args = [t.to("npu") for t in (x, ang.cos(), ang.sin())]
    for mode, name in ((0, "half"), (1, "interleave")):
        assert torch.equal(ops.npu_rotary_position_embedding(*args, mode).cpu(),
                           ops.npu_rotary_mul(*args, name).cpu())


@pytest.mark.parametrize("op, args, message", [
    ("npu_rotary_mul", ((2, 4, 1, 8), (1, 3, 1, 8), (1, 4, 1, 8), "half"),
     "r1: expected a shape that broadcasts to self [2, 4, 1, 8] (right-aligned: at most 4 dims, each 1 or self's, "
     "the last 8) but found [1, 3, 1, 8]"),
    ("npu_rotary_mul", ((2, 4, 1, 8), (1, 4, 1, 8), (4, 4), "half"),
     "r2: expected a shape that broadcasts to self [2, 4, 1, 8] (right-aligned: at most 4 dims, each 1 or self's, "
     "the last 8) but found [4, 4]"),
    ("npu_rotary_mul", ((2, 1, 4, 8), (4, 8), (4, 8), "halves"),
     "rotary_mode: expected 'half' or 'interleave' but found 'halves'"),
    ("npu_rotary_mul", ((2, 4, 1, 7), (4, 7), (4, 7), "half"),
     "self: expected at least 1 dim and an even last dim but found shape [2, 4, 1, 7]"),
    ("npu_rotary_position_embedding", ((2, 1, 4, 8), (4, 8), (4, 8), 2),
     "mode: expected 0 (rotate-half) or 1 (interleaved) but found 2"),
    ("npu_rotary_position_embedding", ((4, 8), (2, 4, 8), (4, 8), 0),
     "cos: expected a shape that broadcasts to x [4, 8] (right-aligned: at most 2 dims, each 1 or x's, the last 8) "
     "but found [2, 4, 8]"),
])
def test_rotary_errors(op, args, message):
    tensors = [torch.randn(*s, device="npu") for s in args[:3]]
    with kernel_error(op, message):
        getattr(ops, op)(*tensors, args[3])


# --- npu_matmul_add_fp32 ---

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_add_accumulates_in_float32(dtype):
    x, w, c = torch.randn(48, 20, dtype=dtype), torch.randn(48, 30, dtype=dtype), torch.randn(20, 30)
    cn = c.to("npu")
    ops.npu_matmul_add_fp32(x.to("npu"), w.to("npu"), cn)
    ops.npu_matmul_add_fp32(x.to("npu"), w.to("npu"), cn)
    assert cn.dtype == torch.float32
    ref = c.double() + 2 * (x.double().t() @ w.double())
    # float32 accumulation of 48 exact products per element, twice
    torch.testing.assert_close(cn.cpu().double(), ref, rtol=0, atol=2 * 49 * 2**-24 * ref.abs().max().item())
    assert npubridge.stats()["mindspeed_like::npu_matmul_add_fp32"]["native"]["mindspeed_like"] >= 2


@pytest.mark.parametrize("shapes, message", [
    (((8, 4), (6, 5), (4, 5)), "weight: expected a 2-d tensor [k, n] with x's k = 8 but found shape [6, 5]"),
    (((8, 4), (8, 5), (5, 4)), "C: expected shape [m, n] = [4, 5] but found [5, 4]"),
    (((8,), (8, 5), (1, 5)), "x: expected a 2-d tensor [k, m] but found shape [8]"),
])
def test_matmul_add_errors(shapes, message):
    x, w, c = (torch.randn(*s, device="npu") for s in shapes)
    with kernel_error("npu_matmul_add_fp32", message):
        ops.npu_matmul_add_fp32(x, w, c)


# --- conformance --plugin on ops that write their arguments ---

def test_conformance_reads_written_lists_and_flags_unwritten_changes():
    from npubridge.conformance import custom

    cop = custom.CustomOp("mindspeed_like::npu_apply_adam_w", None, None)
    cpu = [[torch.ones(3), torch.ones(2)], [torch.ones(3), torch.ones(2)], [torch.ones(3), torch.ones(2)],
           [torch.ones(3), torch.ones(2)], [], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, False]
    npu = [[t.clone() for t in a] if isinstance(a, list) else a for a in cpu]
    # the results of an op returning nothing: its written lists' tensors, in schema order
    assert [id(t) for t in cop.outputs(None, npu)] == [id(t) for i in (0, 2, 3, 4) for t in npu[i]]
    npu[0][1] += 1  # params is written: fine
    assert custom._unwritten_change(cop, npu, {}, cpu, {}) is None
    npu[1][1][0] = 5  # grads is not
    assert custom._unwritten_change(cop, npu, {}, cpu, {}) == "grads[1]"


def test_written_arguments_get_their_versions_bumped():
    # as ATen's in-place ops: autograd then sees a saved tensor the op changed
    ts = [torch.zeros(4, device="npu") for _ in range(4)]
    before = [t._version for t in ts]
    ops.npu_apply_adam_w([ts[0]], [ts[1]], [ts[2]], [ts[3]], [], 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, False)
    assert [t._version - b for t, b in zip(ts, before)] == [1, 0, 1, 1]  # grads is only read
    c = torch.zeros(3, 4, device="npu")
    ops.npu_matmul_add_fp32(torch.randn(5, 3, device="npu"), torch.randn(5, 4, device="npu"), c)
    assert c._version == 1


# --- the ISA cap: NPUB_PLUGINS_MAX_ISA (test_settings.py), not the retired NPUB_MINDSPEED_MAX_ISA ---

def test_the_retired_isa_cap_is_refused_naming_the_one_cap():
    names, failures = plugins_loaded_with(NPUB_MINDSPEED_MAX_ISA="baseline")
    assert "mindspeed_like" not in names
    assert ("NPUB_MINDSPEED_MAX_ISA: expected unset (the in-tree plugins read one cap, NPUB_PLUGINS_MAX_ISA) "
            "but found 'baseline'") in failures
