"""torch.optim.Adam(fused=True) / AdamW(fused=True) on npu (aten::_fused_adam_,
aten::_fused_adamw_: plugins/mindspeed_like/src/fused_adam.cpp) and the
gradient scaler's ops (aten::_amp_foreach_non_finite_check_and_unscale_,
aten::_amp_update_scale_: plugins/cann_like/src/amp.cpp), served natively.

Results are judged by the error model against float64 (conftest.assert_judged:
the same steps on the CPU in the parameter's dtype calibrate the bound),
never against the CPU's float32 output at a fixed tolerance."""
import itertools
import re

import pytest
import torch

import npubridge
from conftest import assert_judged

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SHAPES = ((7, 5), (37, ), (3, 4, 2), (1, ), (64, 17))
OPS = ("aten::_fused_adamw_", "aten::_fused_adam_")
AMP_OPS = ("aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_")


def _initial(seed=0):
    """One parameter per (dtype, shape) pair, values drawn in float64 and
    rounded to the dtype: a param group of mixed dtypes."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dt)
            for dt, s in zip(itertools.cycle(DTYPES), SHAPES + SHAPES[:3])]


def _grads(params, step):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) for p in params]


def _train(device, opt_cls, initial, steps, wide=False, **kwargs):
    """`steps` optimizer steps of `opt_cls(fused=True)` on copies of `initial`
    on `device` (in float64 when `wide`), the gradients of each step rounded
    to the parameters' dtypes first. Returns the parameters and the state."""
    params = [p.detach().to(device, torch.float64 if wide else p.dtype, copy=True).requires_grad_() for p in initial]
    opt = opt_cls(params, fused=True, **kwargs)
    for step in range(steps):
        for p, g in zip(params, _grads(initial, step)):
            p.grad = g.to(device, p.dtype)
        opt.step()
    state = [opt.state[p] for p in params]
    return params, state


def _assert_judged_run(opt_cls, steps=5, **kwargs):
    initial = _initial()
    npubridge.reset_stats()
    got, got_state = _train("npu", opt_cls, initial, steps, **kwargs)
    host, host_state = _train("cpu", opt_cls, initial, steps, **kwargs)
    wide, wide_state = _train("cpu", opt_cls, initial, steps, wide=True, **kwargs)
    names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if kwargs.get("amsgrad") else [])
    for i, (g, h, w) in enumerate(zip(got, host, wide)):
        assert g.dtype == h.dtype
        assert_judged(g, h, w, f"param {i} ({g.dtype})")
        for n in names:
            assert_judged(got_state[i][n], host_state[i][n], wide_state[i][n], f"{n} {i} ({g.dtype})")
        assert got_state[i]["step"].item() == steps
    return npubridge.stats()


def _assert_native(stats, op):
    """Every call of `op` (any overload) served by a plugin's kernel."""
    calls = [s for name, s in stats.items() if name == op or name.startswith(op + ".")]
    assert calls, f"{op} was not called"
    for s in calls:
        _assert_native_overload(s, op)


def _assert_native_overload(s, op):
    assert s["fallbacks"] == 0, f"{op} fell back to the CPU {s['fallbacks']} times"
    assert sum(s["native"].values()) == s["calls"], s


FLAGS = [dict(amsgrad=a, maximize=m, weight_decay=wd)
         for a, m, wd in itertools.product((False, True), (False, True), (0.0, 0.1))]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.Adam], ids=["AdamW", "Adam"])
def test_fused_optimizer_matches_float64(opt_cls, flags):
    stats = _assert_judged_run(opt_cls, lr=1e-2, **flags)
    _assert_native(stats, "aten::_fused_adamw_" if opt_cls is torch.optim.AdamW else "aten::_fused_adam_")


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.Adam], ids=["AdamW", "Adam"])
def test_tensor_lr_and_large_lerp_weight(opt_cls):
    # lr as a tensor takes the .tensor_lr overload; beta1 = 0.2 the lerp's
    # other branch (|1 - beta1| >= 0.5).
    stats = _assert_judged_run(opt_cls, lr=torch.tensor(5e-3), betas=(0.2, 0.99), weight_decay=0.05)
    _assert_native(stats, "aten::_fused_adamw_" if opt_cls is torch.optim.AdamW else "aten::_fused_adam_")


def _op_args(device, dtype=torch.float32, n=3, amsgrad=False, step=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda scale=1.0: [(scale * torch.randn(5, 7, generator=g)).to(device, dtype) for _ in range(n)]  # noqa: E731
    params, grads, m = mk(), mk(), mk(0.1)
    v = [(0.01 * torch.rand(5, 7, generator=g)).to(device, dtype) for _ in range(n)]
    mx = [x + 0.001 for x in v] if amsgrad else []
    steps = [torch.tensor(step, device=device) for _ in range(n)]
    return params, grads, m, v, mx, steps


HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, maximize=False)


