"""torch.npu.amp: GradScaler on npu tensors scales, unscales, skips steps
with inf/NaN gradients and updates its scale exactly as torch.amp's
GradScaler does on the CPU; autocast is torch.autocast("npu")."""
import warnings

import pytest
import torch

import npubridge  # noqa: F401


def _train(device, scaler, grads_to_poison=(), steps=6):
    """A few SGD steps of a linear layer under a GradScaler; the gradient of
    the steps in grads_to_poison made inf. Returns (weights, scales)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.125)
    x = torch.arange(8.0).reshape(2, 4).to(device) / 8
    scales = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(x).square().sum()
        scaler.scale(loss).backward()
        if step in grads_to_poison:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


@pytest.mark.parametrize("poison", [(), (1,), (0, 2, 3)])
def test_grad_scaler_matches_the_cpus(poison):
    kw = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    npu_w, npu_scales = _train("npu", torch.npu.amp.GradScaler(**kw), poison)
    cpu_w, cpu_scales = _train("cpu", torch.amp.GradScaler("cpu", **kw), poison)
    assert npu_scales == cpu_scales
    # Scales are powers of two: scaling and unscaling are exact, so the
    # weights are the CPU's up to the order of the matmul's sums (4 terms).
    for a, b in zip(npu_w, cpu_w):
        torch.testing.assert_close(a, b, rtol=4 * 2**-24, atol=4 * 2**-24)
    if poison:
        assert min(npu_scales) < kw["init_scale"]  # backed off


def test_skipped_step_leaves_weights_unchanged():
    scaler = torch.npu.amp.GradScaler(init_scale=4.0)
    p = torch.nn.Parameter(torch.ones(3, device="npu"))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler.scale((p * 2).sum()).backward()
    assert torch.equal(p.grad.cpu(), torch.full((3,), 8.0))  # scaled by 4
    p.grad[1] = float("nan")
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach().cpu(), torch.ones(3))
    assert scaler.get_scale() == 2.0


def test_unscale_gives_the_true_gradient():
    scaler = torch.npu.amp.GradScaler(init_scale=2.0**8)
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], device="npu"))
    opt = torch.optim.SGD([p], lr=0.5)
    scaler.scale((p * p).sum()).backward()
    scaler.unscale_(opt)
    assert torch.equal(p.grad.cpu(), torch.tensor([2.0, -4.0, 6.0]))
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach().cpu(), torch.tensor([0.0, 0.0, 0.0]))


def test_static_scale_with_dynamic_false():
    scaler = torch.npu.amp.GradScaler(init_scale=16.0, dynamic=False, growth_interval=1)
    _, scales = _train("npu", scaler, grads_to_poison=(1,), steps=4)
    assert scales == [16.0] * 4
    assert scaler.state_dict()["dynamic"] is False
    other = torch.npu.amp.GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other._dynamic is False and other.get_scale() == 16.0
    with pytest.raises(TypeError, match="dynamic to be a bool"):
        torch.npu.amp.GradScaler(dynamic="no")


def test_no_deprecation_warning_as_torch_npu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.npu.amp.GradScaler()
        with torch.npu.amp.autocast():
            pass


def test_autocast_is_npu_autocast():
    from torch.npu.amp import autocast

    a = torch.randn(4, 4, device="npu")
    with autocast():
        assert torch.is_autocast_enabled("npu")
        assert torch.get_autocast_dtype("npu") == torch.float16
        assert (a @ a).dtype == torch.float16
    with autocast(dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(enabled=False):
        assert (a @ a).dtype == torch.float32
    assert not torch.is_autocast_enabled("npu")


def test_custom_fwd_casts_inputs():
    class Square(torch.autograd.Function):
        @staticmethod
        @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.npu.amp.custom_bwd
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.ones(3, device="npu", dtype=torch.float16, requires_grad=True)
    with torch.npu.amp.autocast():
        y = Square.apply(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0, dtype=torch.float16))
