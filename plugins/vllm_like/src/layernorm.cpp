// vllm_like: rms_norm and fused_add_rms_norm. (To be written: issue #16.)
#include "ops.h"

namespace vllm_like {

void register_layernorm(npub::sdk::Registrar&) {}

}  // namespace vllm_like
