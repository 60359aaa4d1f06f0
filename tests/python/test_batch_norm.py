"""BatchNorm on npu: the running statistics it updates in training, and the
eval() output that uses them, against the same module on the CPU in float32
(calibration) and float64 (reference), judged by the error model
(conftest.assert_judged). Note [native_batch_norm writes what its schema
hides] (python_ext/csrc/aten/fallback.cpp): the statistics used to stay at
their initial values on npu. cann_like serves native_batch_norm and its
backward (plugins/cann_like/src/batch_norm.cpp): no call falls back to the
CPU, and the running statistics are written in the npu tensors
(Note [BatchNorm writes the running statistics in place])."""
import copy

import pytest
import torch
import torch.nn.functional as F

import npubridge
from conftest import assert_judged, assert_no_fallbacks


def _train_then_eval(module, batches, device, dtype):
    m = module.to(device=device, dtype=dtype).train()
    for x in batches:
        m(x.to(device=device, dtype=dtype))
    m.eval()
    return m, m(batches[0].to(device=device, dtype=dtype))


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.BatchNorm1d(6), (16, 6)),
    (lambda: torch.nn.BatchNorm1d(6, momentum=None), (16, 6, 5)),  # cumulative average
    (lambda: torch.nn.BatchNorm2d(8), (4, 8, 5, 5)),
    (lambda: torch.nn.BatchNorm3d(3, affine=False), (2, 3, 4, 4, 4)),
])
def test_running_stats_and_eval(make, shape):
    torch.manual_seed(0)
    batches = [torch.randn(shape) * 3 + 1 for _ in range(3)]
    state = make().state_dict()
    outs = {}
    npubridge.reset_stats()
    for device, dtype in (("npu", torch.float32), ("cpu", torch.float32), ("cpu", torch.float64)):
        m = make()
        m.load_state_dict(state)
        outs[device, dtype] = _train_then_eval(m, batches, device, dtype)
    assert npubridge.stats()["aten::native_batch_norm"]["native"].get("cann_like") == len(batches) + 1
    assert_no_fallbacks()
    (npu, y_npu), (host, y_host), (wide, y_wide) = outs["npu", torch.float32], outs["cpu", torch.float32], \
        outs["cpu", torch.float64]
    assert int(npu.num_batches_tracked.cpu()) == len(batches)
    for name in ("running_mean", "running_var"):
        got = getattr(npu, name)
        assert got.device.type == "npu"
        assert not torch.equal(got.cpu(), make().state_dict()[name]), f"{name} never moved"
        assert_judged(got, getattr(host, name), getattr(wide, name), name)
    assert_judged(y_npu, y_host, y_wide, "eval output")


def test_untracked_and_eval_only_leave_no_stats():
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    m = torch.nn.BatchNorm1d(4, track_running_stats=False).to("npu")
    y = m(x.to("npu"))
    assert m.running_mean is None
    ref = torch.nn.BatchNorm1d(4, track_running_stats=False)(x)
    wide = torch.nn.BatchNorm1d(4, track_running_stats=False).double()(x.double())
    assert_judged(y, ref, wide, "batch statistics")
    e = torch.nn.BatchNorm1d(4).to("npu").eval()
    e(x.to("npu"))
    assert torch.equal(e.running_mean.cpu(), torch.zeros(4)) and torch.equal(e.running_var.cpu(), torch.ones(4))


# SyncBatchNorm's ops (Note [Ops the CPU lacks], python_ext/csrc/aten/
# sync_batch_norm.cpp), each on npu against plain torch ops on the CPU: the
# same formula in float32 (calibration) and float64 (reference). Half and
# bfloat16 inputs accumulate in float32, as CUDA does: their statistics come
# back in float32, their elementwise results in the input's dtype.
_SHAPES = [(16, 6), (8, 6, 5), (4, 8, 5, 5), (2, 3, 4, 4, 4), (16, 32, 2, 2)]  # the last: Note [BatchNorm on small planes]
_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_EPS = 1e-5


def _dims(x):
    return [0] + list(range(2, x.dim()))


