// The inner loops of paged attention (paged_attention_rows.cpp): one KV
// head's query heads (a GQA group) over a range of one sequence's tokens,
// read block by block through the block table. v1 runs it over the whole
// sequence, v2 over each 512-token partition.
#pragma once

#include <npubridge/plugin_sdk.hpp>

#include <cstdint>

namespace vllm_like {

// The call's paged caches and the attention's constants, checked by
// paged_attention.cpp before any range runs.
struct PagedView {
  DLDataType dtype{};
  const void* key_cache = nullptr;    // [num_blocks, num_kv_heads, head_size/x, block_size, x]
  const void* value_cache = nullptr;  // [num_blocks, num_kv_heads, head_size, block_size]
  int64_t num_kv_heads = 0, head_size = 0, block_size = 0, x = 0;
  int64_t group = 1;                      // query heads per KV head
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks]
  int64_t max_blocks = 0;
  float scale = 1;
  const float* alibi_slopes = nullptr;  // [num_heads] or null
};

// One range's softmax statistics and unnormalised output, per query head g
// of the group: max[g] = max_t s_t, sum[g] = sum_t exp(s_t - max[g]),
// acc[g * head_size + d] = sum_t exp(s_t - max[g]) v_t[d], with
// s_t = scale q.k_t + alibi_slope (t - (seq_len - 1)). An empty range gives
// max -inf, sum 0, acc 0.
struct RangeStats {
  float* max;
  float* sum;
  float* acc;
};

// Floats of scratch attend_range needs for a range of `tokens` tokens.
int64_t attend_scratch_floats(const PagedView& v, int64_t tokens);

// The group of KV head `kv_head` of sequence `seq` (its query heads' rows
// `q`, [group, head_size] of v.dtype) over tokens [t0, t1) of a sequence
// of seq_len tokens. `scratch` holds attend_scratch_floats(v, t1 - t0).
void attend_range(const PagedView& v, const void* q, int64_t seq, int64_t kv_head, int64_t seq_len,
                  int64_t t0, int64_t t1, const RangeStats& out, float* scratch);

}  // namespace vllm_like
