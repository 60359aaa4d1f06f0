"""Pinned host memory for the npu (python_ext/csrc/runtime/host_allocator.cpp,
Note [What pinning means for the simulated device]): pin_memory() and
is_pinned() as with CUDA, non_blocking copies from and to it, and
DataLoader(pin_memory=True) batches."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import npubridge  # noqa: F401


def test_pin_memory_copies_into_pinned_memory_and_is_pinned_says_so():
    t = torch.randn(4)
    assert not t.is_pinned()
    p = t.pin_memory()
    assert p.is_pinned()
    assert p.device.type == "cpu"
    assert p.data_ptr() != t.data_ptr()
    assert torch.equal(p, t)
    assert p.pin_memory() is p  # already pinned: the same tensor, as with CUDA
    assert p[2:].is_pinned()  # a view into pinned memory is pinned
    assert not p.clone().is_pinned()  # a CPU op's result is ordinary memory
    assert torch.empty(8, pin_memory=True).is_pinned()
    assert not torch.empty(8).is_pinned()


def test_the_deprecated_device_argument_forms_work_as_torch_accepts_them():
    t = torch.arange(6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch deprecates the argument
        p = t.pin_memory("npu")
        assert p.is_pinned("npu")
        assert not t.is_pinned("npu")
        assert torch.equal(p, t)


def test_pinned_memory_of_every_dtype_and_size_holds_its_values():
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64):
        for n in (1, 1000, 4097, 1 << 20):
            t = (torch.arange(n) % 7).to(dtype)
            p = t.pin_memory()
            assert p.is_pinned() and p.dtype == dtype and torch.equal(p, t)
    assert torch.empty(0).pin_memory().numel() == 0


@pytest.mark.parametrize("shape", [(5,), (64, 33), (3, 4, 5)])
def test_non_blocking_copies_between_pinned_memory_and_the_npu_are_exact(shape):
    src = torch.randn(shape).pin_memory()
    d = src.to("npu", non_blocking=True)
    assert d.device.type == "npu"
    e = d * 2  # ordered after the copy on the current stream
    back = torch.empty(shape, pin_memory=True)
    back.copy_(e, non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(back, src * 2)
    host = e.to("cpu", non_blocking=True)
    torch.npu.current_stream().synchronize()
    assert torch.equal(host, src * 2)
    # Into a non-contiguous npu view, from pinned memory.
    target = torch.zeros(2 * shape[0], *shape[1:], device="npu")
    target[::2].copy_(src, non_blocking=True)
    torch.npu.synchronize()
    assert torch.equal(target[::2].cpu(), src) and not target[1::2].cpu().any()


def _loader(**kwargs):
    x = torch.arange(40.0).reshape(20, 2)
    y = torch.arange(20)
    return x, y, DataLoader(TensorDataset(x, y), batch_size=6, **kwargs)


@pytest.mark.parametrize("kwargs", [{"pin_memory": True}, {"pin_memory": True, "pin_memory_device": "npu"}])
def test_dataloader_pins_its_batches_for_the_npu(kwargs):
    x, y, loader = _loader(**kwargs)
    seen = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory_device is deprecated: the current accelerator is used
        for xb, yb in loader:
            assert xb.is_pinned() and yb.is_pinned()
            xd, yd = xb.to("npu", non_blocking=True), yb.to("npu", non_blocking=True)
            assert torch.equal(xd.cpu(), x[seen:seen + len(xb)])
            assert torch.equal(yd.cpu(), y[seen:seen + len(yb)])
            seen += len(xb)
    assert seen == 20


def test_dataloader_without_pin_memory_gives_ordinary_batches():
    _, _, loader = _loader()
    assert not any(xb.is_pinned() for xb, _ in loader)
