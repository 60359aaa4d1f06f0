"""``torch.nn.functional.scaled_dot_product_attention`` on npu tensors through
mindspeed_like's flash attention (``mindspeed_like::npu_fusion_attention`` and
its grad, in BNSD layout, or BSND for BNSD-shaped views of BSND tensors).

PyTorch picks SDPA's backend per call with ``aten::_fused_sdp_choice``
(reached for npu tensors through the PrivateUse1 slot that
``csrc/aten/sdpa_choice.cpp`` fills). Its PrivateUse1 kernel here answers
"overrideable" when the flash-attention kernel serves the call, and "math"
(PyTorch's composite: matmul, softmax, matmul) otherwise, so results stay
right: the plugin not loaded or disabled, dropout, a float (additive) mask,
a dtype the kernel does not take, shapes it does not take. The overrideable
backend is ``aten::_scaled_dot_product_fused_attention_overrideable`` and
its backward, whose PrivateUse1 kernels here call the plugin's ops.

``sdpa_stats()`` counts which path each call took, and why math ran.
"""
import math
import threading

import torch
from torch.nn.attention import SDPBackend

from . import _C

_MATH = int(SDPBackend.MATH)
_OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_NO_BAND = 2147483647  # torch_npu's pre_tockens / next_tockens default: no band
_PLUGIN = "mindspeed_like"

_lock = threading.Lock()
_counts = {"flash_attention": 0, "math": 0, "math_reasons": {}}


def sdpa_stats():
    """How many scaled_dot_product_attention calls on npu tensors ran
    mindspeed_like's flash attention ('flash_attention') and how many
    PyTorch's math path ('math'), with the reasons for the latter
    ('math_reasons': reason -> count)."""
    with _lock:
        return {"flash_attention": _counts["flash_attention"], "math": _counts["math"],
                "math_reasons": dict(_counts["math_reasons"])}


def reset_sdpa_stats():
    with _lock:
        _counts["flash_attention"] = _counts["math"] = 0
        _counts["math_reasons"].clear()


def _count(reason):
    with _lock:
        if reason is None:
            _counts["flash_attention"] += 1
        else:
            _counts["math"] += 1
            _counts["math_reasons"][reason] = _counts["math_reasons"].get(reason, 0) + 1


def _plugin_unavailable():
    """Why the plugin's kernel cannot run now, or None."""
    if _C.optim_level() < 2:
        return "the optimisation level is below 2 (fused ops off)"
    enabled = _C.plugin_enabled(_PLUGIN)
    if enabled is None:
        return "mindspeed_like is not loaded"
    return None if enabled else "mindspeed_like is disabled"


def _mask_broadcasts(mask, b, n, sq, skv):
    shape = list(mask.shape)
    if len(shape) > 4:
        return False
    shape = [1] * (4 - len(shape)) + shape
    return all(m in (1, t) for m, t in zip(shape, (b, n, sq, skv)))


def _why_math(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    """None when the flash-attention kernel serves the call, else why not."""
    reason = _plugin_unavailable()
    if reason:
        return reason
    if query.is_nested or key.is_nested or value.is_nested:
        return "nested tensors"
    if query.dtype not in _DTYPES:
        return f"dtype {query.dtype}"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return "query, key and value are not all 4-d (B, N, S, D) or all 3-d (B, S, D)"
    if dropout_p > 0.0:
        return "dropout_p > 0"
    if query.dim() == 3:
        if key.shape[0] != query.shape[0]:
            return "3-d key/value of another batch than the query's"
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
    b, n, sq, d = query.shape
    if key.shape != value.shape or key.shape[0] != b or key.shape[3] != d:
        return "key/value shapes other than [B, N_kv, S_kv, D] with the query's B and D"
    if key.shape[1] != n and not (enable_gqa and n % key.shape[1] == 0):
        return "key/value heads differ from the query's without enable_gqa"
    if query.numel() == 0 or key.numel() == 0:
        return "empty tensors"
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            return "a float (additive) attn_mask"
        if is_causal:
            return "attn_mask together with is_causal"
        if not _mask_broadcasts(attn_mask, b, n, sq, key.shape[2]):
            return "an attn_mask that does not broadcast to [B, N, L, S]"
    return None


def _choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    reason = _why_math(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    _count(reason)
    return _MATH if reason else _OVERRIDEABLE


def _bool_mask(attn_bias, b, n, sq, skv):
    """SDPA's additive mask (0 / -inf, converted from the boolean one the
    choice saw) as torch_npu's boolean mask, True = masked out, in a shape
    the kernel takes: [B or 1, N or 1, Sq, Skv]."""
    if attn_bias is None or attn_bias.numel() == 0:  # None, or an empty placeholder
        return None
    m = attn_bias == float("-inf")
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if tuple(m.shape[2:]) != (sq, skv):
        m = m.expand(m.shape[0], m.shape[1], sq, skv)
    return m.contiguous()


def _scale(query, scale):
    return scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])