def _bc(v, x):  # a per-channel vector shaped to broadcast over x
    return v.reshape([1, -1] + [1] * (x.dim() - 2))


def _ref_stats(x, eps=_EPS):  # (mean, invstd, unbiased var) of x, in x's dtype
    mean = x.mean(_dims(x))
    var = x.var(_dims(x), unbiased=False)
    return mean, (var + eps).rsqrt(), x.var(_dims(x), unbiased=True)


def _sample(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3 + 1).to(dtype)  # rounded to dtype once


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", _SHAPES)
def test_batch_norm_stats(shape, dtype):
    x = _sample(shape, dtype)
    mean, invstd = torch.batch_norm_stats(x.to("npu"), _EPS)
    assert mean.device.type == "npu" and mean.dtype == invstd.dtype == torch.float32
    assert_judged(mean, _ref_stats(x.float())[0], _ref_stats(x.double())[0], "mean")
    assert_judged(invstd, _ref_stats(x.float())[1], _ref_stats(x.double())[1], "invstd")


def test_batch_norm_stats_channels_last_and_eps_zero():
    x = _sample((4, 8, 5, 5), torch.float32).contiguous(memory_format=torch.channels_last)
    mean, invstd = torch.batch_norm_stats(x.to("npu"), _EPS)
    assert_judged(mean, _ref_stats(x)[0], _ref_stats(x.double())[0], "channels_last mean")
    assert_judged(invstd, _ref_stats(x)[1], _ref_stats(x.double())[1], "channels_last invstd")
    # A constant channel with eps = 0 has invstd 0 (CUDA's InvStd), not inf.
    c = torch.ones(4, 2, 3)
    c[:, 1] = torch.arange(12.).reshape(4, 3)
    _, invstd = torch.batch_norm_stats(c.to("npu"), 0.0)
    assert invstd.cpu()[0] == 0 and torch.isfinite(invstd.cpu()).all()


def _ranks_stats(x, sizes):
    """Per-rank (mean, invstd) rows of the chunks of x's batch of `sizes`
    (a zero-size rank gets zeros, as SyncBatchNorm sends for an empty
    input), in float32, and the counts (values per channel)."""
    means, invstds, off = [], [], 0
    for n in sizes:
        part = x[off:off + n].float()
        off += n
        m, s, _ = _ref_stats(part) if n else (torch.zeros(x.shape[1]),) * 3
        means.append(m)
        invstds.append(s)
    per_sample = x[0, 0].numel()
    return torch.stack(means), torch.stack(invstds), torch.tensor(sizes, dtype=torch.float32) * per_sample


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape, sizes", [((16, 6), [3, 13]), ((8, 6, 5), [5, 0, 3]), ((4, 8, 5, 5), [2, 2])])
def test_batch_norm_gather_stats_with_counts(shape, sizes, dtype):
    x = _sample(shape, dtype)
    mean_all, invstd_all, counts = _ranks_stats(x, sizes)
    momentum = 0.1
    rm0 = torch.linspace(-1, 1, shape[1])
    rv0 = torch.linspace(0.5, 2, shape[1])
    rm, rv = rm0.to("npu"), rv0.to("npu")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x.to("npu"), mean_all.to("npu"), invstd_all.to("npu"), rm, rv, momentum, _EPS, counts.to("npu"))
    assert mean.dtype == invstd.dtype == torch.float32 and mean.device.type == "npu"
    assert_judged(mean, _ref_stats(x.float())[0], _ref_stats(x.double())[0], "global mean")
    assert_judged(invstd, _ref_stats(x.float())[1], _ref_stats(x.double())[1], "global invstd")
    # The running statistics moved in the npu tensors given (the schema
    # does not mark them written).
    assert not torch.equal(rm.cpu(), rm0) and not torch.equal(rv.cpu(), rv0), "running stats never moved"
    for got, r0, k, what in ((rm, rm0, 0, "running_mean"), (rv, rv0, 2, "running_var")):
        assert_judged(got, (1 - momentum) * r0 + momentum * _ref_stats(x.float())[k],
                      (1 - momentum) * r0.double() + momentum * _ref_stats(x.double())[k], what)
    # Without running statistics: the same global statistics.
    m2, s2 = torch.batch_norm_gather_stats_with_counts(
        x.to("npu"), mean_all.to("npu"), invstd_all.to("npu"), None, None, momentum, _EPS, counts.to("npu"))
    assert torch.equal(m2.cpu(), mean.cpu()) and torch.equal(s2.cpu(), invstd.cpu())


