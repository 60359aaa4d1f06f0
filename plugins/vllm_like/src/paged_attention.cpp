// vllm_like: paged_attention_v1 and paged_attention_v2. (To be written: issue #16.)
#include "ops.h"

namespace vllm_like {

void register_paged_attention(npub::sdk::Registrar&) {}

}  // namespace vllm_like
