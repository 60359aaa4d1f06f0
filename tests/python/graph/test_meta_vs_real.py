"""Compiled graphs whose ops really return something other than their meta
values say (Note [The real result against the meta value], program.cpp;
Note [Returns the graph never reads], lowering.py): BatchNorm in eval mode
(ATen's CPU kernel returns empty save_mean/save_invstd, the meta [C]),
BatchNorm and LayerNorm in bfloat16 (save_mean / mean and rstd in
bfloat16, the meta float32).

Compiled vs eager npu runs the same kernels in the same order: asserted
bit-exact. Against PyTorch CPU in float64 the bound is derived per test.
"""
import copy

import pytest
import torch

import npubridge  # noqa: F401 - registers the npu device and backend

DTYPES = [torch.float32, torch.bfloat16]


def _eps(dtype):
    return torch.finfo(dtype).eps


def _conv_bn(dtype, train):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    with torch.no_grad():  # running stats and affine params away from their identity defaults
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].running_var.uniform_(0.5, 2.0)
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.5, 0.5)
    return m.to(dtype).train(train)


def _eval_bound(m, x):
    """|compiled - float64| for conv (K = 27 products summed), the eval
    BatchNorm (an affine map per channel) and relu: each of the ~K + 3
    roundings is at most eps/2 of a partial sum bounded by the sum of
    |terms|, scaled by |gamma / sqrt(var + eps)| through the norm."""
    conv, bn = m[0], m[1]
    absconv = torch.nn.functional.conv2d(x.double().abs(), conv.weight.double().abs(),
                                         conv.bias.double().abs(), padding=1)
    scale = (bn.weight.double() / (bn.running_var.double() + bn.eps).sqrt()).abs()
    shift = (bn.running_mean.double().abs() * scale + bn.bias.double().abs()).view(1, -1, 1, 1)
    scale = scale.view(1, -1, 1, 1)
    k = 27 + 3
    return k * _eps(x.dtype) * (absconv * scale + shift) + 1e-30


@pytest.mark.parametrize("dtype", DTYPES)
def test_batchnorm_eval_inference(dtype):
    m = _conv_bn(dtype, train=False)
    cpu = copy.deepcopy(m).double()
    dev = m.npu()
    compiled = torch.compile(copy.deepcopy(dev), backend="npu", dynamic=False)
    for bs in (2, 3):
        x = torch.randn(bs, 3, 6, 6).to(dtype)
        with torch.no_grad():
            got = compiled(x.npu())
            want = dev(x.npu())
            ref = cpu(x.double())
        assert got.dtype == dtype and torch.equal(got.cpu(), want.cpu())
        assert ((got.cpu().double() - ref).abs() <= _eval_bound(cpu, x)).all()
    report = npubridge.compile_report(compiled)
    parts = [p for g in report["graphs"] for p in g["parts"].values()]
    assert parts and all(p["lowered"] for p in parts)


@pytest.mark.parametrize("dtype", [torch.float32])
def test_batchnorm_train(dtype):
    """Training mode: save_mean/save_invstd are read by the backward, and
    the running statistics are updated as eager does. (bfloat16 training
    is not served: the forward's bf16 save_mean is widened to the meta's
    float32, which ATen's CPU batch_norm_backward then refuses beside bf16
    weights: an error, not served yet.)"""
    m = _conv_bn(dtype, train=True).npu()
    eager = copy.deepcopy(m)
    compiled_model = copy.deepcopy(m)
    compiled = torch.compile(compiled_model, backend="npu", dynamic=False)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6).to(dtype).npu()
        got = compiled(x)
        got.float().square().sum().backward()
        want = eager(x)
        want.float().square().sum().backward()
        assert torch.equal(got.cpu(), want.cpu())
    for (n, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad.cpu()), n
    for a, b in zip(compiled_model[1].buffers(), eager[1].buffers()):
        assert torch.equal(a.cpu(), b.cpu())


def _ln(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32))
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.5, 0.5)
    return m.to(dtype)


def test_layernorm_bf16_inference_and_train():
    dtype = torch.bfloat16
    m = _ln(dtype).npu()
    eager = copy.deepcopy(m)
    # Dynamo caches compiled code per code object: a Sequential compiled by an
    # earlier test with the same guards would be reused without calling the
    # backend, and this model's report (asserted below) would be empty.
    torch._dynamo.reset()
    compiled_model = copy.deepcopy(m)
    compiled = torch.compile(compiled_model, backend="npu", dynamic=False)
    cpu = copy.deepcopy(m).cpu().double()
    x = torch.randn(4, 16).to(dtype)
    with torch.no_grad():
        got = compiled(x.npu())
        want = eager(x.npu())
        ref = cpu(x.double())
    assert got.dtype == dtype and torch.equal(got.cpu(), want.cpu())
    # The normalized rows have |y| <= sqrt(32) * |gamma| + |beta|; the bf16
    # input of the norm (the linear's output, rounded once: eps/2 relative)
    # moves y by up to ~sqrt(32) * eps of that scale, and y is rounded
    # once more: 8 eps of (sqrt(32) * 1.5 + 0.5) covers both.
    assert (got.cpu().double() - ref).abs().max().item() <= 8 * _eps(dtype) * (32 ** 0.5 * 1.5 + 0.5)
    # Training: mean/rstd are saved for the backward (bfloat16 from the
    # kernel, float32 in the graph: widened exactly, so the backward
    # kernel reads the same values as in eager).
    xg = torch.randn(4, 16).to(dtype).npu()
    got = compiled(xg)
    got.float().square().sum().backward()
    want = eager(xg)
    want.float().square().sum().backward()
    assert torch.equal(got.cpu(), want.cpu())
    for (n, p), q in zip(compiled_model.named_parameters(), eager.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad.cpu()), n
    report = npubridge.compile_report(compiled)
    kinds = {}
    for g in report["graphs"]:
        for p in g["parts"].values():
            assert p["lowered"], p["not_lowered_reason"]
            for n in p["summary"]["nodes"]:
                kinds.setdefault(n["target"], set()).add(n["kind"])
    assert kinds.get("aten.native_layer_norm.default") == {"kernel"}, kinds