@pytest.mark.parametrize("op", OPS)
def test_found_inf_skips_the_whole_update(op):
    fn = getattr(torch, op.split("::")[1])
    args = _op_args("npu", amsgrad=True)
    before = [[t.cpu() for t in lst] for lst in args]
    fn(*args, amsgrad=True, grad_scale=torch.tensor(8.0, device="npu"), found_inf=torch.tensor(1.0, device="npu"),
       **HYPER)
    for lst, was in zip(args, before):
        for t, w in zip(lst, was):
            assert torch.equal(t.cpu(), w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_grad_scale_unscales_and_writes_the_grads_back(op, dtype):
    # As ATen's CPU kernel: the grads are divided by grad_scale, the step
    # uses them, and they stay unscaled in `grads` afterwards.
    fn = getattr(torch, op.split("::")[1])
    scale, found = 64.0, 0.0
    npu_args, cpu_args, wide_args = _op_args("npu", dtype), _op_args("cpu", dtype), _op_args("cpu", torch.float64)
    wide_args = [[t.to(dtype).double() for t in lst] for lst in wide_args[:5]] + [wide_args[5]]
    for args in (npu_args, cpu_args, wide_args):
        dev = args[0][0].device
        fn(*args, amsgrad=False, grad_scale=torch.tensor(scale, device=dev), found_inf=torch.tensor(found, device=dev),
           **HYPER)
    for k, name in enumerate(("params", "grads", "exp_avgs", "exp_avg_sqs")):
        for i, (g, h, w) in enumerate(zip(npu_args[k], cpu_args[k], wide_args[k])):
            assert_judged(g, h, w, f"{name}[{i}]")
    unscaled = [t.cpu() for t in _op_args("cpu", dtype)[1]]
    for g, u in zip(npu_args[1], unscaled):
        assert torch.equal(g.cpu(), (u.float() / scale).to(dtype))  # a power of two: exact


# ---------------------------------------------------------------------------
# The gradient scaler
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inv_scale", [0.25, 1.0 / 3.0, 1.0])
def test_unscale_matches_float64(dtype, inv_scale):
    g = torch.Generator().manual_seed(3)
    host = [torch.randn(s, generator=g, dtype=torch.float64).mul(1000).to(dtype) for s in SHAPES]
    wide = [t.to(torch.float64, copy=True) for t in host]
    got = [t.to("npu") for t in host]
    found = {d: torch.zeros(1, device=d) for d in ("cpu", "npu")}
    torch._amp_foreach_non_finite_check_and_unscale_(got, found["npu"], torch.tensor([inv_scale], device="npu"))
    torch._amp_foreach_non_finite_check_and_unscale_(host, found["cpu"], torch.tensor([inv_scale]))
    torch._amp_foreach_non_finite_check_and_unscale_(wide, torch.zeros(1), torch.tensor([inv_scale]))
    for i, (a, b, w) in enumerate(zip(got, host, wide)):
        assert_judged(a, b, w, f"grad {i}")
    assert found["npu"].item() == 0.0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unscale_finds_non_finite_and_never_clears(dtype, bad):
    grads = [torch.ones(40, dtype=dtype, device="npu") for _ in range(3)]
    grads[1][33] = bad
    found = torch.zeros(1, device="npu")
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor([0.5], device="npu"))
    assert found.item() == 1.0
    assert torch.equal(grads[0].cpu(), torch.full((40, ), 0.5, dtype=dtype))  # all unscaled, as ATen
    clean = [torch.ones(4, dtype=dtype, device="npu")]
    torch._amp_foreach_non_finite_check_and_unscale_(clean, found, torch.tensor([1.0], device="npu"))
    assert found.item() == 1.0  # zeroing is the caller's job


@pytest.mark.parametrize("found_inf, tracker, interval, scale", [
    (1.0, 3, 5, 1024.0),  # backoff, tracker reset
    (0.0, 3, 5, 1024.0),  # counted
    (0.0, 4, 5, 1024.0),  # grows at the interval
    (0.0, 0, 1, 3e38),  # would overflow to inf: kept
    (2.0, 0, 1, 1.0 / 3.0),  # any non-zero found_inf backs off; rounded once from double
])
def test_update_scale_as_aten(found_inf, tracker, interval, scale):
    out = {}
    for dev in ("cpu", "npu"):
        s = torch.tensor([scale], device=dev)
        t = torch.tensor([tracker], dtype=torch.int32, device=dev)
        r = torch._amp_update_scale_(s, t, torch.tensor([found_inf], device=dev), 2.0, 0.3, interval)
        assert r is s
        out[dev] = (s.cpu(), t.cpu())
    assert torch.equal(out["npu"][0], out["cpu"][0]) and torch.equal(out["npu"][1], out["cpu"][1])


