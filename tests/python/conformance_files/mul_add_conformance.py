"""npubridge.testing samples and references of the test plugins' mul_add
(tests/plugins/conformance_plugin.cpp), one registration per namespace."""
import torch

from npubridge import testing

NAMESPACES = ("conf_good", "conf_meta", "conf_grad", "conf_crash")


def mul_add(x, y):
    return x * y + x


def mul_add_samples(dtype):
    yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype), name="[4,5]")
    yield testing.Sample(torch.randn(3, 2, 6, dtype=dtype), torch.randn(3, 2, 6, dtype=dtype), name="[3,2,6]")
    yield testing.Sample(torch.randn(0, 3, dtype=dtype), torch.randn(0, 3, dtype=dtype), name="empty")
    # x * y + x of shapes [4,5] and [3,5] is an error for ATen too.
    yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype), name="mismatched shapes")


def mul_add_backward(grad, x, y):
    return grad * (y + 1), grad * x


def mul_add_backward_samples(dtype):
    for shape in ((4, 5), (2, 3, 4)):
        yield testing.Sample(*(torch.randn(*shape, dtype=dtype) for _ in range(3)), name=str(list(shape)))


for ns in NAMESPACES:
    testing.reference(f"{ns}::mul_add")(mul_add)
    testing.samples(f"{ns}::mul_add")(mul_add_samples)
    testing.reference(f"{ns}::mul_add_backward")(mul_add_backward)
    testing.samples(f"{ns}::mul_add_backward")(mul_add_backward_samples)
