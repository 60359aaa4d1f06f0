// vllm_like: flash_attn_varlen, the attention of vLLM's V1 FlashAttention
// backend (vllm_flash_attn's flash_attn_varlen_func with a block_table): in
// one call, a batch of sequences that each bring q_len new query tokens (a
// prefill, a chunk of one, a decode step, mixed freely) against the
// seqused_k tokens each has in the paged cache of the flash layout
// (kv_cache_layout.h), the new tokens' keys and values already written there
// by reshape_and_cache_flash. A tiled online softmax on the plugins' GEMM,
// as mindspeed_like's flash attention (attention.cpp) runs it.
//
// Note [Flash attention over the paged cache: tiles and the causal offset]
// A work item is a tile: (sequence, KV head, up to kFlashMaxTileTokens
// consecutive query tokens of the sequence). Its rows are the tile's tokens
// times the query heads of the KV head's GQA group (row = token * group +
// head, about kFlashTileRows of them), so each key and value a tile reads
// serves all its rows, and a decode step (one token) still takes its whole
// group in one pass over the cache. The rows are copied, scaled by
// softmax_scale, into float scratch. The keys they see go by in chunks of
// 128 tokens, read through the block table (token t at block
// block_table[s][t / block_size], offset t % block_size): per chunk
// S = Q K^T, softcap and mask, the online softmax (per row the running
// maximum m and sum l of exp(s - m); the row's output so far scaled by
// exp(m_old - m_new) when m grows), and O += P V; at the end O / l. No more
// than one chunk of scores is stored. A tile of many rows gathers the
// chunk's keys and values into float rows (half types converted) and runs
// both products on the GEMM, its row count and chunk width padded with zero
// rows and masked zero keys to a few sizes (oneDNN creates a primitive per
// shape); a tile of a few rows computes them in its own loops from the
// cache rows (flash_attention_tile.cpp). The tiles of a (sequence, KV head)
// run one after the other, costliest first, so that the keys they share are
// still in cache.
//
// The causal offset: a sequence's q_len new tokens are the last of its
// seqused_k cached ones, so its query i (0-based) is at position
// p = seqused_k - q_len + i and, causal, sees keys 0 .. p (flash-attn's
// bottom-right alignment: a prefill's last token and a decode step see
// every key, a chunk of a prefill its own prefix). Causal therefore needs
// q_len <= seqused_k. window_left = w >= 0 also drops keys before p - w
// (flash-attn's window_size (w, 0); not causal (w, -1): no right limit). A
// tile runs over the union of its rows' key ranges only: a causal tile reads
// no key past its last token's position, a windowed one none before its
// first token's window. A row that sees no key gets 0.
#include "flash_attention_tile.h"
#include "kv_cache_layout.h"
#include "ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

enum Arg : int32_t {
  kOut = 0,
  kQuery,
  kKeyCache,
  kValueCache,
  kCuSeqlensQ,
  kSequsedK,
  kMaxSeqlenQ,
  kMaxSeqlenK,
  kSoftmaxScale,
  kCausal,
  kBlockTable,
  kWindowLeft,
  kSoftcap,
};

struct FlashProblem {
  int64_t num_tokens = 0, num_heads = 0, num_seqs = 0, max_blocks = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  KvCacheLayout cache;
  FlashView view;
};

template <size_t N>
void copy_strides(const TensorRef& t, int64_t (&s)[N]) {
  for (size_t d = 0; d < N; ++d) s[d] = t.stride(static_cast<int32_t>(d));
}

