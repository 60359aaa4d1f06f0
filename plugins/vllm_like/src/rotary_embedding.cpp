// vllm_like: rotary_embedding (NeoX and GPT-J styles, in place). (To be written: issue #16.)
#include "ops.h"

namespace vllm_like {

void register_rotary_embedding(npub::sdk::Registrar&) {}

}  // namespace vllm_like
