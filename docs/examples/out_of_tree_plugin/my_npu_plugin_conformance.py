"""Conformance tests of my_plugin.cpp's own op, for
`python3 -m npubridge conformance --plugin libmy_npu_plugin.so` (found beside
the library under this name, or passed with --tests)."""
import torch

from npubridge import testing


@testing.reference("myplug::axpy")
def axpy(x, y, alpha):
    # Written with ATen; runs on the CPU, once in the sample's dtype and once
    # on float64 copies of its floating tensors.
    return alpha * x + y


@testing.samples("myplug::axpy")
def axpy_samples(dtype):
    # Called once per dtype the op's kernels declare; CPU tensors.
    yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype), 2.0)
    yield testing.Sample(torch.randn(0, 3, dtype=dtype), torch.randn(0, 3, dtype=dtype), 1.0, name="empty")
    # The reference raises on it: the kernel must refuse it too.
    yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype), 1.0,
                         name="mismatched shapes")
