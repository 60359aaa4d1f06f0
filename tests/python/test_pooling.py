"""2-d max pooling on npu against the CPU: cann_like's float32 kernel builds
a row of windows tap by tap (Note [float32 max pooling a row of windows at
a time], plugins/cann_like/src/pooling.cpp). A max is exact, so values and
indices must equal ATen's, ties (the first maximum in window order), NaNs
(the window's last NaN) and infinities included."""
import math

import pytest
import torch

import npubridge
from conftest import assert_matches, assert_no_fallbacks

F = torch.nn.functional


def _data(kind, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    if kind == "ties":  # few distinct values: many windows hold their maximum twice
        return torch.randint(0, 3, shape, generator=g).float()
    if kind == "nan and inf":
        r = torch.rand(shape, generator=g)
        x[r < 0.05] = math.nan
        x[(r >= 0.05) & (r < 0.1)] = -math.inf
        x[(r >= 0.1) & (r < 0.12)] = math.inf
        return x
    if kind == "all -inf":
        return torch.full(shape, -math.inf)
    return x


# name: (input shape, kernel_size, stride, padding, dilation, ceil_mode)
GEOMETRIES = {
    "ResNet stem 3x3 stride 2 pad 1": ((2, 3, 32, 32), 3, 2, 1, 1, False),
    "2x2 stride 2": ((2, 4, 17, 30), 2, 2, 0, 1, False),
    "3x2 kernel, stride (1, 3), ceil_mode": ((1, 3, 11, 40), (3, 2), (1, 3), (1, 1), 1, True),
    "dilation 2, ceil_mode": ((2, 2, 19, 27), 3, 2, 1, 2, True),
    "stride 1 (one phase)": ((1, 2, 9, 24), (2, 3), 1, (1, 1), 1, False),
    "3-d input, rows of fewer than 8 windows": ((5, 9, 9), 3, 2, 1, 1, True),
    # over 1 MiB a plane: its rows are split as they are read, not once per plane
    "a large plane, 3x3 stride 2": ((2, 1, 520, 530), 3, 2, 1, 1, False),
}


@pytest.mark.parametrize("kind", ["random", "ties", "nan and inf", "all -inf"])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_values_and_indices_equal_atens(name, kind):
    shape, k, s, p, d, ceil = GEOMETRIES[name]
    x = _data(kind, shape)
    want, want_i = F.max_pool2d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)
    npubridge.reset_stats()
    got, got_i = F.max_pool2d(x.npu(), k, s, p, d, ceil_mode=ceil, return_indices=True)
    assert_no_fallbacks(name)
    assert torch.equal(got_i.cpu(), want_i), (got_i.cpu() != want_i).nonzero()[:5]
    assert torch.allclose(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def test_the_backward_routes_the_gradient_to_the_recorded_maximum():
    # Overlapping windows share inputs: their gradients are summed, in an
    # order of the kernel's, so the result is judged against float64.
    x = _data("ties", (2, 3, 16, 20))
    g = torch.randn(2, 3, 8, 10)

    def grad(x, g):
        x = x.detach().requires_grad_()
        return torch.autograd.grad(F.max_pool2d(x, 3, 2, 1), x, g)[0]

    npubridge.reset_stats()
    got = grad(x.npu(), g.npu())
    assert_no_fallbacks()
    assert_matches(got, grad, x, g)
