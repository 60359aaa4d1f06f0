// vllm_like's op families: each file defines its ops' schemas and registers
// their kernels and meta functions.
#pragma once

#include <npubridge/plugin_sdk.hpp>

namespace vllm_like {

void register_activation(npub::sdk::Registrar& r);        // activation.cpp: silu/gelu_and_mul
void register_layernorm(npub::sdk::Registrar& r);         // layernorm.cpp: rms_norm, fused_add_rms_norm
void register_rotary_embedding(npub::sdk::Registrar& r);  // rotary_embedding.cpp
void register_cache_ops(
    npub::sdk::Registrar& r);  // cache_ops.cpp: reshape_and_cache(_flash), copy/swap_blocks
void register_paged_attention(npub::sdk::Registrar& r);  // paged_attention.cpp: v1 and v2
void register_flash_attention(npub::sdk::Registrar& r);  // flash_attention.cpp: flash_attn_varlen
void register_slot_mapping(npub::sdk::Registrar& r);     // slot_mapping.cpp: compute_slot_mapping

}  // namespace vllm_like
