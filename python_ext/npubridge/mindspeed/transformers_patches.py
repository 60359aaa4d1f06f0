"""The features patch() applies to Hugging Face transformers' Llama and Qwen2.

Written against what transformers 5.x really calls (modeling_llama.py,
modeling_qwen2.py): ``LlamaRMSNorm.forward`` / ``Qwen2RMSNorm.forward``,
the module-level ``apply_rotary_pos_emb`` each attention forward looks up
at call time, ``LlamaMLP.forward`` / ``Qwen2MLP.forward``
(``down(act(gate(x)) * up(x))``), and the attention function the model
fetches from ``ALL_ATTENTION_FUNCTIONS`` by ``config._attn_implementation``
("sdpa" by default).

Every patch is a wrapper (see patch.py) that keeps the original and calls
it for whatever the fused kernel does not take: CPU tensors, mixed dtypes,
partial rotary, non-SiLU activations, dropout, float masks. So patching
changes nothing for a model left on the CPU. transformers itself is only
imported when a patch is applied.
"""
import functools
import inspect

import torch

from . import functional
from .patch import Feature

_LLAMA = "transformers.models.llama.modeling_llama"
_QWEN2 = "transformers.models.qwen2.modeling_qwen2"
_ATTENTION_MAPPING = "transformers.modeling_utils.AttentionInterface._global_mapping"


def _on_npu(*tensors):
    return all(t.device.type == "npu" for t in tensors)


# rms_norm: y = weight * (x * rstd), rstd = (mean(x^2) + eps)^-1/2 over the
# last dim. transformers rounds x * rstd to x's dtype before the product with
# weight; the fused kernel rounds once, which is at least as accurate.
def rms_norm_forward_wrapper(forward):

    @functools.wraps(forward)
    def rms_norm_forward(self, hidden_states):
        weight = self.weight
        if not _on_npu(hidden_states, weight) or weight.dtype != hidden_states.dtype or weight.dim() != 1:
            return forward(self, hidden_states)
        return functional.npu_rms_norm(hidden_states, weight, self.variance_epsilon)[0]

    return rms_norm_forward


# rotary: q * cos + rotate_half(q) * sin (and k), cos/sin [batch, seq, dim]
# unsqueezed at unsqueeze_dim; the NeoX (rotate-half) mode of the kernel.
def apply_rotary_pos_emb_wrapper(apply_rotary_pos_emb):
    signature = inspect.signature(apply_rotary_pos_emb)

    @functools.wraps(apply_rotary_pos_emb)
    def fused_apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        try:
            bound = signature.bind(q, k, cos, sin, *args, **kwargs)
        except TypeError:
            return apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs)
        extra = set(bound.arguments) - {"q", "k", "cos", "sin", "unsqueeze_dim"}
        if (extra or not _on_npu(q, k, cos, sin) or not (q.dtype == k.dtype == cos.dtype == sin.dtype)
                or cos.shape[-1] != q.shape[-1] or k.shape[-1] != q.shape[-1]):
            return apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim = bound.arguments.get("unsqueeze_dim", 1)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return (functional.npu_rotary_position_embedding(q, cos, sin, 0),
                functional.npu_rotary_position_embedding(k, cos, sin, 0))

    return fused_apply_rotary_pos_emb


# swiglu: down(silu(gate(x)) * up(x)). gate and up become one GEMM against
# their concatenated weights (one pass over x, a GEMM twice as wide), whose
# output [.., 2 * intermediate] is exactly npu_swiglu's input; the weight
# concatenation is small next to the activations in training.
_SILU = ("silu", "swish")


def swiglu_mlp_forward_wrapper(forward):

    @functools.wraps(forward)
    def swiglu_mlp_forward(self, x):
        gate, up = getattr(self, "gate_proj", None), getattr(self, "up_proj", None)
        act = getattr(getattr(self, "config", None), "hidden_act", None)
        if (act not in _SILU or type(gate) is not torch.nn.Linear or type(up) is not torch.nn.Linear
                or not _on_npu(x, gate.weight, up.weight) or not (x.dtype == gate.weight.dtype == up.weight.dtype)
                or (gate.bias is None) != (up.bias is None)):
            return forward(self, x)
        weight = torch.cat([gate.weight, up.weight], 0)
        bias = None if gate.bias is None else torch.cat([gate.bias, up.bias], 0)
        return self.down_proj(functional.npu_swiglu(torch.nn.functional.linear(x, weight, bias), -1))

    return swiglu_mlp_forward


# flash_attention: transformers' sdpa path (query [B, Hq, S, D], key/value
# [B, Hkv, Skv, D], a boolean mask True = attend, or None with is_causal)
# on npu_fusion_attention in the BNSD layout, grouped-query heads native
# (no repeat_kv). The kernel's mask is True = masked out. Causal without a
# mask is sparse_mode 2 (leftUpCausal: query i sees keys j <= i, SDPA's
# is_causal alignment), so no S x S mask is built.
_LEFT_UP_CAUSAL = 2


