"""The fused operators of the mindspeed_like plugin, as functions with
torch_npu's names, signatures and return values.

Each function is a thin call of ``torch.ops.mindspeed_like.<name>``: the
plugin's kernels do the work, and autograd comes from the derivative
formulas the plugin declares (npubridge._autograd), so the results backprop
on npu tensors like any other op. When the plugin is not loaded, the call
raises a RuntimeError that names the plugin, why it is missing and how to
load it, rather than an AttributeError from ``torch.ops``.
"""
import torch

__all__ = [
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_rotary_position_embedding", "npu_swiglu",
    "npu_fusion_attention", "npu_matmul_add_fp32", "npu_apply_adam_w", "has_op", "missing_reason",
]

PLUGIN = "mindspeed_like"
PLUGIN_LIBRARY = "libnpub_mindspeed_like.so"

_resolved = {}


def missing_reason(name):
    """Why ``mindspeed_like::<name>`` cannot run on the npu, or None when it can."""
    import npubridge

    loaded = [p for p in npubridge.plugins() if p["name"] == PLUGIN]
    if _lookup(name) is not None:
        if loaded and not loaded[0]["enabled"]:
            return (f"the {PLUGIN} plugin is disabled (npubridge.disable_plugin); "
                    f"npubridge.enable_plugin('{PLUGIN}') enables it")
        if npubridge._C.optim_level() < 2:
            return (f"npubridge's optimisation level is {npubridge._C.optim_level()} and {PLUGIN}'s fused kernels "
                    f"need 2 (npubridge.set_optim_level(2), or NPUB_OPT_LEVEL=2)")
        return None
    if loaded:
        p = loaded[0]
        return f"the loaded {PLUGIN} plugin ({p['path']}, version {p['version']}) has no op {PLUGIN}::{name}"
    rejected = [f for f in npubridge.load_failures() if PLUGIN_LIBRARY in f]
    why = rejected[0] if rejected else f"{PLUGIN_LIBRARY} was not found in npubridge's plugin directory"
    return (f"the {PLUGIN} plugin is not loaded ({why}); it loads at the npu runtime's start (the first npu "
            f"use) from the plugin directory shipped with npubridge, or set NPUB_PLUGIN_PATH=/path/to/"
            f"{PLUGIN_LIBRARY} (a file or its directory) before the first npu use")


def has_op(name):
    """Whether ``torch.ops.mindspeed_like.<name>`` exists (the plugin is loaded and has it)."""
    return _lookup(name) is not None


def _lookup(name):
    op = _resolved.get(name)
    if op is None:
        try:
            torch.npu._lazy_init()  # the plugin ops exist from the runtime's start on
            op = getattr(getattr(torch.ops, PLUGIN), name).default
        except (AttributeError, RuntimeError):
            return None
        _resolved[name] = op
    return op


def _on_npu(name, **tensors):
    """A clear error for a CPU (or other device's) tensor, instead of
    PyTorch's "Could not run ... with arguments from the 'CPU' backend"."""
    for arg, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type != "npu":
            raise RuntimeError(f"npubridge.mindspeed.{name}: expected {arg} on the npu (mindspeed_like's kernels run "
                               f"there) but found a {t.device.type} tensor; move it with .to('npu')")


def _op(name):
    op = _resolved.get(name) or _lookup(name)
    if op is None:
        raise RuntimeError(f"npubridge.mindspeed.{name}: {missing_reason(name)}")
    return op


def npu_rms_norm(input, gamma, epsilon=1e-06):
    """RMSNorm over the trailing dims that ``gamma`` covers.

    ``y = input * rstd * gamma`` with ``rstd = (mean(input^2) + epsilon)^-1/2``
    per row. Returns ``(y, rstd)``: y in input's dtype, rstd in float32 with
    size 1 in the normalised dims (torch_npu.npu_rms_norm). ``gamma`` has
    input's dtype.
    """
    _on_npu("npu_rms_norm", input=input, gamma=gamma)
    return _op("npu_rms_norm")(input, gamma, epsilon)


