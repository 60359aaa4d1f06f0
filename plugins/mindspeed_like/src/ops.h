// mindspeed_like's op families: each file defines its ops' schemas, kernels,
// meta functions and derivatives in one register_* function.
#pragma once

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like {

void register_rms_norm(npub::sdk::Registrar& r);    // npu_rms_norm, npu_add_rms_norm and backward
void register_adamw(npub::sdk::Registrar& r);       // npu_apply_adam_w
void register_fused_adam(npub::sdk::Registrar& r);  // aten::_fused_adam_, aten::_fused_adamw_
void register_swiglu(npub::sdk::Registrar& r);      // npu_swiglu and backward
void register_rotary(npub::sdk::Registrar& r);  // npu_rotary_mul, npu_rotary_position_embedding, backwards
void register_matmul_add(npub::sdk::Registrar& r);       // npu_matmul_add_fp32
void register_attention(npub::sdk::Registrar& r);        // npu_fusion_attention and its grad
void register_fusion_patterns(npub::sdk::Registrar& r);  // ABI 1.5 fusion patterns (fusion_patterns.cpp)

}  // namespace mindspeed_like
