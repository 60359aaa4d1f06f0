"""npubridge.mindspeed.FusedAdamW against torch.optim.AdamW(foreach=False)
on CPU copies of the same parameters and gradients."""
import copy

import pytest
import torch

import npubridge
from npubridge.mindspeed import FusedAdamW, functional


# mindspeed_like is built with the extension: its op missing is a failure,
# never a skip (a broken build must not shrink the suite).
@pytest.fixture(autouse=True)
def _the_op_can_run():
    reason = functional.missing_reason("npu_apply_adam_w")
    assert reason is None, reason

SHAPES = [(7, 5), (13, ), (3, 4, 2), (1, )]


def _params(seed, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def _pair(groups_kwargs, seed=0):
    """CPU params for torch.optim.AdamW, npu copies for FusedAdamW, as param groups."""
    cpu_groups, npu_groups = [], []
    for i, kw in enumerate(groups_kwargs):
        cpu = [p.requires_grad_() for p in _params(seed + i)]
        npu = [p.detach().to("npu").requires_grad_() for p in cpu]
        cpu_groups.append(dict(params=cpu, **kw))
        npu_groups.append(dict(params=npu, **kw))
    return cpu_groups, npu_groups


def _set_grads(cpu_groups, npu_groups, step, skip=()):
    g = torch.Generator().manual_seed(1000 + step)
    for gi, (cg, ng) in enumerate(zip(cpu_groups, npu_groups)):
        for pi, (pc, pn) in enumerate(zip(cg["params"], ng["params"])):
            if (gi, pi) in skip:
                pc.grad = pn.grad = None
                continue
            grad = torch.randn(pc.shape, generator=g)
            pc.grad, pn.grad = grad.clone(), grad.to("npu")


def _assert_close(cpu_groups, npu_groups, what):
    for cg, ng in zip(cpu_groups, npu_groups):
        for pc, pn in zip(cg["params"], ng["params"]):
            got, want = pn.detach().cpu(), pc.detach()
            rel = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            assert rel <= 1e-6, f"{what}: relative error {rel:.3g}"


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(weight_decay=0.1),
    dict(weight_decay=0.0),
    dict(amsgrad=True, weight_decay=0.05),
    dict(maximize=True),
    dict(amsgrad=True, maximize=True, betas=(0.8, 0.99), eps=1e-6, lr=3e-3),
],
                         ids=["default", "wd", "no_wd", "amsgrad", "maximize", "all"])
def test_100_steps_match_torch_adamw(kwargs):
    lr = kwargs.pop("lr", 1e-3)
    cpu_groups, npu_groups = _pair([{}])
    ref = torch.optim.AdamW(cpu_groups, lr=lr, foreach=False, **kwargs)
    opt = FusedAdamW(npu_groups, lr=lr, **kwargs)
    for step in range(100):
        _set_grads(cpu_groups, npu_groups, step)
        ref.step()
        opt.step()
    _assert_close(cpu_groups, npu_groups, str(kwargs))


def test_two_groups_a_scheduler_and_skipped_grads():
    cpu_groups, npu_groups = _pair([dict(lr=2e-3, weight_decay=0.0), dict(amsgrad=True, betas=(0.85, 0.995))])
    ref = torch.optim.AdamW(cpu_groups, lr=1e-3, foreach=False)
    opt = FusedAdamW(npu_groups, lr=1e-3)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=10, gamma=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    npubridge.reset_stats()
    for step in range(100):
        # A param without a gradient is skipped: its step count falls behind.
        skip = {(0, 1)} if step % 3 == 0 else set()
        _set_grads(cpu_groups, npu_groups, step, skip)
        ref.step()
        opt.step()
        ref_sched.step()
        sched.step()
    _assert_close(cpu_groups, npu_groups, "two groups")
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"] == 2e-3 * 0.5**10
    assert opt.state[npu_groups[0]["params"][1]]["step"].item() == 66
    # One call per (group, dtype, step value): 2 groups, plus the split of
    # group 0 in the steps after a skip.
    calls = npubridge.stats()["mindspeed_like::npu_apply_adam_w"]["native"]["mindspeed_like"]
    assert calls == 200 + sum(1 for s in range(100) if s % 3 != 0 and s >= 1)