def test_grad_scaler_loop_skips_the_overflowing_step_and_halves_the_scale():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("npu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("npu", init_scale=2.0**10, growth_interval=2)
    npubridge.reset_stats()
    scales = []
    for step in range(5):
        x = torch.randn(32, 8, device="npu")
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        if step == 2:
            model[0].weight.grad[1, 2] = float("inf")
        before = [p.detach().cpu() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        after = [p.detach().cpu() for p in model.parameters()]
        changed = any(not torch.equal(a, b) for a, b in zip(before, after))
        assert changed == (step != 2), f"step {step}"
        scales.append(scaler.get_scale())
    # grows after 2 good steps, halves on the overflow, grows after 2 more
    assert scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11]
    assert opt.state[model[0].weight]["step"].item() == 4  # the skipped step is not counted
    stats = npubridge.stats()
    for op in AMP_OPS + ("aten::_fused_adamw_", ):
        _assert_native(stats, op)


# ---------------------------------------------------------------------------
# Bad input: a clear error naming the op and the argument
# ---------------------------------------------------------------------------


def _fused(**over):
    args = dict(zip(("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps"),
                    _op_args("npu", n=2)))
    args.update(over)
    kw = dict(HYPER, amsgrad=False)
    kw.update({k: v for k, v in over.items() if k in ("amsgrad", "lr", "grad_scale", "found_inf")})
    return lambda: torch._fused_adamw_(args["self"], args["grads"], args["exp_avgs"], args["exp_avg_sqs"],
                                       args["max_exp_avg_sqs"], args["state_steps"], **kw)


def _npu(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device="npu")


BAD = [
    ("grads too short", lambda: _fused(grads=[_npu(5, 7)])(),
     r"aten::_fused_adamw_.*grads: expected as many tensors as self \(2\) but found 1"),
    ("exp_avgs of another dtype", lambda: _fused(exp_avgs=[_npu(5, 7, dtype=torch.float64), _npu(5, 7, dtype=torch.float64)])(),
     r"aten::_fused_adamw_.*exp_avgs\[0\]: expected the dtype of self\[0\] \(float32\) but found float64"),
    ("exp_avg_sqs of another shape", lambda: _fused(exp_avg_sqs=[_npu(5, 7), _npu(7, 5)])(),
     r"aten::_fused_adamw_.*exp_avg_sqs\[1\]: expected the shape of self\[1\] \[5, 7\] but found \[7, 5\]"),
    ("amsgrad without max_exp_avg_sqs", lambda: _fused(amsgrad=True)(),
     r"aten::_fused_adamw_.*max_exp_avg_sqs: expected as many tensors as self \(2\) since amsgrad is set but found 0"),
    ("state_steps too short", lambda: _fused(state_steps=[torch.tensor(1.0, device="npu")])(),
     r"aten::_fused_adamw_.*state_steps: expected as many tensors as self \(2\) but found 1"),
    ("a step of two elements", lambda: _fused(state_steps=[_npu(2), _npu(2)])(),
     r"aten::_fused_adamw_.*state_steps\[0\]: expected a one-element tensor but found one of shape \[2\]"),
    ("a step of dtype bool", lambda: _fused(state_steps=[_npu(1, dtype=torch.bool), _npu(1, dtype=torch.bool)])(),
     r"aten::_fused_adamw_.*state_steps\[0\]: expected a floating or integer dtype but found bool"),
    ("grad_scale float64", lambda: _fused(grad_scale=torch.tensor(2.0, dtype=torch.float64, device="npu"))(),
     r"aten::_fused_adamw_.*grad_scale: expected dtype float32 but found float64"),
    ("a CPU gradient", lambda: _fused(grads=[torch.ones(5, 7), torch.ones(5, 7)])(),
     r"Expected all tensors to be on the same device.*aten::_fused_adamw_.*grads"),
    ("unscale: an int gradient",
     lambda: torch._amp_foreach_non_finite_check_and_unscale_([_npu(3, dtype=torch.int32)], _npu(1), _npu(1)),
     r"_amp_foreach_non_finite_check_and_unscale_.* not implemented for 'Int'"),  # ATen's, from its CPU kernel
    ("unscale: inv_scale float64",
     lambda: torch._amp_foreach_non_finite_check_and_unscale_([_npu(3)], _npu(1), _npu(1, dtype=torch.float64)),
     r"aten::_amp_foreach_non_finite_check_and_unscale_.*inv_scale: expected dtype float32 but found float64"),
    ("unscale: found_inf of two elements",
     lambda: torch._amp_foreach_non_finite_check_and_unscale_([_npu(3)], _npu(2), _npu(1)),
     r"aten::_amp_foreach_non_finite_check_and_unscale_.*found_inf: expected a one-element tensor"),
    ("unscale: found_inf on the CPU",
     lambda: torch._amp_foreach_non_finite_check_and_unscale_([_npu(3)], torch.zeros(1), _npu(1)),
     r"Expected all tensors to be on the same device.*found_inf"),
    ("update: a float32 growth_tracker",
     lambda: torch._amp_update_scale_(_npu(1), _npu(1), _npu(1), 2.0, 0.5, 10),
     r"aten::_amp_update_scale_.*growth_tracker: expected dtype int32 but found float32"),
    ("update: a scale of two elements",
     lambda: torch._amp_update_scale_(_npu(2), _npu(1, dtype=torch.int32), _npu(1), 2.0, 0.5, 10),
     r"aten::_amp_update_scale_.*self: expected a one-element tensor but found one of shape \[2\]"),
]


@pytest.mark.parametrize("case, call, message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_op_and_argument(case, call, message):
    with pytest.raises(RuntimeError) as e:
        call()
    assert re.search(message, str(e.value), re.S), str(e.value)
