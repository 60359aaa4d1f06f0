"""npubridge.testing samples and references of vllm_like's ops
(plugins/vllm_like), for `python3 -m npubridge conformance --plugin
libnpub_vllm_like.so --tests this file` (CTest conformance.torch.vllm_like)."""
import torch
import torch.nn.functional as F

from npubridge import testing


@testing.reference("vllm_like::silu_and_mul")
def silu_and_mul(out, x):
    # Returns nothing and writes out: the reference gives out's expected value.
    if x.shape[-1] % 2 != 0:
        raise ValueError("input's last dimension must be even")
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@testing.samples("vllm_like::silu_and_mul")
def silu_and_mul_samples(dtype):
    for shape in ((4, 32), (2, 3, 64), (1, 2), (0, 8), (128, 512)):
        out = torch.empty(*shape[:-1], shape[-1] // 2, dtype=dtype)
        yield testing.Sample(out, torch.randn(*shape, dtype=dtype), name=str(list(shape)))
    yield testing.Sample(torch.empty(4, 2, dtype=dtype), torch.randn(4, 5, dtype=dtype), name="odd last dim (error)")