def test_state_matches_torch_and_state_dicts_load_both_ways():
    cpu_groups, npu_groups = _pair([dict(amsgrad=True)])
    ref = torch.optim.AdamW(cpu_groups, lr=1e-3, foreach=False, amsgrad=True)
    opt = FusedAdamW(npu_groups, lr=1e-3, amsgrad=True)
    for step in range(5):
        _set_grads(cpu_groups, npu_groups, step)
        ref.step()
        opt.step()
    ours, theirs = opt.state_dict(), ref.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for i, s in theirs["state"].items():
        assert ours["state"][i].keys() == s.keys() == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
        for k, v in s.items():
            assert ours["state"][i][k].dtype == v.dtype and ours["state"][i][k].shape == v.shape, k
        assert ours["state"][i]["step"].device.type == "cpu" and ours["state"][i]["step"].item() == 5.0

    # torch.optim.AdamW's state into FusedAdamW (npu params), then 5 more steps each.
    cpu2, npu2 = _pair([dict(amsgrad=True)])
    for pc, pn, pr in zip(cpu2[0]["params"], npu2[0]["params"], cpu_groups[0]["params"]):
        with torch.no_grad():
            pc.copy_(pr)
            pn.copy_(pr)
    ref2 = torch.optim.AdamW(cpu2, lr=1e-3, foreach=False, amsgrad=True)
    # Copies: load_state_dict keeps a CPU 'step' tensor as it is, shared with the source.
    ref2.load_state_dict(copy.deepcopy(ref.state_dict()))
    fused2 = FusedAdamW(npu2, lr=1e-3, amsgrad=True)
    fused2.load_state_dict(copy.deepcopy(ref.state_dict()))
    assert fused2.state[npu2[0]["params"][0]]["exp_avg"].device.type == "npu"
    for step in range(5, 10):
        _set_grads(cpu2, npu2, step)
        ref2.step()
        fused2.step()
    _assert_close(cpu2, npu2, "torch state into FusedAdamW")

    # And FusedAdamW's state back into torch.optim.AdamW, on the CPU.
    cpu3, _ = _pair([dict(amsgrad=True)])
    for pc, pn in zip(cpu3[0]["params"], npu2[0]["params"]):
        with torch.no_grad():
            pc.copy_(pn.cpu())
    ref3 = torch.optim.AdamW(cpu3, lr=1e-3, foreach=False, amsgrad=True)
    ref3.load_state_dict(copy.deepcopy(fused2.state_dict()))
    for step in range(10, 15):
        _set_grads(cpu2, npu2, step)
        for pc, pn in zip(cpu3[0]["params"], npu2[0]["params"]):
            pc.grad = pn.grad.cpu()
        ref2.step()
        fused2.step()
        ref3.step()
    _assert_close(cpu3, npu2, "FusedAdamW state into torch")
    _assert_close(cpu2, npu2, "both")


def test_closure_and_no_grad_params():
    p = torch.randn(4, device="npu", requires_grad=True)
    idle = torch.randn(3, device="npu", requires_grad=True)
    opt = FusedAdamW([p, idle])

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    before = idle.detach().clone()
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    assert torch.equal(idle.detach().cpu(), before.cpu()) and idle not in opt.state
    assert opt.state[p]["step"].item() == 1.0


def test_half_precision_params():
    for dtype in (torch.float16, torch.bfloat16):
        p = torch.randn(16, dtype=dtype, device="npu", requires_grad=True)
        p.grad = torch.randn(16, dtype=dtype, device="npu")
        opt = FusedAdamW([p], lr=1e-2)
        opt.step()
        assert opt.state[p]["exp_avg"].dtype == dtype


def test_errors():
    with pytest.raises(ValueError, match=r"FusedAdamW: expected lr >= 0 but found -1"):
        FusedAdamW([torch.zeros(1, device="npu")], lr=-1)
    with pytest.raises(ValueError, match=r"FusedAdamW: expected betas\[1\] in \[0, 1\) but found 1.0"):
        FusedAdamW([torch.zeros(1, device="npu")], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="expected weight_decay >= 0"):
        FusedAdamW([torch.zeros(1, device="npu")], weight_decay=-0.1)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match=r"FusedAdamW does not support sparse gradients \(param group 0, param 0\)"):
        FusedAdamW(emb.parameters()).step()
    cpu = torch.zeros(2, requires_grad=True)
    cpu.grad = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"FusedAdamW: expected npu parameters but found a cpu parameter \(param "
                       r"group 0, param 0\); move the model with .to\('npu'\) first"):
        FusedAdamW([cpu]).step()


def test_torch_adamw_keywords():
    p = torch.nn.Parameter(torch.ones(3, device="npu"))
    FusedAdamW([p], foreach=True, fused=None)  # accepted: the update is always fused
    for name in ("capturable", "differentiable"):
        with pytest.raises(ValueError, match=f"FusedAdamW: {name}=True is not supported \\(expected False\\); use "
                                             "torch.optim.AdamW for it"):
            FusedAdamW([p], **{name: True})


def test_float64_params_match_torch_adamw():
    cpu = [torch.randn(5, 3, dtype=torch.float64, requires_grad=True)]
    npu = [cpu[0].detach().to("npu").requires_grad_()]
    ref, opt = torch.optim.AdamW(cpu, lr=1e-2, foreach=False), FusedAdamW(npu, lr=1e-2)
    for step in range(10):
        g = torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
        cpu[0].grad, npu[0].grad = g, g.to("npu")
        ref.step()
        opt.step()
    torch.testing.assert_close(npu[0].detach().cpu(), cpu[0].detach(), rtol=1e-12, atol=0)


def test_a_refused_step_changes_nothing():
    a = torch.nn.Parameter(torch.ones(3, device="npu"))
    b = torch.nn.Parameter(torch.ones(3))  # a CPU parameter, refused after a was accepted
    opt = FusedAdamW([a, b])
    a.grad, b.grad = torch.ones(3, device="npu"), torch.ones(3)
    with pytest.raises(RuntimeError, match=r"FusedAdamW: expected npu parameters but found a cpu parameter "
                                           r"\(param group 0, param 1\)"):
        opt.step()
    assert len(opt.state) == 0 and torch.equal(a.detach().cpu(), torch.ones(3))
