"""npubridge.testing samples and references of mindspeed_like's ops
(plugins/mindspeed_like), for `python3 -m npubridge conformance --plugin
libnpub_mindspeed_like.so --tests this file` (CTest conformance.torch.mindspeed_like)."""
import torch

from npubridge import testing

SHAPES = (((4, 16), (16,)), ((2, 3, 8), (3, 8)), ((5, 7), (7,)), ((0, 8), (8,)), ((64, 256), (256,)))


def _dims(x, gamma):
    return list(range(x.dim() - gamma.dim(), x.dim()))


@testing.reference("mindspeed_like::npu_rms_norm")
def npu_rms_norm(x, gamma, epsilon=1e-6):
    if gamma.dim() < 1 or gamma.dim() > x.dim() or x.shape[x.dim() - gamma.dim():] != gamma.shape:
        raise ValueError("gamma must match the trailing shape of self")
    rstd = torch.rsqrt(x.pow(2).mean(_dims(x, gamma), keepdim=True) + epsilon)
    # rstd is float32 whatever the input (float64 in the float64 reference run)
    return x * rstd * gamma, rstd.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


@testing.samples("mindspeed_like::npu_rms_norm")
def npu_rms_norm_samples(dtype):
    for x, g in SHAPES:
        yield testing.Sample(torch.randn(*x, dtype=dtype), torch.randn(*g, dtype=dtype), 1e-6, name=f"{list(x)}")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, dtype=dtype), name="gamma mismatch (error)")


@testing.reference("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward(dy, x, gamma, rstd):
    # The gradients of y = x * rstd(x) * gamma by autograd; rstd recomputed
    # from x (equal in value to the sample's).
    dims = _dims(x, gamma)
    with torch.enable_grad():
        xd, gd = x.detach().requires_grad_(True), gamma.detach().requires_grad_(True)
        r = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + 1e-6)
        dx, dgamma = torch.autograd.grad(xd * r * gd, (xd, gd), dy)
    return dx, dgamma


@testing.samples("mindspeed_like::npu_rms_norm_backward")
def npu_rms_norm_backward_samples(dtype):
    for x_shape, g_shape in SHAPES[:3]:
        x, g = torch.randn(*x_shape, dtype=dtype), torch.randn(*g_shape, dtype=dtype)
        rstd = torch.rsqrt(x.float().pow(2).mean(_dims(x, g), keepdim=True) + 1e-6)
        yield testing.Sample(torch.randn(*x_shape, dtype=dtype), x, g, rstd, name=f"{list(x_shape)}")
