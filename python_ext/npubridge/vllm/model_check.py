"""Which transformers models the model runner computes correctly, checked up front.

The runner implements one architecture: Llama's (RMSNorm, rotary embedding of
the whole head, full causal attention with GQA, SwiGLU MLP, optional biases on
the q/k/v, o and MLP projections). Qwen2ForCausalLM and MistralForCausalLM are
that architecture whenever their config uses none of what they add (a sliding
window in effect); anything else would run and give wrong tokens, or fail deep
in the runner, so it is refused here with what was found and what is supported.
"""

__all__ = ["SUPPORTED_CLASSES", "check_model"]

SUPPORTED_CLASSES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
# Rope types whose frequencies are fixed (the runner reads the model's own
# inv_freq and attention_scaling once); dynamic / longrope rescale with the length.
_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _fail(where, what, expected, found):
    raise ValueError(f"{where}: {what} is not supported: the runner computes {expected}, found {found}")


def _rope_type(config):
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    return params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"


def _sliding_window(config):
    """A description of the sliding window in effect, or None."""
    types = getattr(config, "layer_types", None)
    if types is not None:  # transformers 5: per-layer attention types decide
        for i, t in enumerate(types):
            if t != "full_attention":
                return f"layer_types[{i}] = {t!r} (sliding_window={getattr(config, 'sliding_window', None)})"
        return None
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False or window is None:
        return None
    if window >= config.max_position_embeddings:  # never reached: full attention
        return None
    return f"sliding_window={window} (< max_position_embeddings {config.max_position_embeddings})"


def check_model(model, where="npubridge.vllm"):
    """Raise ValueError unless the runner computes ``model`` exactly as transformers does."""
    cls = type(model).__name__
    if cls not in SUPPORTED_CLASSES:
        raise ValueError(f"{where}: model class {cls} is not supported: expected a transformers "
                         f"{', '.join(SUPPORTED_CLASSES)} (a causal LM with its lm_head; Qwen2/Mistral only "
                         f"without a sliding window in effect)")
    config = model.config
    act = getattr(config, "hidden_act", None)
    if act != "silu":
        _fail(where, f"{cls} with hidden_act={act!r}", "hidden_act 'silu' (SwiGLU)", repr(act))
    rope = _rope_type(config)
    if rope not in _STATIC_ROPE_TYPES:
        _fail(where, f"rope type {rope!r}", f"rope types {_STATIC_ROPE_TYPES}", repr(rope))
    partial = getattr(config, "partial_rotary_factor", None) or (getattr(config, "rope_parameters", None)
                                                                 or {}).get("partial_rotary_factor")
    if partial not in (None, 1, 1.0):
        _fail(where, f"partial_rotary_factor={partial}", "rotary embedding of the whole head (1.0)", partial)
    window = _sliding_window(config)
    if window is not None:
        _fail(where, f"{cls} with a sliding window", "full causal attention", window)
    if getattr(config, "rms_norm_eps", None) is None:
        _fail(where, f"{cls} without rms_norm_eps", "RMSNorm (config.rms_norm_eps)", "none")
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = ((p.bias is not None) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        g, u = mlp.gate_proj.bias is not None, mlp.up_proj.bias is not None
        if not q == k == v or g != u:
            _fail(where, f"layer {i}'s projection biases", "q/k/v biases all or none, gate/up biases both or none",
                  f"q={q} k={k} v={v} gate={g} up={u}")
