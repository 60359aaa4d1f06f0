// vllm_like: the KV cache's reshape_and_cache(_flash), copy_blocks and swap_blocks. (To be written: issue
// #16.)
#include "ops.h"

namespace vllm_like {

void register_cache_ops(npub::sdk::Registrar&) {}

}  // namespace vllm_like