// Everything the kernel indexes by that metadata decides; also the meta
// function (the op writes only out).
FlashProblem check_flash(const Call& call) {
  const TensorRef out = call.tensor(kOut), q = call.tensor(kQuery);
  FlashProblem p;
  expect_dim(call, q, "query", 3);
  expect_dtype(call, q, "query (out's dtype)", out.dtype());
  expect_shape(call, out, "out (query's shape)", q.sizes());
  p.num_tokens = q.size(0);
  p.num_heads = q.size(1);
  p.cache = check_flash_caches(call, kKeyCache, kValueCache, out.dtype());
  const std::string cache_shape = Call::shape_str(call.tensor(kKeyCache).sizes());
  if (p.cache.head_size != q.size(2))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "key_cache: expected head_size " + std::to_string(q.size(2)) +
                                             " (query's) but found " + std::to_string(p.cache.head_size) +
                                             " in shape " + cache_shape);
  if (p.cache.num_kv_heads <= 0 || p.num_heads % p.cache.num_kv_heads != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "key_cache: expected num_kv_heads a positive divisor of query's num_heads = " +
                  std::to_string(p.num_heads) + " but found " + std::to_string(p.cache.num_kv_heads) +
                  " in shape " + cache_shape);
  if (p.cache.block_size <= 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "key_cache: expected block_size >= 1 but found " +
                                             std::to_string(p.cache.block_size) + " in shape " + cache_shape);
  const TensorRef cu = call.tensor(kCuSeqlensQ), used = call.tensor(kSequsedK),
                  table = call.tensor(kBlockTable);
  expect_dtype(call, cu, "cu_seqlens_q", npub::sdk::kInt32);
  expect_dim(call, cu, "cu_seqlens_q", 1);
  if (cu.size(0) < 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "cu_seqlens_q: expected num_seqs + 1 >= 1 values but found shape " +
                                             Call::shape_str(cu.sizes()));
  p.num_seqs = cu.size(0) - 1;
  expect_dtype(call, used, "seqused_k", npub::sdk::kInt32);
  expect_shape(call, used, "seqused_k ([num_seqs], one fewer than cu_seqlens_q)", {p.num_seqs});
  expect_dtype(call, table, "block_table", npub::sdk::kInt32);
  expect_dim(call, table, "block_table", 2);
  if (table.size(0) != p.num_seqs)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "block_table: expected one row per sequence (" +
                                             std::to_string(p.num_seqs) + ") but found shape " +
                                             Call::shape_str(table.sizes()));
  p.max_blocks = table.size(1);
  p.max_seqlen_q = call.int_arg(kMaxSeqlenQ);
  p.max_seqlen_k = call.int_arg(kMaxSeqlenK);
  if (p.max_seqlen_q < 0 || p.max_seqlen_k < 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "max_seqlen_q, max_seqlen_k: expected >= 0 but found " +
                                             std::to_string(p.max_seqlen_q) + ", " +
                                             std::to_string(p.max_seqlen_k));
  const double scale = call.double_arg(kSoftmaxScale), softcap = call.double_arg(kSoftcap);
  if (!std::isfinite(scale))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "softmax_scale: expected a finite number but found " + std::to_string(scale));
  if (!(softcap >= 0) || !std::isfinite(softcap))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "softcap: expected 0 (off) or a positive finite number but found " + std::to_string(softcap));
  const int64_t window_left = call.int_arg(kWindowLeft);
  if (window_left < -1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "window_left: expected -1 (no window) or >= 0 but found " + std::to_string(window_left));

  FlashView& v = p.view;
  v.dtype = out.dtype();
  v.group = p.num_heads / p.cache.num_kv_heads;
  v.head_size = p.cache.head_size;
  v.block_size = p.cache.block_size;
  v.tile_tokens = std::clamp<int64_t>(kFlashTileRows / std::max<int64_t>(v.group, 1), 1, kFlashMaxTileTokens);
  v.scale = static_cast<float>(scale);
  v.softcap = static_cast<float>(softcap);
  v.causal = call.bool_arg(kCausal);
  v.window_left = window_left;
  copy_strides(q, v.q_stride);
  copy_strides(out, v.out_stride);
  copy_strides(call.tensor(kKeyCache), v.k_stride);
  copy_strides(call.tensor(kValueCache), v.v_stride);
  copy_strides(table, v.table_stride);
  return p;
}

// One sequence's query rows [row0, row0 + q_len) and its cached tokens.
struct SeqSpan {
  int64_t row0, q_len, kv_len;
};