def _as_4d(query, key, value, attn_bias):
    """3-d (B, S, D) inputs as BNSD with one head (a 3-d mask [B, L, S] as [B, 1, L, S])."""
    if query.dim() == 4:
        return query, key, value, attn_bias
    if attn_bias is not None and attn_bias.dim() == 3:
        attn_bias = attn_bias.unsqueeze(1)
    return query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1), attn_bias


# Note [SDPA passes BSND views as they are]
# Models build q, k and v as x.view(B, S, N, D).transpose(1, 2): BNSD-shaped
# views of BSND-contiguous tensors, which the plugin's BNSD form (contiguous
# only) took through three staged copies, and whose output the model then
# transposes back with .contiguous(), a fourth copy. When the query is such a
# view, the call uses the plugin's BSND layout instead: the operands go as
# they lie (a tensor laid out otherwise is copied into BSND), and the output
# and gradients come back as BNSD-shaped views of BSND tensors, as PyTorch's
# CPU flash attention returns them. The statistics are [B, N, S, 8] in both.
def _bsnd_view(t):
    return t.dim() == 4 and t.transpose(1, 2).is_contiguous()


def _layout(query):
    return "BSND" if _bsnd_view(query) and not query.is_contiguous() else "BNSD"


def _to_layout(t, layout):
    """t (BNSD-shaped) as the plugin's operand in `layout`."""
    if layout == "BNSD":
        return t.contiguous()
    return t.transpose(1, 2).contiguous()


def _from_layout(t, layout):
    return t if layout == "BNSD" else t.transpose(1, 2)


def _forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
             scale=None):
    three = query.dim() == 3
    query, key, value, attn_bias = _as_4d(query, key, value, attn_bias)
    b, n, sq, _ = query.shape
    skv = key.shape[2]
    mask = _bool_mask(attn_bias, b, n, sq, skv)
    layout = _layout(query)  # Note [SDPA passes BSND views as they are]
    out, smax, ssum, _ = torch.ops.mindspeed_like.npu_fusion_attention(
        _to_layout(query, layout), _to_layout(key, layout), _to_layout(value, layout), n, layout, None, None, mask,
        _scale(query, scale), 1.0, _NO_BAND, _NO_BAND, 0, None, None, None, 2 if is_causal else 0)
    out = _from_layout(out, layout)
    # logsumexp = max + log(sum) per row, as PyTorch's fused backends return
    # it (-inf for a row that sees no key). The backward gets the statistics
    # themselves, in the slots of the cumulative sequence lengths (which
    # only nested tensors use, and which only this backward reads): a
    # rounded logsumexp of a row of large scores would perturb every P of
    # the row by up to |lse| * 2^-24.
    lse = smax[..., 0] + torch.log(ssum[..., 0])
    empty = torch.empty(0, device=query.device)
    if three:
        out, lse = out.squeeze(1), lse.squeeze(1)
    return out, lse, smax, ssum, sq, skv, empty, empty, empty


def _backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
              max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    empty = torch.empty(0, dtype=query.dtype, device=query.device)
    if grad_out is None:  # the output did not reach the loss (autograd's undefined gradient)
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value), empty
    three = query.dim() == 3
    if three:
        grad_out, out, logsumexp = grad_out.unsqueeze(1), out.unsqueeze(1), logsumexp.unsqueeze(1)
    query, key, value, attn_bias = _as_4d(query, key, value, attn_bias)
    b, n, sq, _ = query.shape
    mask = _bool_mask(attn_bias, b, n, sq, key.shape[2])
    stats_shape = (b, n, sq, 8)
    if tuple(cum_seq_q.shape) == stats_shape and tuple(cum_seq_k.shape) == stats_shape:
        smax, ssum = cum_seq_q, cum_seq_k  # the forward's statistics (see _forward)
    else:
        # Only logsumexp: P = exp(S - lse) / 1, so (max, sum) = (lse, 1), and
        # (-inf, 0) for a row that sees no key.
        smax = logsumexp.unsqueeze(-1).expand(*logsumexp.shape, 8).contiguous()
        ssum = (logsumexp > float("-inf")).to(logsumexp.dtype).unsqueeze(-1).expand(*logsumexp.shape, 8).contiguous()
    layout = _layout(query)  # Note [SDPA passes BSND views as they are]
    dq, dk, dv, _ = torch.ops.mindspeed_like.npu_fusion_attention_grad(
        _to_layout(query, layout), _to_layout(key, layout), _to_layout(value, layout), _to_layout(grad_out, layout),
        n, layout, None, None, mask, smax, ssum, None, _to_layout(out, layout), _scale(query, scale), 1.0, _NO_BAND,
        _NO_BAND, 0, None, None, None, 2 if is_causal else 0)
    dq, dk, dv = _from_layout(dq, layout), _from_layout(dk, layout), _from_layout(dv, layout)
    if three:
        dq, dk, dv = dq.squeeze(1), dk.squeeze(1), dv.squeeze(1)
    return dq, dk, dv, empty


_lib = None


def install():
    """Registers the PrivateUse1 kernels (once)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_fused_sdp_choice", _choice, "PrivateUse1")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable", _forward, "PrivateUse1")
    _lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", _backward, "PrivateUse1")
