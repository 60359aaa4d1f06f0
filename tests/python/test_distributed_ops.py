"""The npu ops DDP, FSDP2 and DTensor run besides the collectives, in one
process: FSDP2's copy-in/copy-out ops (torch.ops.fsdp.*, _chunk_cat,
split_with_sizes_copy, _foreach_copy_), the storage resize it frees and
re-allocates unsharded parameters with, and the _foreach_* ops the
optimizers take on npu. Copies, cats and splits move bits: they equal the
CPU exactly. The arithmetic ones (the optimizers' steps) are judged by
npubridge's error model (conftest.assert_judged: against float64 on the
CPU, within a few times the CPU's own float error), not bit for bit: the
plugin kernels round differently from the CPU's (a + alpha * b in two
roundings where the CPU fuses it, for one), by up to an ulp per op."""
import pytest
import torch

import npubridge  # noqa: F401

import torch.distributed.fsdp  # noqa: F401  (defines torch.ops.fsdp.*)

from conftest import assert_judged, assert_no_fallbacks

DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _rand(shape, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen, dtype=dtype)


def _npu(ts):
    return [t.to("npu") for t in ts]


def _no_fallbacks():
    """No op of the block fell back to the CPU (FSDP2 runs these on every
    step: they must be served by npu kernels, here through the ATen
    composites of _chunk_cat / split_with_sizes_copy over cat and copy_)."""
    assert_no_fallbacks()


