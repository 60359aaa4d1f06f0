"""torch_npu's fused operators on mindspeed_like's kernels.

Each keeps torch_npu's name, signature and return convention, and calls
``torch.ops.mindspeed_like.<op>`` through npubridge.mindspeed.functional
(which checks the tensors are on the npu and names a missing plugin).
Autograd comes from the plugin's derivative formulas."""
import torch
from npubridge.mindspeed import functional as _ms

__all__ = [
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_rotary_position_embedding", "npu_swiglu",
    "npu_fusion_attention", "npu_matmul_add_fp32", "npu_format_cast", "get_npu_format",
]

# Ascend's tensor formats: ACL_FORMAT_ND is the plain row-major layout.
ACL_FORMAT_ND = 2


def npu_rms_norm(x, gamma, epsilon=1e-06):
    """Returns ``(y, rstd)``: y in x's dtype, rstd float32."""
    return _ms.npu_rms_norm(x, gamma, epsilon)


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    """Returns ``(y, rstd, x)`` with ``x = x1 + x2``."""
    return _ms.npu_add_rms_norm(x1, x2, gamma, epsilon)


def npu_rotary_mul(input, r1, r2, rotary_mode="half"):  # noqa: A002 - torch_npu's name
    """``input * r1 + rotate(input) * r2``; rotary_mode 'half' or 'interleave'."""
    return _ms.npu_rotary_mul(input, r1, r2, rotary_mode)


def npu_rotary_position_embedding(x, cos, sin, mode=0):
    return _ms.npu_rotary_position_embedding(x, cos, sin, mode)


def npu_swiglu(input, dim=-1):  # noqa: A002 - torch_npu's name
    return _ms.npu_swiglu(input, dim)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False):
    """torch_npu's flash attention. Returns torch_npu's 7-tuple
    ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset,
    numels)``; the last three describe the dropout mask, which is never
    drawn here (keep_prob must be 1; the kernel refuses dropout), so they
    are 0. ``gen_mask_parallel`` and ``sync`` only schedule the dropout
    mask's generation on Ascend and are accepted and ignored.
    ``actual_seq_qlen``/``actual_seq_kvlen`` (TND) are cumulative lengths,
    a list or tuple of ints."""
    if actual_seq_qlen is not None:
        actual_seq_qlen = [int(n) for n in actual_seq_qlen]
    if actual_seq_kvlen is not None:
        actual_seq_kvlen = [int(n) for n in actual_seq_kvlen]
    out = _ms.npu_fusion_attention(query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask,
                                   atten_mask=atten_mask, scale=scale, keep_prob=keep_prob, pre_tockens=pre_tockens,
                                   next_tockens=next_tockens, inner_precise=inner_precise, prefix=prefix,
                                   actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                                   sparse_mode=sparse_mode)
    return (*out, 0, 0, 0)


def npu_matmul_add_fp32(x, weight, C):  # noqa: N803 - torch_npu's name
    """``C += x^T @ weight`` in float32, in place; returns None."""
    return _ms.npu_matmul_add_fp32(x, weight, C)


def npu_format_cast(tensor, acl_format):
    """The simulated npu keeps every tensor in the plain ND layout (no
    private formats such as FRACTAL_NZ): the data is the same in any format,
    so the tensor itself is returned."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torch_npu.npu_format_cast: expected a tensor but found {type(tensor).__name__}")
    return tensor


def get_npu_format(tensor):
    """ACL_FORMAT_ND (2): the only layout the simulated npu has."""
    return ACL_FORMAT_ND
