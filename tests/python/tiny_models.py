"""The tiny Hugging Face models the tests build (random weights, nothing
downloaded): one set of sizes, which each test adjusts with its own
overrides, and the copies a model is judged with on npu.

    from tiny_models import llama_config
    model = transformers.LlamaForCausalLM(llama_config(attn_implementation="sdpa"))

A helper module, not conftest.py: tests/python/graph has a conftest of its
own, and `from conftest import ...` takes whichever pytest imported last."""
import copy

import torch

# A 2-layer Llama of hidden size 64 with 4 attention heads over 2 KV heads,
# a 128-word vocabulary and 64 positions; Mixtral and Qwen2 take the same keys.
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def tiny_config(config_class, **overrides):
    """`config_class` (transformers.MixtralConfig, Qwen2Config, ...) of TINY's
    sizes with `overrides`."""
    return config_class(**{**TINY, **overrides})


def llama_config(**overrides):
    """transformers.LlamaConfig of TINY's sizes with `overrides`."""
    import transformers

    return tiny_config(transformers.LlamaConfig, **overrides)


def models_to_judge(cpu, npu, ids_shape):
    """(cpu, npu, wide, ids) for a model judged on npu against the CPU: `npu`,
    another instance of cpu's architecture, takes cpu's weights and moves to
    the npu; `wide` is cpu in float64 (the reference); `ids` are random
    token ids of `ids_shape` on the CPU."""
    npu.load_state_dict(cpu.state_dict())
    wide = copy.deepcopy(cpu).double()
    return cpu, npu.to("npu"), wide, torch.randint(0, cpu.config.vocab_size, ids_shape)
