"""The bridge's meta-shape cache (python_ext/csrc/aten/meta_cache.cpp)
remembers a functional op's output shapes per call signature. Index's
indices are a Tensor?[]: integer index tensors join the key by their shape,
a boolean or byte mask (whose result has as many rows as it holds true
values) is never cached. Each call is checked exactly against the CPU, in
an order where a wrong cache entry would show."""
import torch

import npubridge
from conftest import assert_no_fallbacks


def _same(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got.cpu(), want)


def test_integer_indices_of_one_shape_and_others():
    torch.manual_seed(0)
    x = torch.randn(64, 8, 5)
    xn = x.npu()
    npubridge.reset_stats()
    for n in (16, 16, 7, 16, 1, 0):
        idx = torch.randint(0, 64, (n,))
        _same(xn[idx.npu()], x[idx])
        col = torch.randint(0, 8, (n, 2))
        _same(xn[:, col.npu()], x[:, col])  # a None (the full slice) in the list
        _same(xn[idx.npu(), :, torch.zeros_like(idx).npu()], x[idx, :, torch.zeros_like(idx)])
    assert_no_fallbacks()
    assert npubridge.stats()["aten::index.Tensor_out"]["native"]["cann_like"] > 0


def test_masks_of_one_shape_select_their_own_count():
    torch.manual_seed(0)
    x = torch.randn(32, 6)
    xn = x.npu()
    for p in (0.5, 0.1, 0.9, 0.5, 0.0, 1.0):
        mask = torch.rand(32) < p
        _same(xn[mask.npu()], x[mask])
        _same(xn[mask.to(torch.uint8).npu().bool()], x[mask])
        m2 = torch.rand(32, 6) < p
        _same(xn[m2.npu()], x[m2])


def test_index_put_with_indices_of_several_shapes():
    torch.manual_seed(0)
    for n in (5, 5, 9, 1):
        x = torch.zeros(20, 3)
        idx = torch.randint(0, 20, (n,))
        v = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
        xn = x.npu()
        xn.index_put_((idx.npu(),), v.npu(), accumulate=True)
        x.index_put_((idx,), v, accumulate=True)
        _same(xn, x)
