"""Memory formats on npu as on the CPU: channels_last survives empty,
clone, contiguous, elementwise ops and convolutions (Note [Results keep
their inputs' memory format]), and the values stay the CPU's."""
import copy

import pytest
import torch
import torch.nn.functional as F

import npubridge
from conftest import assert_no_fallbacks

CL = torch.channels_last


def both(f):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    w = torch.randn(6, 3, 3, 3, dtype=torch.float64)
    return [f(x.to(d), w.to(d), d) for d in ("cpu", "npu")]


CASES = {
    "empty channels_last": lambda x, w, d: torch.empty(2, 3, 4, 5, device=d, memory_format=CL),
    "empty channels_last_3d": lambda x, w, d: torch.empty(2, 3, 2, 4, 5, device=d, memory_format=torch.channels_last_3d),
    "contiguous(channels_last)": lambda x, w, d: x.contiguous(memory_format=CL),
    "clone(channels_last)": lambda x, w, d: x.clone(memory_format=CL),
    "clone preserves channels_last": lambda x, w, d: x.contiguous(memory_format=CL).clone(),
    "clone preserves a transpose": lambda x, w, d: x[0, 0].t().clone(),
    "clone(contiguous) of channels_last": lambda x, w, d: x.contiguous(memory_format=CL).clone(memory_format=torch.contiguous_format),
    "empty_like of channels_last": lambda x, w, d: torch.empty_like(x.contiguous(memory_format=CL)).fill_(1),
    "add of channels_last": lambda x, w, d: x.contiguous(memory_format=CL) + 1,
    "relu of channels_last": lambda x, w, d: torch.relu(x.contiguous(memory_format=CL)),
    "mixed add": lambda x, w, d: x.contiguous(memory_format=CL) + x,
    "conv2d channels_last input": lambda x, w, d: F.conv2d(x.contiguous(memory_format=CL), w, padding=1),
    "conv2d channels_last weight": lambda x, w, d: F.conv2d(x, w.contiguous(memory_format=CL)),
    "conv2d contiguous": lambda x, w, d: F.conv2d(x, w, stride=2),
    "max_pool2d of channels_last": lambda x, w, d: F.max_pool2d(x.contiguous(memory_format=CL), 2),
    "batch_norm of channels_last": lambda x, w, d: F.batch_norm(x.contiguous(memory_format=CL), None, None,
                                                                training=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_layout_and_values_follow_the_cpu(name):
    cpu, npu = both(CASES[name])
    assert npu.device.type == "npu"
    assert npu.stride() == cpu.stride(), f"{name}: npu strides {npu.stride()}, cpu {cpu.stride()}"
    if "empty" not in name or "fill_" in name:
        torch.testing.assert_close(npu.cpu(), cpu)


def test_a_channels_last_block_trains_as_on_the_cpu():
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, stride=2), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 5 * 5, 5)).double()
    x = torch.randn(4, 3, 12, 12, dtype=torch.float64)
    results = []
    for d in ("cpu", "npu"):
        m = copy.deepcopy(block).to(d).to(memory_format=CL)
        xd = x.to(d).contiguous(memory_format=CL).requires_grad_()
        out = m(xd)
        out.square().sum().backward()
        results.append((out.cpu(), xd.grad.cpu(), xd.grad.stride(), [p.grad.cpu() for p in m.parameters()]))
    (o_c, g_c, s_c, p_c), (o_n, g_n, s_n, p_n) = results
    torch.testing.assert_close(o_n, o_c)
    torch.testing.assert_close(g_n, g_c)
    assert s_n == s_c
    for a, b in zip(p_n, p_c):
        torch.testing.assert_close(a, b)


def test_a_channels_last_convolution_is_laid_out_on_the_device():
    # The result's channels_last copy used to be aten::clone(channels_last),
    # which plugins do not serve: a CPU round trip per convolution.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CL)
    w = torch.randn(6, 3, 3, 3)
    npubridge.reset_stats()
    y = F.conv2d(x.npu(), w.npu(), padding=1)
    assert y.is_contiguous(memory_format=CL)
    assert_no_fallbacks()
    torch.testing.assert_close(y.cpu(), F.conv2d(x, w, padding=1))
