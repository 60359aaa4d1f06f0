"""Conformance tests of hardtanh_plugin.c's own op, for
`python3 -m npubridge conformance --plugin libc_npu_plugin.so` (found beside
the library under this name, or passed with --tests)."""
import torch

from npubridge import testing


@testing.reference("cplug::hardtanh")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    # Written with ATen; runs on the CPU in the sample's dtype and in float64.
    return torch.nn.functional.hardtanh(x, min_val, max_val)


@testing.samples("cplug::hardtanh")
def hardtanh_samples(dtype):
    # Called once per dtype the op's kernels declare (float32 here); CPU tensors.
    yield testing.Sample(torch.randn(4, 5, dtype=dtype) * 3)
    yield testing.Sample(torch.randn(3, 7, dtype=dtype) * 3, -0.5, 2.0, name="custom bounds")
    yield testing.Sample(torch.randn(6, 4, dtype=dtype).t(), name="transposed")
    yield testing.Sample(torch.randn(0, 3, dtype=dtype), name="empty")
    # The reference raises on it: the kernel must refuse it too.
    yield testing.Sample(torch.randn(4, dtype=dtype), 2.0, -2.0, name="min above max")
