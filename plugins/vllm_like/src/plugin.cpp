// vllm_like: LLM serving ops (the role of vLLM's custom kernels: paged
// attention over a block-paged KV cache, the varlen flash attention of its
// V1 backend, the cache's reshape/copy/swap ops, and the fused layer ops a
// Llama decoder runs on).
// Built against the plugin C ABI only (and plugins/kernels, compiled in).
#include <plugin_kernels/gemm.h>
#include <plugin_kernels/isa.h>

#include "ops.h"

namespace {

void init(npub::sdk::Registrar& r) {
  plugin_kernels::gemm_pin_libraries();                         // first: see plugin_kernels/gemm.h
  plugin_kernels::configure_isa_from_environment("vllm_like");  // every family's loops read it
  vllm_like::register_activation(r);
  vllm_like::register_layernorm(r);
  vllm_like::register_rotary_embedding(r);
  vllm_like::register_cache_ops(r);
  vllm_like::register_paged_attention(r);
  vllm_like::register_flash_attention(r);
  vllm_like::register_slot_mapping(r);
}

}  // namespace

NPUB_DEFINE_PLUGIN(vllm_like, "0.1.0", init)
