// The inner loops of flash_attn_varlen (flash_attention_tile.cpp): one
// tile, (sequence, KV head, consecutive query tokens), against the keys and
// values its rows see, read through the block table. flash_attention.cpp
// checks the arguments, makes the tiles and spreads them over the threads.
// Note [Flash attention over the paged cache: tiles and the causal offset]
// (flash_attention.cpp) says how.
#pragma once

#include <npubridge/plugin_sdk.hpp>

#include <algorithm>
#include <cstdint>

namespace vllm_like {

constexpr int64_t kFlashTileRows = 128;      // rows per tile (more only when one token's group has more)
constexpr int64_t kFlashMaxTileTokens = 64;  // query tokens per tile
constexpr int64_t kFlashDirectRows = 8;      // rows per KV head up to which a tile skips the GEMM

// The call's tensors (strides in elements, any of them) and constants,
// checked by flash_attention.cpp before a tile runs.
struct FlashView {
  DLDataType dtype{};
  const void* query = nullptr;      // [num_tokens, num_heads, head_size]
  void* out = nullptr;              // query's shape
  const void* key_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_size]
  const void* value_cache = nullptr;
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t q_stride[3] = {}, out_stride[3] = {}, k_stride[4] = {}, v_stride[4] = {}, table_stride[2] = {};
  int64_t group = 1;  // query heads per KV head
  int64_t head_size = 0, block_size = 0;
  int64_t tile_tokens = 1;   // query tokens per tile, at most
  int64_t direct_heads = 1;  // KV heads per direct tile, at most
  float scale = 1, softcap = 0;
  bool causal = false;
  int64_t window_left = -1;
};

// One work item: tokens i0 .. i0 + tokens of sequence seq (of q_len query
// tokens and kv_len cached ones), whose first query row is row0, for KV
// heads kv_head .. kv_head + kv_heads (one, unless the tile is direct).
struct FlashTile {
  int64_t seq, kv_head, kv_heads, row0, i0, tokens, q_len, kv_len, cost;
};

// Whether a tile of `tokens` tokens computes its products in its own loops
// rather than on the GEMM (flash_attention_tile.cpp): a few rows per KV head,
// a decode step's.
inline bool flash_tile_is_direct(const FlashView& v, int64_t tokens) {
  return tokens * v.group <= kFlashDirectRows;
}

// Keys [lo, hi) that query i (0-based in its sequence) sees: the causal
// offset and the window of the Note.
inline void flash_key_range(const FlashView& v, int64_t i, int64_t q_len, int64_t kv_len, int64_t& lo,
                            int64_t& hi) {
  const int64_t p = kv_len - q_len + i;
  hi = v.causal ? std::min(p + 1, kv_len) : kv_len;
  lo = v.window_left >= 0 && p > v.window_left ? p - v.window_left : 0;
  hi = std::max(hi, lo);
}

// Floats of scratch one thread needs to run any tile of the call.
int64_t flash_tile_scratch_floats(const FlashView& v);

// Computes the tile's rows of out (v's data pointers set).
void run_flash_tile(const FlashView& v, const FlashTile& t, float* scratch);

}  // namespace vllm_like