def test_batch_norm_gather_stats_equal_counts_and_half_running_stats():
    x = _sample((12, 4, 3), torch.float16)
    mean_all, invstd_all, _ = _ranks_stats(x, [4, 4, 4])
    rm, rv = torch.zeros(4, dtype=torch.float16, device="npu"), torch.ones(4, dtype=torch.float16, device="npu")
    mean, invstd = torch.batch_norm_gather_stats(
        x.to("npu"), mean_all.to("npu"), invstd_all.to("npu"), rm, rv, 0.5, _EPS, 4 * 3)  # values per channel
    assert_judged(mean, _ref_stats(x.float())[0], _ref_stats(x.double())[0], "global mean")
    assert_judged(invstd, _ref_stats(x.float())[1], _ref_stats(x.double())[1], "global invstd")
    assert rm.dtype == torch.float16
    assert_judged(rm, (0.5 * _ref_stats(x.float())[0]).half(), 0.5 * _ref_stats(x.double())[0], "running_mean")
    assert_judged(rv, (0.5 + 0.5 * _ref_stats(x.float())[2]).half(), 0.5 + 0.5 * _ref_stats(x.double())[2],
                  "running_var")


def _affine(c):
    return torch.linspace(0.5, 1.5, c), torch.linspace(-0.3, 0.3, c)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_elemt(shape, dtype, affine):
    x = _sample(shape, dtype)
    mean, invstd, _ = _ref_stats(x.float())
    w, b = _affine(shape[1]) if affine else (None, None)

    def f(x):
        y = (x - _bc(mean.to(x.dtype), x)) * _bc(invstd.to(x.dtype), x)
        return y * _bc(w.to(x.dtype), x) + _bc(b.to(x.dtype), x) if affine else y

    npu = (lambda t: None if t is None else t.to("npu"))
    y = torch.batch_norm_elemt(x.to("npu"), npu(w), npu(b), mean.to("npu"), invstd.to("npu"), _EPS)
    assert y.dtype == dtype and y.device.type == "npu"
    assert_judged(y, f(x.float()).to(dtype), f(x.double()), "batch_norm_elemt")