// The data the kernel indexes by, checked before anything is read through
// it: cu_seqlens_q, seqused_k and the ids of the blocks each sequence uses.
std::vector<SeqSpan> check_sequences(const Call& call, const FlashProblem& p) {
  const TensorRef cu_t = call.tensor(kCuSeqlensQ), used_t = call.tensor(kSequsedK),
                  table_t = call.tensor(kBlockTable);
  const int32_t* cu = cu_t.data<int32_t>();
  const int32_t* used = used_t.data<int32_t>();
  const int32_t* table = table_t.data<int32_t>();
  const int64_t cs = cu_t.stride(0), us = used_t.stride(0);
  const int64_t B = p.cache.block_size, MB = p.max_blocks;
  const auto at = [](int64_t i) { return "cu_seqlens_q[" + std::to_string(i) + "]"; };
  if (cu[0] != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, at(0) + ": expected 0 but found " + std::to_string(cu[0]));
  std::vector<SeqSpan> seqs(static_cast<size_t>(p.num_seqs));
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t a = cu[s * cs], b = cu[(s + 1) * cs];
    if (b < a)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "cu_seqlens_q: expected non-decreasing values but found " +
                                               at(s + 1) + " = " + std::to_string(b) + " < " + at(s) + " = " +
                                               std::to_string(a));
    if (b > p.num_tokens)
      call.fail(NPUB_ERR_INDEX, at(s + 1) +
                                    ": expected at most num_tokens = " + std::to_string(p.num_tokens) +
                                    " (query's rows) but found " + std::to_string(b));
    const int64_t q_len = b - a, kv_len = used[s * us];
    if (q_len > p.max_seqlen_q)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "cu_seqlens_q: expected sequences of at most max_seqlen_q = " +
                                               std::to_string(p.max_seqlen_q) + " query tokens but found " +
                                               at(s + 1) + " - " + at(s) + " = " + std::to_string(q_len));
    // kv_len <= MB * B, without the product (which need not fit).
    if (kv_len < 0 || kv_len > p.max_seqlen_k || (kv_len + B - 1) / B > MB)
      call.fail(NPUB_ERR_INDEX, "seqused_k[" + std::to_string(s) +
                                    "]: expected 0 <= seqused_k <= min(max_blocks_per_seq * block_size = " +
                                    std::to_string(MB) + " * " + std::to_string(B) + ", max_seqlen_k = " +
                                    std::to_string(p.max_seqlen_k) + ") but found " + std::to_string(kv_len));
    if (p.view.causal && q_len > kv_len)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "seqused_k[" + std::to_string(s) + "]: expected at least the sequence's " +
                    std::to_string(q_len) +
                    " query tokens (causal: they are the last of its cached tokens) but found " +
                    std::to_string(kv_len));
    for (int64_t blk = 0; blk < (kv_len + B - 1) / B; ++blk)
      check_block_id(
          call, table[s * p.view.table_stride[0] + blk * p.view.table_stride[1]], p.cache.num_blocks,
          [&] { return "block_table[" + std::to_string(s) + "][" + std::to_string(blk) + "]: block id"; });
    seqs[static_cast<size_t>(s)] = {a, q_len, kv_len};
  }
  return seqs;
}

// How many KV heads a direct tile takes: all of them where there are enough
// tiles besides to keep the threads busy (about four per thread), fewer
// where there are not (one long sequence's decode step).
int64_t heads_per_direct_tile(const FlashProblem& p, const std::vector<SeqSpan>& seqs, int64_t threads) {
  const FlashView& v = p.view;
  int64_t positions = 0;  // (sequence, token range) of the direct tiles
  for (const SeqSpan& q : seqs)
    for (int64_t i0 = 0; i0 < q.q_len; i0 += v.tile_tokens)
      positions += flash_tile_is_direct(v, std::min(v.tile_tokens, q.q_len - i0)) ? 1 : 0;
  return std::clamp<int64_t>(p.cache.num_kv_heads * positions / (4 * threads), 1, p.cache.num_kv_heads);
}

