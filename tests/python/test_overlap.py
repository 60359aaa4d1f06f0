"""Writes into tensors that share memory with the inputs (Note [Memory
overlap]): every case runs on the CPU and on npu, and the two must agree on
the values, or on the exception class and ATen's message."""
import pytest
import torch

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_same_outcome


def square(d):
    return torch.arange(9.0, device=d).view(3, 3)


def line(d, n=8):
    return torch.arange(float(n), device=d)


CASES = {
    # refused by ATen: partial overlap of dense tensors
    "add_ of its own transpose": lambda d: (lambda a: a.add_(a.t()))(square(d)),
    "copy_ shifted onto itself": lambda d: (lambda x: x[1:].copy_(x[:-1]))(line(d)),
    "mul out= a shifted view": lambda d: (lambda x: torch.mul(x[:-1], 2, out=x[1:]))(line(d)),
    "where out= transpose": lambda d: (lambda a: torch.where(a > 3, a, a.t(), out=a))(square(d)),
    # refused by ATen: internal overlap of the written tensor
    "add_ on an expanded tensor": lambda d: torch.zeros(1, device=d).expand(4).add_(1),
    "relu_ on an expanded tensor": lambda d: torch.zeros(1, device=d).expand(4).relu_(),
    # allowed: every write the same
    "fill_ on an expanded tensor": lambda d: (lambda z: (z.expand(4).fill_(2), z)[1])(torch.zeros(1, device=d)),
    "zero_ on an expanded tensor": lambda d: (lambda z: (z.expand(4).zero_(), z)[1])(torch.ones(1, device=d)),
    # allowed: true in-place on the same memory
    "x.add_(x)": lambda d: (lambda x: x.add_(x))(line(d)),
    "x.mul_(x) on a transposed view": lambda d: (lambda a: a.t().mul_(a.t()))(square(d)),
    "add(x, y, out=x)": lambda d: (lambda x: torch.add(x, line(d), out=x))(line(d)),
    "addcmul_(x, x)": lambda d: (lambda x: x.addcmul_(x, x, value=0.5))(line(d)),
    "lerp_(x, x)": lambda d: (lambda x: x.lerp_(x * 2, 0.25))(line(d)),
    "clamp_ in place": lambda d: line(d).clamp_(2, 5),
    "relu_ in place": lambda d: (line(d) - 4).relu_(),
    "copy_ of itself": lambda d: (lambda x: x.copy_(x))(line(d)),
    "cumsum_ in place": lambda d: line(d).cumsum_(0),
    "softmax out=self": lambda d: (lambda x: torch._softmax(x, 0, False, out=x))(line(d)),
    # strided views whose memory interleaves: the elements do not overlap
    "even += odd": lambda d: (lambda x: (x[::2].add_(x[1::2]), x)[1])(line(d)),
    "column 0 += column 1": lambda d: (lambda a: (a[:, 0].add_(a[:, 1]), a)[1])(square(d)),
    "column 0 = column 1": lambda d: (lambda a: (a[:, 0].copy_(a[:, 1]), a)[1])(square(d)),
    "add out= left half from right half": lambda d: (lambda b: (torch.add(b[:, 2:], 1, out=b[:, :2]), b)[1])(torch.arange(16.0, device=d).view(4, 4)),
    # ATen warns (deprecated) and writes an expanded self for these
    "masked_fill_ on an expanded tensor": lambda d: (lambda z: (z.expand(2, 3).masked_fill_(torch.tensor([[True, False, True]] * 2, device=d), 1.0), z)[1])(torch.zeros(1, 3, device=d)),
    "add_ on an empty expanded tensor": lambda d: torch.empty_strided((3, 0), (0, 1), device=d).add_(1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_npu_agrees_with_the_cpu(name):
    assert_same_outcome(name, CASES[name])


def test_exp_out_self_reads_each_element_before_writing_it():
    # An elementary function is not bit-identical between libraries (SLEEF on
    # the CPU, the plugin's own exp): judged against float64 by aten::exp's
    # error model, 4 ulps of float32, not against the CPU's float32 bits.
    x = line("npu") / 8
    torch.exp(x, out=x)
    ref = torch.exp((line("cpu") / 8).double())
    ulp = torch.finfo(torch.float32).eps * ref.abs()
    assert ((x.cpu().double() - ref).abs() <= 4 * ulp).all(), (x.cpu(), ref)


def test_where_aten_itself_goes_wrong_or_refuses_npu_does_the_same():
    # ATen's CPU mm zeroes its output before reading the inputs, so
    # mm(a, a, out=a) gives zeros there; ATen's index_select refuses out=x.
    # npubridge's kernels do not claim to serve the output as an input
    # (NPUB_KERNEL_ALIAS_SAFE), so ATen's CPU kernel runs on views that
    # share memory as the npu tensors do (aten/aliased_fallback.cpp), and
    # npu gives what the CPU gives (tests/python/test_out_checks.py).
    a = square("npu")
    torch.mm(a, a, out=a)
    expected = square("cpu")
    torch.mm(expected, expected, out=expected)
    assert torch.equal(a.cpu(), expected)
    x = torch.arange(6.0, device="npu").view(3, 2)
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        torch.index_select(x, 0, torch.tensor([2, 0, 1], device="npu"), out=x)
    assert torch.equal(x.cpu(), torch.arange(6.0).view(3, 2))


def test_interleaved_views_stay_on_the_device():
    # Strided views whose memory ranges interleave but share no element:
    # the kernel serves them (no fallback), as ATen's TensorIterator does.
    npubridge.reset_stats()
    x = torch.arange(16.0, device="npu").view(4, 4)
    x[:, 0] = x[:, 1]
    x[..., ::2].mul_(x[..., 1::2])
    expected = torch.arange(16.0).view(4, 4)
    expected[:, 0] = expected[:, 1]
    expected[..., ::2].mul_(expected[..., 1::2])
    assert torch.equal(x.cpu(), expected)
    assert all(s["fallbacks"] == 0 for s in npubridge.stats().values()), npubridge.stats()


def test_a_refused_call_leaves_its_tensors_alone():
    a = square("npu")
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        a.add_(a.t())
    assert torch.equal(a.cpu(), square("cpu"))


def test_plugin_ops_are_checked_too():
    # vllm_like::silu_and_mul writing into a view of its own input.
    y = torch.randn(4, 4, device="npu")
    with pytest.raises(RuntimeError, match="vllm_like::silu_and_mul' cannot run on the npu: tensors it writes share memory"):
        torch.ops.vllm_like.silu_and_mul(y[:, :2], y)