def _grads(shape, dtype):
    x, dy = _sample(shape, dtype, seed=0), _sample(shape, dtype, seed=1)
    mean, invstd, _ = _ref_stats(x.float())
    return x, dy, mean, invstd


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", _SHAPES)
def test_batch_norm_backward_reduce(shape, dtype):
    x, dy, mean, invstd = _grads(shape, dtype)
    w, _ = _affine(shape[1])

    def f(x, dy):
        sum_dy = dy.sum(_dims(x))
        sum_dy_xmu = (dy * (x - _bc(mean.to(x.dtype), x))).sum(_dims(x))
        return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd.to(x.dtype)

    got = torch.batch_norm_backward_reduce(dy.to("npu"), x.to("npu"), mean.to("npu"), invstd.to("npu"),
                                           w.to("npu"), True, True, True)
    host, wide = f(x.float(), dy.float()), f(x.double(), dy.double())
    for g, h, wd, what in zip(got, host + (host[0],), wide + (wide[0],),
                              ("sum_dy", "sum_dy_xmu", "grad_weight", "grad_bias")):
        assert g.dtype == torch.float32
        assert_judged(g, h, wd, what)
    # Only what is asked for.
    none = torch.batch_norm_backward_reduce(dy.to("npu"), x.to("npu"), mean.to("npu"), invstd.to("npu"),
                                            None, True, False, False)
    assert none[0] is not None and none[2] is None and none[3] is None
    assert torch.equal(none[0].cpu(), got[0].cpu())


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_backward_elemt(shape, dtype, affine):
    x, dy, mean, invstd = _grads(shape, dtype)
    w = _affine(shape[1])[0] if affine else None
    # Global sums over a "world" twice this batch: the other rank's part is
    # this one's sums again, with a count of 2 * the local one split 3:1.
    local = x.numel() // shape[1]
    sum_dy = 2 * dy.float().sum(_dims(x))
    sum_dy_xmu = 2 * (dy.float() * (x.float() - _bc(mean, x))).sum(_dims(x))
    count = torch.tensor([local + local // 2, local - local // 2], dtype=torch.int32)

    def f(x, dy):
        d = x.dtype
        n = 2 * local
        is_ = _bc(invstd.to(d), x)
        g = (dy - _bc(sum_dy.to(d), x) / n - (x - _bc(mean.to(d), x)) * is_ * is_ * _bc(sum_dy_xmu.to(d), x) / n) * is_
        return g * _bc(w.to(d), x) if affine else g

    gi = torch.batch_norm_backward_elemt(dy.to("npu"), x.to("npu"), mean.to("npu"), invstd.to("npu"),
                                         None if w is None else w.to("npu"), sum_dy.to("npu"),
                                         sum_dy_xmu.to("npu"), count.to("npu"))
    assert gi.dtype == dtype and gi.device.type == "npu"
    assert_judged(gi, f(x.float(), dy.float()).to(dtype), f(x.double(), dy.double()), "grad_input")


def test_out_overloads_write_their_outs():
    x = _sample((4, 8, 5, 5), torch.float16)
    mean, invstd = torch.empty(0, device="npu"), torch.empty(0, device="npu")
    ret = torch.ops.aten.batch_norm_stats.out(x.to("npu"), _EPS, out0=mean, out1=invstd)
    assert ret[0] is mean and ret[1] is invstd and mean.shape == (8,)
    want = torch.batch_norm_stats(x.to("npu"), _EPS)
    assert torch.equal(mean.cpu(), want[0].cpu()) and torch.equal(invstd.cpu(), want[1].cpu())
    y = torch.empty(0, dtype=torch.float16, device="npu")
    torch.ops.aten.batch_norm_elemt.out(x.to("npu"), None, None, mean, invstd, _EPS, out=y)
    assert torch.equal(y.cpu(), torch.batch_norm_elemt(x.to("npu"), None, None, mean, invstd, _EPS).cpu())
    # (refused before it runs, by the check of out arguments' dtypes)
    with pytest.raises(RuntimeError, match=r"out tensor to have dtype float, but got c10::Half"):
        torch.ops.aten.batch_norm_stats.out(x.to("npu"), _EPS, out0=torch.empty(0, dtype=torch.float16, device="npu"),
                                            out1=invstd)


def test_bad_input_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"aten::batch_norm_stats: argument 'input' must be \(N, C, \*\) with at "
                                           r"least 2 dims, got a 1-dim tensor of shape \[5\]"):
        torch.batch_norm_stats(torch.randn(5, device="npu"), _EPS)
    m = torch.zeros(2, 3, device="npu")
    with pytest.raises(RuntimeError, match=r"batch_norm_gather_stats_with_counts: argument 'counts' must hold 2 "
                                           r"counts \(one per row of 'mean'\), got 3"):
        torch.batch_norm_gather_stats_with_counts(torch.randn(4, 3, device="npu"), m, m + 1, None, None, 0.1, _EPS,
                                                  torch.ones(3, device="npu"))


def test_batch_norm_update_stats_writes_the_running_stats():
    # ATen's CPU kernel runs on copies; the new statistics come back into
    # the npu tensors (the schema hides the writes): exactly the CPU's.
    x = _sample((8, 3, 4), torch.float32)
    rm, rv = torch.zeros(3), torch.ones(3)
    want = torch.batch_norm_update_stats(x, rm, rv, 0.3)
    rm_npu, rv_npu = torch.zeros(3, device="npu"), torch.ones(3, device="npu")
    got = torch.batch_norm_update_stats(x.to("npu"), rm_npu, rv_npu, 0.3)
    assert not torch.equal(rm, torch.zeros(3))
    for g, w in zip(got + (rm_npu, rv_npu), want + (rm, rv)):
        assert g.device.type == "npu" and torch.equal(g.cpu(), w)


# native_batch_norm and its backward on cann_like's kernels, against the
# CPU in the same dtypes and in float64: output, the gradients of input,
# weight and bias, and the running statistics, for ranks 2 to 5, with the
# channels innermost (channels_last for 4-d and 5-d) as well as contiguous,
# training and eval, the half types alone and with float32 parameters
# (ATen's mixed-dtype rule).
f32, f64, bf16, f16 = torch.float32, torch.float64, torch.bfloat16, torch.float16


def _channels_innermost(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def _bn_train_step(x, g, w, b, rm, rv, training):
    """(y, dx[, dw, db], running_mean, running_var) of one F.batch_norm
    forward and backward; rm and rv are updated in place."""
    x = x.detach().requires_grad_()
    params = [p.detach().requires_grad_() for p in (w, b) if p is not None]
    y = F.batch_norm(x, rm, rv, *(params or [None, None]), training=training, momentum=0.2, eps=1e-5)
    return (y, *torch.autograd.grad(y, [x, *params], g), rm, rv)


def _assert_within_sum_bound(got, ref, terms, what):
    """float64 results, where the CPU is the float64 reference itself (its
    own error reads as 0): within the bound of a K-term sum, K * u * the
    scale of the values (the per-channel sums add their terms in another
    order than ATen's)."""
    got, ref = got.detach().cpu(), ref.detach()
    bound = (terms + 1) * torch.finfo(f64).eps * max(ref.abs().max().item(), 1.0)
    err = (got - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= bound, f"{what}: error {err:.3g} > bound {bound:.3g} ({terms} terms)"


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "channels_innermost"])
@pytest.mark.parametrize("dtype, param_dtype", [(f32, f32), (f64, f64), (bf16, bf16), (bf16, f32), (f16, f16),
                                                (f16, f32)])
@pytest.mark.parametrize("shape", _SHAPES)
def test_forward_and_gradients_on_the_plugin(shape, dtype, param_dtype, layout, training, affine):
    torch.manual_seed(0)
    c = shape[1]
    x = (torch.randn(shape) * 2 + 3).to(dtype)  # rounded to dtype once, for every run
    g = torch.randn(shape).to(dtype)
    if layout != "contiguous":
        x, g = _channels_innermost(x), _channels_innermost(g)
    w, b = (torch.linspace(0.5, 1.5, c), torch.linspace(-0.3, 0.3, c)) if affine else (None, None)
    rm, rv = torch.linspace(-1, 1, c), torch.linspace(0.5, 2, c)

    def run(device, dt, pdt):
        to = (lambda t, d: None if t is None else t.to(device=device, dtype=d))
        return _bn_train_step(to(x, dt), to(g, dt), to(w, pdt), to(b, pdt), to(rm, pdt), to(rv, pdt), training)

    npubridge.reset_stats()
    got = run("npu", dtype, param_dtype)
    assert npubridge.stats()["aten::native_batch_norm"]["native"].get("cann_like") == 1
    assert npubridge.stats()["aten::native_batch_norm_backward"]["native"].get("cann_like") == 1
    assert_no_fallbacks()
    host, wide = run("cpu", dtype, param_dtype), run("cpu", f64, f64)
    assert got[0].device.type == "npu" and got[0].dtype == dtype
    assert got[0].stride() == host[0].stride() and got[1].stride() == host[1].stride()  # channels_last stays
    names = ["output", "grad_input"] + (["grad_weight", "grad_bias"] if affine else []) + ["running_mean",
                                                                                          "running_var"]
    for name, gt, h, wd in zip(names, got, host, wide):
        assert gt.dtype == h.dtype, name
        if dtype == f64:
            _assert_within_sum_bound(gt, wd, x.numel() // c, name)
        else:
            assert_judged(gt, h, wd, name)
    if not training:
        assert torch.equal(got[-2].cpu(), rm.to(param_dtype)) and torch.equal(got[-1].cpu(), rv.to(param_dtype))


def test_a_large_mean_keeps_its_digits():
    # A channel at 1e4 with unit spread: the variance and the normalized
    # output come from differences, which a one-pass sum of squares (or
    # ATen's x * alpha + beta in float) would cancel away. Two passes in
    # double leave the final rounding: a few float32 ulp of the results.
    torch.manual_seed(0)
    x = torch.randn(64, 3, 16) + torch.tensor([1e4, -3e4, 0.5]).reshape(1, 3, 1)
    rm, rv = torch.zeros(3), torch.ones(3)
    y = F.batch_norm(x.npu(), rm.npu(), rv.npu(), training=True, momentum=1.0).cpu()
    y64 = F.batch_norm(x.double(), torch.zeros(3, dtype=f64), torch.ones(3, dtype=f64), training=True, momentum=1.0)
    eps32 = torch.finfo(f32).eps
    assert (y.double() - y64).abs().max() <= 4 * eps32 * y64.abs().max()
    rv_npu = torch.ones(3, device="npu")
    F.batch_norm(x.npu(), torch.zeros(3, device="npu"), rv_npu, training=True, momentum=1.0)
    want = x.double().var(dim=(0, 2), unbiased=True)
    assert ((rv_npu.cpu().double() - want).abs() <= 2 * eps32 * want).all(), (rv_npu.cpu(), want)
    # The backward (Note [BatchNorm backward in float32 per ISA level]) of
    # such a channel, judged against float64 by the CPU's own float32 error
    # (both read the mean as saved in float32, which bounds what either can
    # keep of x - mean).
    g = torch.randn(64, 3, 16)
    grads = []
    for device, dtype in (("npu", f32), ("cpu", f32), ("cpu", f64)):
        xd = x.to(device=device, dtype=dtype).detach().clone().requires_grad_()
        F.batch_norm(xd, None, None, training=True).backward(g.to(device=device, dtype=dtype))
        grads.append(xd.grad)
    assert_judged(*grads, "grad_input")


def test_the_legit_forms_write_the_running_stats():
    # _native_batch_norm_legit (torch.compile and export trace it), its
    # no_stats overload and _native_batch_norm_legit_no_training.
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 3, 5), torch.rand(3) + 0.5, torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    rm_n, rv_n = rm.npu(), rv.npu()
    npubridge.reset_stats()
    got = torch.ops.aten._native_batch_norm_legit(x.npu(), w.npu(), b.npu(), rm_n, rv_n, True, 0.1, 1e-5)
    want = torch.ops.aten._native_batch_norm_legit(x, w, b, rm, rv, True, 0.1, 1e-5)
    wide = torch.ops.aten._native_batch_norm_legit(x.double(), w.double(), b.double(), torch.zeros(3, dtype=f64),
                                                   torch.ones(3, dtype=f64), True, 0.1, 1e-5)
    for name, gt, h, wd in zip(["output", "save_mean", "save_invstd"], got, want, wide):
        assert_judged(gt, h, wd, name)
    assert_judged(rm_n, rm, 0.1 * x.double().mean((0, 2)), "running_mean")
    assert_judged(rv_n, rv, 0.9 + 0.1 * x.double().var((0, 2)), "running_var")
    y = torch.ops.aten._native_batch_norm_legit.no_stats(x.npu(), None, None, True, 0.1, 1e-5)[0]
    assert_judged(y, F.batch_norm(x, None, None, training=True), F.batch_norm(x.double(), None, None, training=True),
                  "no_stats output")
    y, m, s = torch.ops.aten._native_batch_norm_legit_no_training(x.npu(), w.npu(), None, rm_n, rv_n, 0.1, 1e-5)
    assert m.shape == s.shape == (0,)
    assert_judged(y, F.batch_norm(x, rm, rv, w), F.batch_norm(x.double(), rm.double(), rv.double(), w.double()),
                  "no_training output")
    for op in ("aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit.no_stats",
               "aten::_native_batch_norm_legit_no_training"):
        assert npubridge.stats()[op]["native"].get("cann_like") == 1, (op, npubridge.stats()[op])
    assert_no_fallbacks()


def test_native_batch_norm_bad_input_is_a_clear_error():
    x = torch.randn(4, 3, 5, device="npu")
    bn = torch.ops.aten.native_batch_norm
    with pytest.raises(RuntimeError, match=r"aten::native_batch_norm: weight: expected a 1-dim tensor of 3 elements "
                                           r"\(the input's channels\) but found a 1-dim tensor of shape \[2\]"):
        bn(x, torch.ones(2, device="npu"), None, None, None, True, 0.1, 1e-5)
    with pytest.raises(IndexError, match=r"input: expected an \(N, C, \*\) tensor of at least 2 dims but found a "
                                           r"1-dim tensor of shape \[5\]"):
        bn(torch.randn(5, device="npu"), None, None, None, None, True, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match=r"bias: expected scalar type float32 \(the input's\) but found float64"):
        bn(x, torch.ones(3, device="npu"), torch.ones(3, dtype=f64, device="npu"), None, None, True, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match=r"mixed dtype \(CPU\): expect parameter to have scalar type of Float"):
        bn(x.bfloat16(), torch.ones(3, device="npu"), None, torch.ones(3, dtype=bf16, device="npu"),
           torch.ones(3, dtype=bf16, device="npu"), True, 0.1, 1e-5)
    # (ATen's CPU kernel crashes on this one)
    with pytest.raises(RuntimeError, match=r"running_mean must be defined in evaluation mode"):
        bn(x, None, None, None, None, False, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match=r"grad_out: expected the input's shape \[4, 3, 5\] but found \[4, 3, 4\]"):
        torch.ops.aten.native_batch_norm_backward(torch.randn(4, 3, 4, device="npu"), x, None, None, None,
                                                  torch.zeros(3, device="npu"), torch.ones(3, device="npu"), True,
                                                  1e-5, [True, True, True])


@pytest.mark.parametrize("backend", ["aot_eager", "npu"])
def test_compiled_batch_norm_runs_on_the_plugin(backend):
    # torch.compile traces _native_batch_norm_legit (training) and
    # _native_batch_norm_legit_no_training (eval); export keeps
    # batch_norm, which runs as native_batch_norm.
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    wide = copy.deepcopy(m).double()
    npu = copy.deepcopy(m).npu()
    f = torch.compile(npu, backend=backend)
    npubridge.reset_stats()
    f(x.npu()).sum().backward()
    npu.eval()
    y = f(x.npu())
    stats = npubridge.stats()
    for op in ("aten::_native_batch_norm_legit", "aten::native_batch_norm_backward",
               "aten::_native_batch_norm_legit_no_training"):
        assert stats[op]["native"].get("cann_like", 0) >= 1, (op, stats[op])
    assert_no_fallbacks()
    m(x).sum().backward()
    wide(x.double()).sum().backward()
    m.eval(), wide.eval()
    assert_judged(npu[1].running_var, m[1].running_var, wide[1].running_var, "running_var")
    assert_judged(npu[1].weight.grad, m[1].weight.grad, wide[1].weight.grad, "weight gradient")
    assert_judged(y, m(x), wide(x.double()), "eval output")


def test_strided_running_stats_are_updated_through_the_fallback():
    # A staged (contiguous) copy of a strided statistic would take the
    # update the schema hides: such calls go to the host's fallback, which
    # writes it back (Note [BatchNorm writes the running statistics in place]).
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4)
    rm, rv = torch.zeros(3), torch.ones(3)
    F.batch_norm(x, rm, rv, training=True, momentum=0.5)
    store_m, store_v = torch.zeros(6, device="npu"), torch.ones(6, device="npu")
    npubridge.reset_stats()
    F.batch_norm(x.npu(), store_m[::2], store_v[::2], training=True, momentum=0.5)
    assert npubridge.stats()["aten::native_batch_norm"]["fallbacks"] == 1
    assert torch.equal(store_m[::2].cpu(), rm) and torch.equal(store_v[::2].cpu(), rv)
    assert torch.equal(store_m[1::2].cpu(), torch.zeros(3)) and torch.equal(store_v[1::2].cpu(), torch.ones(3))