// The tiles in the order the threads take them, by units costliest first: a
// (sequence, KV head) pair's GEMM tiles, themselves costliest first (the last
// query tokens, which see the most keys), so that the keys and values they
// share are read while still in cache; and each direct tile on its own. The
// cheapest tiles come last, where they even out the threads' ends.
std::vector<FlashTile> make_tiles(const FlashProblem& p, const std::vector<SeqSpan>& seqs) {
  const FlashView& v = p.view;
  const int64_t H = p.cache.num_kv_heads;
  struct Unit {
    int64_t cost;
    size_t begin, end;  // its tiles in `tiles`
  };
  std::vector<FlashTile> tiles;
  std::vector<Unit> units;
  const auto add = [&](Unit& u, int64_t s, int64_t h, int64_t heads, int64_t i0, int64_t tokens) {
    const SeqSpan& q = seqs[static_cast<size_t>(s)];
    int64_t lo0, hi0, lo1, hi1;
    flash_key_range(v, i0, q.q_len, q.kv_len, lo0, hi0);
    flash_key_range(v, i0 + tokens - 1, q.q_len, q.kv_len, lo1, hi1);
    // Keys times rows, plus the tile's fixed work (its rows' loads and stores).
    const int64_t cost = (std::max(hi0, hi1) - std::min(lo0, lo1) + 16) * tokens * v.group * heads;
    tiles.push_back({s, h, heads, q.row0 + i0, i0, tokens, q.q_len, q.kv_len, cost});
    u.cost += cost;
  };
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const SeqSpan& q = seqs[static_cast<size_t>(s)];
    if (q.q_len == 0) continue;
    for (int64_t h = 0; h < H; ++h) {
      Unit u{0, tiles.size(), 0};
      for (int64_t i0 = (q.q_len - 1) / v.tile_tokens * v.tile_tokens; i0 >= 0; i0 -= v.tile_tokens) {
        const int64_t tokens = std::min(v.tile_tokens, q.q_len - i0);
        if (!flash_tile_is_direct(v, tokens)) add(u, s, h, 1, i0, tokens);
      }
      u.end = tiles.size();
      if (u.end > u.begin) units.push_back(u);
    }
    for (int64_t i0 = 0; i0 < q.q_len; i0 += v.tile_tokens) {
      const int64_t tokens = std::min(v.tile_tokens, q.q_len - i0);
      if (!flash_tile_is_direct(v, tokens)) continue;
      for (int64_t h = 0; h < H; h += v.direct_heads) {
        Unit u{0, tiles.size(), 0};
        add(u, s, h, std::min(v.direct_heads, H - h), i0, tokens);
        u.end = tiles.size();
        units.push_back(u);
      }
    }
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.cost > b.cost; });
  std::vector<FlashTile> ordered;
  ordered.reserve(tiles.size());
  for (const Unit& u : units) ordered.insert(ordered.end(), tiles.begin() + u.begin, tiles.begin() + u.end);
  return ordered;
}

void flash_attn_varlen_meta(Call& call) { check_flash(call); }

void flash_attn_varlen(Call& call) {
  FlashProblem p = check_flash(call);
  const std::vector<SeqSpan> seqs = check_sequences(call, p);
  FlashView& v = p.view;
  v.query = call.tensor(kQuery).data<void>();
  v.out = call.tensor(kOut).data<void>();
  v.key_cache = call.tensor(kKeyCache).data<void>();
  v.value_cache = call.tensor(kValueCache).data<void>();
  v.block_table = call.tensor(kBlockTable).data<int32_t>();
  if (p.num_heads == 0) return;
  v.direct_heads = heads_per_direct_tile(p, seqs, call.num_threads());
  const std::vector<FlashTile> tiles = make_tiles(p, seqs);
  if (tiles.empty()) return;
  const int64_t workers = std::min<int64_t>(call.num_threads(), static_cast<int64_t>(tiles.size()));
  const int64_t per_slot = flash_tile_scratch_floats(v);
  float* scratch =
      static_cast<float*>(call.scratch(static_cast<uint64_t>(workers * per_slot) * sizeof(float)));
  std::atomic<size_t> next{0};
  call.parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot)
      for (size_t i = next++; i < tiles.size(); i = next++)
        run_flash_tile(v, tiles[i], scratch + slot * per_slot);
  });
}

}  // namespace

void register_flash_attention(npub::sdk::Registrar& r) {
  r.def(
      "vllm_like::flash_attn_varlen(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor cu_seqlens_q, Tensor seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
      "bool causal, Tensor block_table, int window_left, float softcap) -> ()");
  // Any strides (a query sliced from a fused qkv tensor): the kernel reads
  // every tensor through its strides. The other tensors' dtypes are checked
  // by the body, with its own messages.
  r.kernel("vllm_like::flash_attn_varlen", &flash_attn_varlen)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16})
      .any_dtype("query")
      .any_dtype("key_cache")
      .any_dtype("value_cache")
      .any_dtype("cu_seqlens_q")
      .any_dtype("seqused_k")
      .any_dtype("block_table")
      .opt_level(1);
  r.meta<&flash_attn_varlen_meta>("vllm_like::flash_attn_varlen");
}

}  // namespace vllm_like
