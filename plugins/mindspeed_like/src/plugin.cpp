// mindspeed_like: fused training ops (the role of MindSpeed's fused kernels).
// Built against the plugin C ABI only (and plugins/kernels' GEMM, compiled in).
#include <plugin_kernels/gemm.h>
#include <plugin_kernels/isa.h>

#include "ops.h"

namespace {

void init(npub::sdk::Registrar& r) {
  plugin_kernels::gemm_pin_libraries();  // first: see plugin_kernels/gemm.h
  plugin_kernels::configure_isa_from_environment("mindspeed_like");
  mindspeed_like::register_rms_norm(r);
  mindspeed_like::register_adamw(r);
  mindspeed_like::register_fused_adam(r);
  mindspeed_like::register_swiglu(r);
  mindspeed_like::register_rotary(r);
  mindspeed_like::register_matmul_add(r);
  mindspeed_like::register_attention(r);
  mindspeed_like::register_fusion_patterns(r);  // last: the patterns name the ops above
}

}  // namespace

NPUB_DEFINE_PLUGIN(mindspeed_like, "0.1.0", init)
