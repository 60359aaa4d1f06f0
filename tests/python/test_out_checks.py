"""out= arguments are checked as ATen checks them (Note [out= is checked as
ATen checks it], bridge.cpp): overlap of out with the inputs (ATen's
assert_no_overlap, assert_no_partial_overlap and assert_no_internal_overlap,
which differ per op) and the out dtype. Every case runs on the CPU and on
npu, and the two must agree on the exception class and ATen's message, or
on the values. Inputs are small integers in float32, so every sum and
product here is exact and the values must be equal."""
import pytest
import torch

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_same_outcome


def ints(d, *shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randint(-4, 5, shape, generator=g).to(dtype).to(d)


def idx(d, *values):
    return torch.tensor(values, device=d)


def empty(d, *shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device=d)


CASES = {
    # masked_select: any overlap of out with self or mask is refused
    "masked_select out=self": lambda d: (lambda x: torch.masked_select(x, x > 0, out=x))(ints(d, 6)),
    "masked_select out=mask": lambda d: (lambda x, m: torch.masked_select(x, m, out=m))(ints(d, 6), ints(d, 6) > 0),
    "masked_select out of another dtype": lambda d: (lambda x: torch.masked_select(x, x > 0, out=empty(d, 0, dtype=torch.int64)))(ints(d, 6)),
    "masked_select out= resized": lambda d: (lambda x: torch.masked_select(x, x > 0, out=empty(d, 0)))(ints(d, 6)),
    # index_select
    "index_select out=self": lambda d: (lambda x: torch.index_select(x, 0, idx(d, 1, 0), out=x))(ints(d, 2, 3)),
    "index_select out=index": lambda d: (lambda i: torch.index_select(torch.arange(5, device=d), 0, i, out=i))(idx(d, 0, 1)),
    "index_select out overlaps self in part": lambda d: (lambda x: torch.index_select(x[:2], 0, idx(d, 0, 1), out=x[1:]))(ints(d, 3, 3)),
    "index_select out of another dtype": lambda d: (lambda x: torch.index_select(x, 0, idx(d, 0, 1), out=empty(d, 2, 3, dtype=torch.float64)))(ints(d, 2, 3)),
    "index_select out= beside self": lambda d: (lambda b: (torch.index_select(b[0], 0, idx(d, 2, 0), out=b[1, :2]), b)[1])(ints(d, 2, 3)),
    # cat and stack
    "cat out=an input": lambda d: (lambda x: torch.cat([x, x], out=x))(ints(d, 2, 3)),
    "cat out overlaps an input in part": lambda d: (lambda x: torch.cat([x[:1], x[1:2]], out=x[1:3]))(ints(d, 4, 3)),
    "cat out=int64 from float": lambda d: (lambda x: torch.cat([x, x], out=empty(d, 4, 3, dtype=torch.int64)))(ints(d, 2, 3)),
    "cat out=float64 from float": lambda d: (lambda x: torch.cat([x, x], out=empty(d, 4, 3, dtype=torch.float64)))(ints(d, 2, 3)),
    "cat out= resized": lambda d: (lambda x: torch.cat([x, x], out=empty(d, 1)))(ints(d, 2, 3)),
    "stack out=an input": lambda d: (lambda x: torch.stack([x, x], out=x))(ints(d, 2)),
    # reductions: ATen checks no overlap, and casts to a wider out dtype
    "sum out=a row of self": lambda d: (lambda x: (torch.sum(x, 0, out=x[0]), x)[1])(ints(d, 3, 3)),
    "sum out=int64 from float": lambda d: (lambda x: torch.sum(x, 0, out=empty(d, 3, dtype=torch.int64)))(ints(d, 3, 3)),
    "sum out=float64 from float": lambda d: (lambda x: torch.sum(x, 0, out=empty(d, 3, dtype=torch.float64)))(ints(d, 3, 3)),
    "cumsum out overlaps self in part": lambda d: (lambda x: torch.cumsum(x[:3], 0, out=x[1:]))(ints(d, 4)),
    "argmax out=float": lambda d: (lambda x: torch.argmax(x, 0, out=empty(d, 3)))(ints(d, 3, 3)),
    "max.dim values out=a row of self": lambda d: (lambda x: torch.max(x, 0, out=(x[0], empty(d, 3, dtype=torch.long)))[0])(ints(d, 3, 3)),
    # matrix products: ATen checks the dtype, not the overlap
    "mm out=self": lambda d: (lambda x: (torch.mm(x, x, out=x), x)[1])(ints(d, 3, 3)),
    "mm out=float64": lambda d: (lambda x: torch.mm(x, x, out=empty(d, 3, 3, dtype=torch.float64)))(ints(d, 3, 3)),
    "mm out= resized": lambda d: (lambda x: torch.mm(x, x, out=empty(d, 2, 2)))(ints(d, 3, 3)),
    "addmm out=self": lambda d: (lambda x: (torch.addmm(x, x, x, out=x), x)[1])(ints(d, 3, 3)),
    "bmm out=self": lambda d: (lambda x: (torch.bmm(x, x, out=x), x)[1])(ints(d, 2, 3, 3)),
    # elementwise (TensorIterator): the same view is allowed, a partial or
    # internal overlap is not; the result type must cast to out's
    "add out=self": lambda d: (lambda x: (torch.add(x, 1, out=x), x)[1])(ints(d, 3)),
    "add out overlaps self in part": lambda d: (lambda x: torch.add(x[:3], 1, out=x[1:]))(ints(d, 4)),
    "add out=int64 from float": lambda d: (lambda x: torch.add(x, 1, out=empty(d, 3, dtype=torch.int64)))(ints(d, 3)),
    "add out=float64 from float": lambda d: (lambda x: torch.add(x, 1, out=empty(d, 3, dtype=torch.float64)))(ints(d, 3)),
    "add out=an expanded tensor": lambda d: (lambda x: torch.add(x, 1, out=empty(d, 1).expand(3)))(ints(d, 3)),
    "mul out=other": lambda d: (lambda x, y: (torch.mul(x, y, out=y), y)[1])(ints(d, 3), ints(d, 4)[:3]),
    "where out=self": lambda d: (lambda x: (torch.where(x > 0, x, 0.0, out=x), x)[1])(ints(d, 4)),
    "clamp out=self": lambda d: (lambda x: (torch.clamp(x, 0, 1, out=x), x)[1])(ints(d, 4)),
    "neg out=self": lambda d: (lambda x: (torch.neg(x, out=x), x)[1])(ints(d, 3)),
    "exp out=int32": lambda d: (lambda x: torch.exp(x, out=empty(d, 4, dtype=torch.int32)))(ints(d, 4)),
    "pow out=int64 from float": lambda d: (lambda x: torch.pow(x, 2, out=empty(d, 3, dtype=torch.int64)))(ints(d, 3)),
    "eq out=float": lambda d: (lambda x: torch.eq(x, 0, out=empty(d, 3)))(ints(d, 3)),
    # indexing ops refuse any overlap of out with their inputs
    "gather out=self": lambda d: (lambda x: torch.gather(x, 1, torch.zeros(3, 3, dtype=torch.long, device=d), out=x))(ints(d, 3, 3)),
    "index_add out=source": lambda d: (lambda x: torch.index_add(x, 0, idx(d, 0), x[:1], out=x))(ints(d, 3)),
    "nonzero out=self": lambda d: (lambda x: torch.nonzero(x, out=x))(torch.tensor([[1, 0], [0, 1]], device=d)),
    "take out=self": lambda d: (lambda x: torch.take(x, idx(d, 0, 1, 2), out=x))(ints(d, 3)),
    "sort values out=self": lambda d: (lambda x: torch.sort(x, out=(x, empty(d, 4, dtype=torch.long)))[0])(ints(d, 4)),
    "topk values out=part of self": lambda d: (lambda x: torch.topk(x, 2, out=(x[:2], empty(d, 2, dtype=torch.long)))[0])(ints(d, 4)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_npu_checks_out_as_the_cpu(name):
    assert_same_outcome(name, CASES[name])


def test_a_refused_out_leaves_its_tensors_alone():
    x = ints("npu", 6)
    before = x.cpu()
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor"):
        torch.masked_select(x, x > 0, out=x)
    assert torch.equal(x.cpu(), before)


def test_an_out_apart_from_the_inputs_stays_on_the_device():
    npubridge.reset_stats()
    x = ints("npu", 3, 3)
    out = empty("npu", 3, 3)
    torch.add(x, 1, out=out)
    torch.mm(x, x, out=out)
    assert torch.equal(out.cpu(), ints("cpu", 3, 3) @ ints("cpu", 3, 3))
    assert all(s["fallbacks"] == 0 for s in npubridge.stats().values()), npubridge.stats()


def test_an_out_that_is_the_very_same_view_as_an_input_stays_on_the_device():
    # ATen's elementwise ops allow it, and the plugins' alias-safe kernels
    # serve it: an optimizer's foreach step writes its parameters so.
    npubridge.reset_stats()
    x, y = ints("npu", 4), ints("npu", 4, seed=1)
    torch.mul(x, y, out=x)
    torch.add(y, x, alpha=2, out=y)
    params = [ints("npu", 3), ints("npu", 2, 2)]
    torch._foreach_mul_(params, 0.5)
    x_cpu, y_cpu = ints("cpu", 4), ints("cpu", 4, seed=1)
    x_cpu = x_cpu * y_cpu
    assert torch.equal(x.cpu(), x_cpu)
    assert torch.equal(y.cpu(), y_cpu + 2 * x_cpu)
    assert torch.equal(params[1].cpu(), ints("cpu", 2, 2) * 0.5)
    assert all(s["fallbacks"] == 0 for s in npubridge.stats().values()), npubridge.stats()
