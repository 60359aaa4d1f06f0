"""Convolutions of every rank, regular and transposed, on npu against the
CPU: cann_like serves them natively in float32 (Note [Convolutions as three
GEMM passes] in plugins/cann_like/src/conv.cpp); forward and every gradient
are judged by npubridge's error model against float64."""
import pytest
import torch

import npubridge
from conftest import assert_matches, run_case

F = torch.nn.functional

# name: (function, input shape, weight shape, keyword arguments)
CASES = {
    "conv1d stride 2": (F.conv1d, (2, 3, 11), (4, 3, 3), dict(stride=2, padding=1)),
    "conv2d": (F.conv2d, (2, 3, 8, 8), (4, 3, 3, 3), dict(padding=1)),
    "conv3d": (F.conv3d, (2, 4, 6, 7, 5), (6, 4, 3, 2, 3), dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1))),
    "conv3d groups 2": (F.conv3d, (2, 4, 6, 7, 5), (6, 2, 3, 2, 3), dict(groups=2)),
    "conv_transpose1d": (F.conv_transpose1d, (2, 3, 7), (3, 4, 3), dict(stride=2, padding=1, output_padding=1)),
    "conv_transpose2d": (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "conv_transpose2d groups dilation": (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 2),
                                         dict(stride=(2, 1), padding=(0, 1), dilation=2, groups=2)),
    "conv_transpose3d": (F.conv_transpose3d, (1, 2, 3, 4, 3), (2, 3, 3, 3, 3),
                         dict(stride=2, padding=1, output_padding=(1, 0, 1))),
    # im2col columns of several MB per image (864 x 3040 and 3250 x 900 floats).
    "conv3d, large columns": (F.conv3d, (2, 32, 4, 40, 40), (8, 32, 3, 3, 3), dict(padding=(0, 1, 1))),
    "conv_transpose2d, large columns": (F.conv_transpose2d, (1, 16, 30, 30), (16, 130, 5, 5), dict(padding=2)),
    # Weights of 2.3 and 1.1 MB: reordered in slices of whole output-channel
    # blocks, and (250 channels, a padded last block) in one piece (Note
    # [The weights are reordered on every compute thread]).
    "conv2d, weights reordered in slices": (F.conv2d, (4, 256, 3, 3), (256, 256, 3, 3), dict(padding=1)),
    "conv2d, padded weight blocks": (F.conv2d, (3, 128, 4, 4), (250, 128, 3, 3), dict(stride=2, padding=1)),
}


def forward_and_grads(fn, kwargs, x, w, b, g):
    """y and the gradients of x, w and b for the output gradient g, flattened."""
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    y = fn(x, w, b, **kwargs)
    grads = torch.autograd.grad(y, [x, w, b], g)
    return torch.cat([t.reshape(-1) for t in (y, *grads)])


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_run_on_the_plugin_and_match_the_cpu(name):
    fn, xs, ws, kwargs = CASES[name]
    torch.manual_seed(0)
    x, w = torch.randn(xs), torch.randn(ws)
    y = fn(x, w, None, **kwargs)
    b, g = torch.randn(y.shape[1]), torch.randn(y.shape)
    npubridge.reset_stats()
    got = forward_and_grads(fn, kwargs, *(t.npu() for t in (x, w, b, g)))
    assert_matches(got, lambda *t: forward_and_grads(fn, kwargs, *t), x, w, b, g)
    stats = npubridge.stats()
    for op in ("aten::convolution_overrideable", "aten::convolution_backward_overrideable"):
        assert stats[op]["native"].get("cann_like", 0) == 1, (op, stats[op])
        assert stats[op]["fallbacks"] == 0, (op, stats[op])


def test_the_issue_reproducer_conv_transpose2d_module():
    torch.manual_seed(0)
    m = torch.nn.ConvTranspose2d(3, 4, 3)
    x = torch.randn(1, 3, 8, 8)
    params = [p.detach() for p in m.parameters()]

    def run(x, w, b):
        mm = torch.nn.ConvTranspose2d(3, 4, 3).to(x.device, x.dtype)
        with torch.no_grad():
            mm.weight.copy_(w), mm.bias.copy_(b)
        return mm(x)

    got = m.to("npu")(x.npu())
    assert got.shape == (1, 4, 10, 10)
    assert_matches(got, run, x, *params)


def test_float64_falls_back_to_the_cpu():
    x, w = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64), torch.randn(3, 2, 2, 2, 2, dtype=torch.float64)
    npubridge.reset_stats()
    got = F.conv_transpose3d(x.npu(), w.transpose(0, 1).contiguous().npu())
    torch.testing.assert_close(got.cpu(), F.conv_transpose3d(x, w.transpose(0, 1).contiguous()), rtol=0, atol=0)
    assert npubridge.stats()["aten::convolution_overrideable"]["fallbacks"] == 1


@pytest.mark.parametrize("case", [
    # output_padding must be smaller than stride or dilation.
    lambda d: F.conv_transpose2d(torch.ones(1, 2, 4, 4, device=d), torch.ones(2, 2, 3, 3, device=d),
                                 stride=2, output_padding=2),
    # the weight's first dim is the input channels of a transposed convolution.
    lambda d: F.conv_transpose2d(torch.ones(1, 3, 4, 4, device=d), torch.ones(2, 2, 3, 3, device=d)),
    # a kernel larger than the padded input.
    lambda d: F.conv3d(torch.ones(1, 1, 2, 2, 2, device=d), torch.ones(1, 1, 3, 3, 3, device=d)),
], ids=["output_padding", "channels", "kernel too large"])
def test_bad_arguments_raise_as_on_the_cpu(case):
    """The same class, and the CPU's reason (its message up to the values,
    which the kernel spells per dimension as ATen's CPU does not)."""
    cpu, npu = run_case(case, "cpu"), run_case(case, "npu")
    assert cpu[0] != "ok" and npu[0] is cpu[0], (cpu, npu)
    assert cpu[1].split(" but got")[0].split(", but")[0] in npu[1], (cpu, npu)
