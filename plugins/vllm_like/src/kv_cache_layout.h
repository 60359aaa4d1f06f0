// The paged KV cache's layouts, as vLLM's kernels index them, and the
// checks every op that reads or writes a cache shares (paged_attention.cpp,
// cache_ops.cpp): one place that says what a valid cache, kv_cache_dtype,
// block id or slot is, and one wording of the errors.
//
// vLLM's legacy layout (paged attention's):
//   key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]
//   value_cache [num_blocks, num_kv_heads, head_size, block_size]
// with x = 16 / element_size, so that a thread reads 16 bytes of one key at a
// time; and the flash layout (reshape_and_cache_flash's):
//   key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_size].
#pragma once

#include <npubridge/plugin_sdk.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace vllm_like {

struct KvCacheLayout {
  int64_t num_blocks = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  int64_t block_size = 0;
  int64_t x = 0;  // legacy layout only: elements per 16 bytes

  int64_t slots() const { return num_blocks * block_size; }
};

// x of the legacy key cache for a dtype of `element_bytes` bytes.
inline int64_t elements_per_16_bytes(int64_t element_bytes) { return 16 / element_bytes; }

// Checks key_cache (argument `key_index`) and value_cache (`value_index`)
// against the legacy layout: ranks, x = 16 / element_size, the two caches'
// agreement and dtype `dtype`. Metadata only (also the meta functions').
KvCacheLayout check_legacy_caches(const npub::sdk::Call& call, int32_t key_index, int32_t value_index,
                                  DLDataType dtype);

// The same for the flash layout.
KvCacheLayout check_flash_caches(const npub::sdk::Call& call, int32_t key_index, int32_t value_index,
                                 DLDataType dtype);

// kv_cache_dtype must be "auto" (the cache holds the model's dtype; fp8
// caches are refused by name) and k_scale, v_scale 1.0 (they scale fp8
// values only).
void check_kv_cache_dtype(const npub::sdk::Call& call, int32_t dtype_index, int32_t k_scale_index,
                          int32_t v_scale_index);

// A tensor argument's exact shape, int dtype etc., with the op's wording:
// "<name>: expected <what> but found <found>".
void expect_shape(const npub::sdk::Call& call, const npub::sdk::TensorRef& t, const char* name,
                  const std::vector<int64_t>& shape);
void expect_dtype(const npub::sdk::Call& call, const npub::sdk::TensorRef& t, const char* name,
                  DLDataType dtype);
void expect_dim(const npub::sdk::Call& call, const npub::sdk::TensorRef& t, const char* name, int32_t dim);

// A block id's range check (NPUB_ERR_INDEX): "<what> <id> is out of range
// for <num_blocks> cache blocks". `what()` names the id; it is called only
// on a failure, so that the check costs no string per block.
[[noreturn]] void fail_block_id(const npub::sdk::Call& call, int64_t id, int64_t num_blocks,
                                const std::string& what);
template <typename What>
inline void check_block_id(const npub::sdk::Call& call, int64_t id, int64_t num_blocks, What&& what) {
  if (id < 0 || id >= num_blocks) fail_block_id(call, id, num_blocks, what());
}

}  // namespace vllm_like