def _equal(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,num_chunks", [(0, 2), (0, 3), (1, 2), (1, 4)])
def test_chunk_cat_equals_the_cpu(dtype, dim, num_chunks):
    # FSDP2's reduce-scatter input: each gradient cut into world-size chunks
    # along dim, chunk i of every gradient side by side (padded where a size
    # does not divide). Uneven sizes, a 1-d tensor, a non-contiguous one.
    gen = torch.Generator().manual_seed(0)
    if dim == 0:
        ts = [_rand((5, 3), dtype, gen), _rand((7, 6), dtype, gen), _rand((11,), dtype, gen),
              _rand((5, 6), dtype, gen).t()[:3]]
    else:  # the sizes before dim agree (as _chunk_cat asks)
        ts = [_rand((4, 3), dtype, gen), _rand((4, 6, 2), dtype, gen), _rand((4, 1), dtype, gen),
              _rand((4, 9), dtype, gen)[:, ::2]]
    want = torch._chunk_cat(ts, dim, num_chunks)
    inputs, out = _npu(ts), torch.full_like(want, 7).to("npu")
    npubridge.reset_stats()
    got = torch._chunk_cat(inputs, dim, num_chunks)
    torch.ops.fsdp.chunk_cat(inputs, dim, num_chunks, out=out)
    _no_fallbacks()
    _equal(got, want)
    _equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_with_sizes_copy_equals_the_cpu(dtype):
    # FSDP2's all-gather copy-out: the gathered flat buffer, as
    # (world, numel) rows, split into each parameter's columns.
    gen = torch.Generator().manual_seed(1)
    flat = _rand((2, 23), dtype, gen)
    sizes = [10, 0, 1, 12]
    want = torch.split_with_sizes_copy(flat, sizes, dim=1)
    flat_npu, outs = flat.to("npu"), [torch.full((2, s), 5, dtype=dtype, device="npu") for s in sizes]
    npubridge.reset_stats()
    got = torch.split_with_sizes_copy(flat_npu, sizes, dim=1)
    torch.ops.fsdp.split_with_sizes_copy(flat_npu, sizes, dim=1, out=outs)
    _no_fallbacks()
    for g, w in zip(got, want):
        _equal(g, w)
    for g, w in zip(outs, want):
        _equal(g, w)
    out0 = [torch.empty(s, 23, dtype=dtype, device="npu") for s in (1, 1)]
    torch.split_with_sizes_copy(flat.to("npu"), [1, 1], dim=0, out=out0)
    for g, w in zip(out0, flat.split([1, 1])):
        _equal(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_copy_in_writes_this_ranks_slice_of_the_output(dtype):
    gen = torch.Generator().manual_seed(2)
    inputs = [_rand((6,), dtype, gen), _rand((1,), dtype, gen), _rand((4,), dtype, gen)]
    numel, world, rank = 11, 3, 1
    output, inputs_npu = torch.full((numel * world,), 9, dtype=dtype, device="npu"), _npu(inputs)
    npubridge.reset_stats()
    ag_in, ag_out = torch.ops.fsdp.all_gather_copy_in(inputs_npu, output, [6, 1, 4], numel, rank)
    _no_fallbacks()
    assert ag_out.data_ptr() == output.data_ptr() and ag_in.data_ptr() == output[numel:].data_ptr()
    want = torch.full((numel * world,), 9, dtype=dtype)
    want[numel:2 * numel] = torch.cat(inputs)
    _equal(ag_out, want)


def test_storage_resize_frees_and_reallocates_as_fsdp2_does():
    # FSDP2 frees an unsharded parameter with storage().resize_(0) after
    # forward and re-allocates it with resize_(nbytes) before the next
    # all-gather writes it; a growing resize keeps the old bytes.
    x = torch.arange(8, dtype=torch.float32, device="npu")
    view = x.view(2, 4)
    before = torch.npu.memory_allocated()
    x.untyped_storage().resize_(0)
    assert x.untyped_storage().nbytes() == 0 and torch.npu.memory_allocated() < before
    x.untyped_storage().resize_(8 * 4)
    view.copy_(torch.arange(8, 16, dtype=torch.float32).view(2, 4))
    _equal(x, torch.arange(8, 16, dtype=torch.float32))
    x.untyped_storage().resize_(16 * 4)
    assert torch.equal(torch.tensor([], device="npu").set_(x.untyped_storage()).cpu()[:8],
                       torch.arange(8, 16, dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foreach_ops_of_the_optimizers_equal_the_cpu(dtype):
    gen = torch.Generator().manual_seed(3)
    shapes = [(7,), (3, 5), (1,), (0,), (64, 33)]
    a, b, c = ([_rand(s, dtype, gen) for s in shapes] for _ in range(3))
    c = [t.abs() + 0.5 for t in c]
    steps = [
        ("copy_", lambda x, y, z: torch._foreach_copy_(x, y)),
        ("add_", lambda x, y, z: torch._foreach_add_(x, y, alpha=-0.1)),
        ("mul_", lambda x, y, z: torch._foreach_mul_(x, 0.9)),
        ("lerp_", lambda x, y, z: torch._foreach_lerp_(x, y, 0.1)),
        ("addcmul_", lambda x, y, z: torch._foreach_addcmul_(x, y, z, value=0.001)),
        ("addcdiv_", lambda x, y, z: torch._foreach_addcdiv_(x, y, z, value=-0.01)),
        ("sqrt+div", lambda x, y, z: torch._foreach_div_(x, torch._foreach_add_(torch._foreach_sqrt(z), 1e-8))),
        ("maximum_", lambda x, y, z: torch._foreach_maximum_(x, y)),
        ("zero_", lambda x, y, z: torch._foreach_zero_(x)),
    ]
    for name, step in steps:
        cpu, wide, npu = [t.clone() for t in a], [t.double() for t in a], _npu(a)
        step(cpu, b, c)
        step(wide, [t.double() for t in b], [t.double() for t in c])
        step(npu, _npu(b), _npu(c))
        for g, h, w in zip(npu, cpu, wide):
            if name in ("copy_", "zero_", "maximum_"):  # exact on both
                assert torch.equal(g.cpu(), h), name
            else:
                assert_judged(g, h, w, name)
    # _foreach_maximum_ (AdamW's amsgrad) and _foreach_norm (clip_grad_norm_)
    # reach clamp_min.Tensor and linalg_vector_norm, which the plugins do
    # not serve: the CPU fallback runs them (correct, as checked here; the
    # cost is a copy of each tensor to the host, once per step).
    # Gradient clipping's norm: a sum, whose order may differ; a float32
    # sum of n squares in any order is within n * eps of the exact one
    # (relative, all terms positive), the bf16 ones are summed in float32.
    norms = torch._foreach_norm(_npu(a))
    for g, t in zip(norms, a):
        torch.testing.assert_close(g.cpu().float(), t.double().norm().float(), rtol=t.numel() * 2.0 ** -23 +
                                   (2.0 ** -8 if dtype == torch.bfloat16 else 0), atol=0)


@pytest.mark.parametrize("opt", ["SGD", "AdamW"])
def test_optimizer_steps_with_foreach_on_npu_equal_the_cpu(opt):
    # What the trainings of tests/python/distributed/ do each step, without
    # the collectives: the foreach (multi-tensor) path the optimizers take
    # for npu parameters against the same path on the CPU.
    gen = torch.Generator().manual_seed(4)
    params = [torch.randn(s, generator=gen) for s in [(16, 8), (8,), (3, 3, 3)]]
    grads = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(3)]
    kw = dict(lr=0.05, momentum=0.9) if opt == "SGD" else dict(lr=1e-2, weight_decay=0.01)
    results = []
    for device, dtype in (("npu", torch.float32), ("cpu", torch.float32), ("cpu", torch.float64)):
        ps = [p.to(device, dtype, copy=True).requires_grad_() for p in params]
        o = getattr(torch.optim, opt)(ps, foreach=True, **kw)
        for g in grads:
            for p, gi in zip(ps, g):
                p.grad = gi.to(device, dtype)
            o.step()
        results.append([p.detach().cpu() for p in ps])
    for got, host, wide in zip(*results):
        assert_judged(got, host, wide, opt)