def npu_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    """RMSNorm of ``x1 + x2``, the residual add fused into the norm.

    Returns ``(y, rstd, x)`` where ``x = x1 + x2`` (the new residual), ``y`` is
    its RMSNorm times gamma and rstd is float32 (torch_npu.npu_add_rms_norm).
    """
    _on_npu("npu_add_rms_norm", x1=x1, x2=x2, gamma=gamma)
    return _op("npu_add_rms_norm")(x1, x2, gamma, epsilon)


def npu_rotary_mul(input, r1, r2, rotary_mode="half"):
    """Rotary embedding ``input * r1 + rotate(input) * r2`` (torch_npu.npu_rotary_mul).

    ``r1`` is cos and ``r2`` sin, broadcast to input. ``rotary_mode`` is
    ``'half'`` (NeoX: rotate-half, ``cat(-x2, x1)``) or ``'interleave'``
    (GPT-J: pairs ``(x0, x1) -> (-x1, x0)``).
    """
    _on_npu("npu_rotary_mul", input=input, r1=r1, r2=r2)
    return _op("npu_rotary_mul")(input, r1, r2, rotary_mode)


def npu_rotary_position_embedding(x, cos, sin, mode=0):
    """MindSpeed's rotary position embedding ``x * cos + rotate(x) * sin``.

    ``mode`` 0 is rotate-half (NeoX, Llama), 1 interleaved (GPT-J); cos and
    sin broadcast to x.
    """
    _on_npu("npu_rotary_position_embedding", x=x, cos=cos, sin=sin)
    return _op("npu_rotary_position_embedding")(x, cos, sin, mode)


def npu_swiglu(input, dim=-1):
    """SwiGLU: ``a, b = input.chunk(2, dim)``; returns ``silu(a) * b`` (torch_npu.npu_swiglu)."""
    _on_npu("npu_swiglu", input=input)
    return _op("npu_swiglu")(input, dim)


def npu_fusion_attention(query, key, value, head_num, input_layout, *, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0):
    """Flash attention (torch_npu.npu_fusion_attention): online softmax in
    tiles, never the S x S scores.

    ``input_layout`` is ``'BSND'``, ``'BNSD'``, ``'BSH'``, ``'SBH'`` or
    ``'TND'`` (variable length: ``actual_seq_qlen`` / ``actual_seq_kvlen``
    are cumulative lengths). ``atten_mask`` is boolean, True where a score is
    masked out. ``head_num`` is the number of query heads; key and value may
    have fewer (grouped-query attention). Returns ``(attention_out,
    softmax_max, softmax_sum, softmax_out)``; torch_npu's three trailing
    dropout values (seed, offset, numels) are not returned, so
    ``npu_fusion_attention(...)[0]`` reads the same as with torch_npu.
    """
    _on_npu("npu_fusion_attention", query=query, key=key, value=value, atten_mask=atten_mask)
    return _op("npu_fusion_attention")(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale,
                                       keep_prob, pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen,
                                       actual_seq_kvlen, sparse_mode)


def npu_matmul_add_fp32(x, weight, C):
    """``C += x^T @ weight`` in float32, in place (gradient accumulation into a
    float32 main_grad, torch_npu.npu_matmul_add_fp32).

    ``x`` is [k, m], ``weight`` [k, n] (float32, float16 or bfloat16), ``C``
    [m, n] float32. Returns None.
    """
    _on_npu("npu_matmul_add_fp32", x=x, weight=weight, C=C)
    _op("npu_matmul_add_fp32")(x, weight, C)


def npu_apply_adam_w(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                     amsgrad, maximize):
    """One AdamW step in place over lists of tensors (all at the same step),
    torch.optim.AdamW's math. ``max_exp_avg_sqs`` is empty unless amsgrad.
    FusedAdamW (npubridge.mindspeed.optim) is the optimizer built on it."""
    _op("npu_apply_adam_w")(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, step, lr, beta1, beta2, eps,
                            weight_decay, amsgrad, maximize)