def sdpa_attention_forward_wrapper(sdpa_attention_forward):

    @functools.wraps(sdpa_attention_forward)
    def fused_sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                                     is_causal=None, **kwargs):
        if (not _on_npu(query, key, value) or dropout != 0.0 or kwargs.get("position_bias") is not None
                or kwargs.get("softcap") is not None or kwargs.get("output_attentions", False)
                or not (query.dtype == key.dtype == value.dtype) or query.dim() != 4
                or key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]
                or query.shape[1] % key.shape[1] != 0 or (attention_mask is not None and
                                                          (attention_mask.dtype != torch.bool or attention_mask.dim() != 4
                                                           or attention_mask.shape[1] != 1))):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          is_causal=is_causal, **kwargs)
        sparse_mode, mask = 0, None
        if attention_mask is not None:
            mask = attention_mask.logical_not()
        elif (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and query.shape[2] > 1:
            sparse_mode = _LEFT_UP_CAUSAL
        scale = scaling if scaling is not None else query.shape[-1]**-0.5
        out = functional.npu_fusion_attention(query, key, value, query.shape[1], "BNSD", atten_mask=mask,
                                              scale=float(scale), sparse_mode=sparse_mode)[0]
        return out.transpose(1, 2).contiguous(), None

    return fused_sdpa_attention_forward


# add_rms_norm: the decoder layer's `residual + attention` and the
# post-attention RMSNorm of the sum are one npu_add_rms_norm, which also
# returns the sum (the MLP's residual). The layer's forward is rewritten as
# the same composition; a version whose forward takes other arguments keeps
# its own (decided when patched). The cache argument is `cache` in
# transformers 5.24 and `past_key_values` in 5.19 (the release vLLM 0.32
# takes); either is passed on under the layer's own name.
# post_attention_layernorm's own forward (and its hooks) is bypassed on this
# path.
_CACHE_NAMES = ("cache", "past_key_values")


def _decoder_args(cache_name):
    return ("self", "hidden_states", "attention_mask", "position_ids", cache_name, "use_cache", "position_embeddings")


def add_rms_norm_decoder_forward_wrapper(forward):
    signature = inspect.signature(forward)
    params = list(signature.parameters)
    cache_name = next((c for c in _CACHE_NAMES if tuple(params[:7]) == _decoder_args(c)), None)
    var_kw = next((n for n, p in signature.parameters.items() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    if cache_name is None or var_kw is None:
        return forward
    other_names = [c for c in _CACHE_NAMES if c != cache_name]

    @functools.wraps(forward)
    def add_rms_norm_decoder_forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        self, hidden_states, extra = a["self"], a["hidden_states"], a[var_kw]
        norm = getattr(self, "post_attention_layernorm", None)
        weight = getattr(norm, "weight", None)
        if (any(n in extra for n in other_names) or not type(norm).__name__.endswith("RMSNorm")
                or not hasattr(norm, "variance_epsilon") or not isinstance(weight, torch.Tensor)
                or not _on_npu(hidden_states, weight) or weight.dtype != hidden_states.dtype or weight.dim() != 1):
            return forward(*args, **kwargs)
        residual = hidden_states
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                 attention_mask=a["attention_mask"], position_ids=a["position_ids"],
                                 use_cache=a["use_cache"], position_embeddings=a["position_embeddings"],
                                 **{cache_name: a[cache_name]}, **extra)
        normed, _, residual = functional.npu_add_rms_norm(residual, attn, weight, norm.variance_epsilon)
        return residual + self.mlp(normed)

    return add_rms_norm_decoder_forward


FEATURES = [
    Feature("rms_norm", 1, "RMSNorm forward -> npu_rms_norm",
            [(f"{_LLAMA}.LlamaRMSNorm.forward", rms_norm_forward_wrapper),
             (f"{_QWEN2}.Qwen2RMSNorm.forward", rms_norm_forward_wrapper)], ops=["npu_rms_norm"]),
    Feature("rotary", 1, "apply_rotary_pos_emb -> npu_rotary_position_embedding (rotate-half)",
            [(f"{_LLAMA}.apply_rotary_pos_emb", apply_rotary_pos_emb_wrapper),
             (f"{_QWEN2}.apply_rotary_pos_emb", apply_rotary_pos_emb_wrapper)], ops=["npu_rotary_position_embedding"]),
    Feature("swiglu", 2, "MLP forward silu(gate(x)) * up(x) -> one gate_up GEMM + npu_swiglu (hidden_act silu)",
            [(f"{_LLAMA}.LlamaMLP.forward", swiglu_mlp_forward_wrapper),
             (f"{_QWEN2}.Qwen2MLP.forward", swiglu_mlp_forward_wrapper)], ops=["npu_swiglu"]),
    Feature("flash_attention", 2, "the 'sdpa' attention function -> npu_fusion_attention (BNSD, causal or bool mask)",
            [(f"{_ATTENTION_MAPPING}.sdpa", sdpa_attention_forward_wrapper)], ops=["npu_fusion_attention"]),
    Feature("add_rms_norm", 2, "decoder layer residual add + post-attention RMSNorm -> npu_add_rms_norm",
            [(f"{_LLAMA}.LlamaDecoderLayer.forward", add_rms_norm_decoder_forward_wrapper),
             (f"{_QWEN2}.Qwen2DecoderLayer.forward", add_rms_norm_decoder_forward_wrapper)], ops=["npu_add_rms_norm"]),
]
