// flash_attn_varlen's tile loops (flash_attention_tile.h), after Note [Flash
// attention over the paged cache: tiles and the causal offset]
// (flash_attention.cpp).
//
// A tile of many rows (a prefill's) computes its scores and outputs with the
// GEMM, on keys and values gathered as float rows; a tile of a few rows (a
// decode step: one token, the group's heads) would spend its time in the
// GEMM's call overhead and the gather copy, so it computes its dot products
// and output rows itself, from the cache rows in place (float32) or
// converted one at a time, keeping the chunked online softmax. Both read a
// sequence's next chunk of keys and values ahead (prefetch), as a block
// table scatters its blocks where the hardware prefetcher cannot follow.
//
// The loops are written once (always-inline templates) and compiled three
// times: AVX-512, AVX2 (with F16C for float16) and baseline x86-64, chosen
// by the plugin's level (Note [One ISA layer for the in-tree plugins],
// plugin_kernels/isa.h).
#include "flash_attention_tile.h"

#include "loops.h"

#include <plugin_kernels/gemm.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace vllm_like {

namespace {

using plugin_kernels::BF16;
using plugin_kernels::F16;
using plugin_kernels::F32;

constexpr int64_t kChunk = 128;       // keys per chunk
constexpr int64_t kWidthStep = 32;    // a GEMM chunk's width is padded to a multiple of it
constexpr int64_t kAlignFloats = 16;  // scratch arrays start on 64 bytes

int64_t round_up(int64_t x, int64_t step) { return (x + step - 1) / step * step; }

// The row count a tile's products run with: the next power of two, so that
// the GEMM meets few shapes (oneDNN creates a primitive per shape).
int64_t padded(int64_t rows) {
  int64_t p = 1;
  while (p < rows) p *= 2;
  return p;
}

// The most rows a tile of the call has: a GEMM tile's padded rows, or a
// direct tile's.
int64_t max_rows(const FlashView& v) {
  return std::max(padded(v.tile_tokens * v.group), v.direct_heads * kFlashDirectRows);
}

// One thread's scratch: Q and O (rows x head_size), a chunk's scores
// (rows x kChunk), its keys and values (kChunk x head_size), and each row's
// running max and sum.
struct Scratch {
  float *q, *o, *s, *k, *v, *m, *l;
};

Scratch scratch_at(const FlashView& v, float* base) {
  const int64_t M = max_rows(v), D = v.head_size;
  Scratch s;
  s.q = base;
  s.o = s.q + round_up(M * D, kAlignFloats);
  s.s = s.o + round_up(M * D, kAlignFloats);
  s.k = s.s + round_up(M * kChunk, kAlignFloats);
  s.v = s.k + round_up(kChunk * D, kAlignFloats);
  s.m = s.v + round_up(kChunk * D, kAlignFloats);
  s.l = s.m + round_up(M, kAlignFloats);
  return s;
}

// dst[d] = scale * src[d * stride], d < D, in float.
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE void load_row(const typename S::E* src, int64_t stride, int64_t D, float scale,
                                    float* dst) {
  if (stride != 1) {
    for (int64_t d = 0; d < D; ++d) dst[d] = scale * S::load(src[d * stride]);
    return;
  }
  if constexpr (std::is_same_v<S, F16> && kIsa >= Isa::kAvx2) {
    plugin_kernels::f16_to_f32_f16c(src, dst, D);
    if (scale != 1.0f)
      for (int64_t d = 0; d < D; ++d) dst[d] *= scale;
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = scale * S::load(src[d]);
  }
}

// Calls f(j, row) for tokens k0 + j, j < n, of KV head kvh of a sequence
// (its block-table row `table`), `row` pointing at the token's head_size
// elements in a cache of strides st: one division per block, not per token.
template <typename E, typename F>
PLUGIN_KERNELS_INLINE void for_each_row(const FlashView& v, const E* cache, const int64_t* st,
                                        const int32_t* table, int64_t kvh, int64_t k0, int64_t n, F&& f) {
  const int64_t B = v.block_size;
  for (int64_t t = k0; t < k0 + n;) {
    const int64_t off = t % B, run = std::min(B - off, k0 + n - t);
    const E* src = cache + table[(t / B) * v.table_stride[1]] * st[0] + off * st[1] + kvh * st[2];
    for (int64_t j = 0; j < run; ++j) f(t - k0 + j, src + j * st[1]);
    t += run;
  }
}

// Starts loading the cache rows of tokens [k0, k0 + n) (the next chunk's,
// while this chunk is computed).
template <typename E>
PLUGIN_KERNELS_INLINE void prefetch_rows(const FlashView& v, const E* cache, const int64_t* st,
                                         const int32_t* table, int64_t kvh, int64_t k0, int64_t n) {
  const int64_t bytes = (v.head_size - 1) * st[3] * static_cast<int64_t>(sizeof(E)) + 1;
  for_each_row(v, cache, st, table, kvh, k0, n, [&](int64_t, const E* row) {
    for (int64_t off = 0; off < bytes; off += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(row) + off, 0, 2);
  });
}

// A cache row as floats: in place (float32, dense), else converted into buf.
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE const float* float_row(const typename S::E* row, int64_t stride, int64_t D,
                                             float* buf) {
  if constexpr (std::is_same_v<S, F32>)
    if (stride == 1) return row;
  load_row<S, kIsa>(row, stride, D, 1.0f, buf);
  return buf;
}

// One row's scores of a chunk, s[0 .. width): the keys [a, e) it sees
// softcapped, into the row's running max m and sum l; leaves s = its
// softmax numerators exp(s - m) (0 outside [a, e)) and returns the factor
// the row's output so far must be scaled by.
PLUGIN_KERNELS_INLINE float online_softmax_row(float* s, int64_t a, int64_t e, int64_t width, float softcap,
                                               float& m, float& l) {
  if (a > 0) std::fill(s, s + a, 0.0f);
  if (e < width) std::fill(s + e, s + width, 0.0f);
  if (a >= e) return 1.0f;
  float* r = s + a;
  const int64_t n = e - a;
  float mx = -std::numeric_limits<float>::infinity();
  if (softcap > 0) {
    const float inv = 1.0f / softcap;
#pragma omp simd reduction(max : mx)
    for (int64_t c = 0; c < n; ++c) {
      const float x = softcap * plugin_kernels::fast_tanh(r[c] * inv);
      r[c] = x;
      mx = x > mx ? x : mx;
    }
  } else {
#pragma omp simd reduction(max : mx)
    for (int64_t c = 0; c < n; ++c) mx = r[c] > mx ? r[c] : mx;
  }
  const float mnew = std::max(m, mx);
  const float alpha = plugin_kernels::exp_nonpositive(m - mnew);  // 0 while m is -inf
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) {
    const float p = plugin_kernels::exp_nonpositive(r[c] - mnew);
    r[c] = p;
    sum += p;
  }
  l = l * alpha + sum;
  m = mnew;
  return alpha;
}

// Starts loading rows[j .. j + 4) of a prefetch list of n rows.
PLUGIN_KERNELS_INLINE void prefetch_four(const char* const* rows, int64_t n, int64_t j, int64_t bytes) {
  for (int64_t i = j; i < std::min<int64_t>(j + 4, n); ++i)
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(rows[i] + off, 0, 2);
}

// The rows the next chunk reads, to be prefetched while this one computes:
// a few at a time among the products, which keeps the memory busy without
// a burst that stalls them.
struct PrefetchList {
  const char* rows[kChunk];
  int64_t n = 0, bytes = 0;
};

// s[r * ld + j] = q_r . k_j for the rows q_r = q + r * D, r < rows, and the
// key rows k_j, j < n: four keys at a time (one load of q per four products),
// each product in 16 lanes added up as a tree.
PLUGIN_KERNELS_INLINE void direct_scores(const float* q, int64_t rows, const float* const* k, int64_t n,
                                         int64_t D, float* s, int64_t ld, const PrefetchList& next) {
  constexpr int kLanes = 16;
  const int64_t body = D / kLanes * kLanes;
  for (int64_t j = 0; j < n; j += 4) {
    prefetch_four(next.rows, next.n, j, next.bytes);
    const int64_t keys = std::min<int64_t>(4, n - j);
    const float* k0 = k[j];
    const float* k1 = k[j + (keys > 1 ? 1 : 0)];
    const float* k2 = k[j + (keys > 2 ? 2 : 0)];
    const float* k3 = k[j + (keys > 3 ? 3 : 0)];
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * D;
      float a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
      for (int64_t d = 0; d < body; d += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const float x = qr[d + l];
          a0[l] += x * k0[d + l];
          a1[l] += x * k1[d + l];
          a2[l] += x * k2[d + l];
          a3[l] += x * k3[d + l];
        }
      for (int64_t d = body; d < D; ++d) {
        a0[0] += qr[d] * k0[d];
        a1[0] += qr[d] * k1[d];
        a2[0] += qr[d] * k2[d];
        a3[0] += qr[d] * k3[d];
      }
      for (int w = kLanes / 2; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) {
          a0[l] += a0[l + w];
          a1[l] += a1[l + w];
          a2[l] += a2[l + w];
          a3[l] += a3[l + w];
        }
      const float sums[4] = {a0[0], a1[0], a2[0], a3[0]};
      for (int64_t i = 0; i < keys; ++i) s[r * ld + j + i] = sums[i];
    }
  }
}

// o_r += sum_j p[r * ld + j] v_j for the rows o_r = o + r * D, r < rows, and
// the value rows v_j, j < n: four values at a time (one load and store of
// o_r per four).
PLUGIN_KERNELS_INLINE void direct_values(const float* p, int64_t ld, int64_t rows, const float* const* v,
                                         int64_t n, int64_t D, float* o, const PrefetchList& next) {
  for (int64_t j = 0; j < n; j += 4) {
    prefetch_four(next.rows, next.n, j, next.bytes);
    const int64_t keys = std::min<int64_t>(4, n - j);
    const float* __restrict v0 = v[j];
    const float* __restrict v1 = v[j + (keys > 1 ? 1 : 0)];
    const float* __restrict v2 = v[j + (keys > 2 ? 2 : 0)];
    const float* __restrict v3 = v[j + (keys > 3 ? 3 : 0)];
    for (int64_t r = 0; r < rows; ++r) {
      const float* pr = p + r * ld + j;
      const float p0 = pr[0], p1 = keys > 1 ? pr[1] : 0.0f, p2 = keys > 2 ? pr[2] : 0.0f,
                  p3 = keys > 3 ? pr[3] : 0.0f;
      float* __restrict orow = o + r * D;
      for (int64_t d = 0; d < D; ++d) orow[d] += (p0 * v0[d] + p1 * v1[d]) + (p2 * v2[d] + p3 * v3[d]);
    }
  }
}

// What a tile's two kinds share: its rows' key ranges, Q, the online
// softmax of a chunk, and the output. Row r = (h * tokens + i) * group + g
// is query head g of the group of the tile's KV head h, at its token i.
struct TileRows {
  int64_t lo[kFlashMaxTileTokens], hi[kFlashMaxTileTokens];
  int64_t kmin, kmax;  // the union of [lo, hi)
  int64_t per_head;    // rows per KV head
};

// Key ranges, Q rows (scaled), and O, m, l reset, for `M` rows (those
// past the tile's are zero).
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE TileRows begin_tile(const FlashView& v, const FlashTile& t, const Scratch& sc,
                                          int64_t M) {
  using E = typename S::E;
  const int64_t G = v.group, D = v.head_size;
  TileRows tr;
  tr.per_head = t.tokens * G;
  tr.kmin = t.kv_len;
  tr.kmax = 0;
  for (int64_t i = 0; i < t.tokens; ++i) {
    flash_key_range(v, t.i0 + i, t.q_len, t.kv_len, tr.lo[i], tr.hi[i]);
    if (tr.lo[i] < tr.hi[i]) {
      tr.kmin = std::min(tr.kmin, tr.lo[i]);
      tr.kmax = std::max(tr.kmax, tr.hi[i]);
    }
  }
  const int64_t rows = t.kv_heads * tr.per_head;
  const E* q = static_cast<const E*>(v.query);
  for (int64_t h = 0; h < t.kv_heads; ++h)
    for (int64_t i = 0; i < t.tokens; ++i)
      for (int64_t g = 0; g < G; ++g)
        load_row<S, kIsa>(q + (t.row0 + i) * v.q_stride[0] + ((t.kv_head + h) * G + g) * v.q_stride[1],
                          v.q_stride[2], D, v.scale, sc.q + ((h * t.tokens + i) * G + g) * D);
  std::fill(sc.q + rows * D, sc.q + M * D, 0.0f);  // the padding rows: finite
  std::fill(sc.o, sc.o + M * D, 0.0f);
  std::fill(sc.m, sc.m + rows, -std::numeric_limits<float>::infinity());
  std::fill(sc.l, sc.l + rows, 0.0f);
  return tr;
}

// The online softmax of chunk [k0, k0 + n) (scores of width `width`) for
// every row, their outputs so far rescaled.
PLUGIN_KERNELS_INLINE void softmax_chunk(const FlashView& v, const FlashTile& t, const TileRows& tr,
                                         const Scratch& sc, int64_t k0, int64_t n, int64_t width) {
  const int64_t G = v.group, D = v.head_size;
  for (int64_t i = 0; i < t.tokens; ++i) {
    const int64_t a = std::clamp<int64_t>(tr.lo[i] - k0, 0, n), e = std::clamp<int64_t>(tr.hi[i] - k0, a, n);
    for (int64_t h = 0; h < t.kv_heads; ++h)
      for (int64_t r = (h * t.tokens + i) * G; r < (h * t.tokens + i + 1) * G; ++r) {
        const float alpha = online_softmax_row(sc.s + r * kChunk, a, e, width, v.softcap, sc.m[r], sc.l[r]);
        if (alpha != 1.0f)
          for (int64_t d = 0; d < D; ++d) sc.o[r * D + d] *= alpha;
      }
  }
}

// out = O / l for the tile's rows (0 for a row that sees no key).
template <typename S>
PLUGIN_KERNELS_INLINE void end_tile(const FlashView& v, const FlashTile& t, const Scratch& sc) {
  using E = typename S::E;
  const int64_t G = v.group, D = v.head_size, os = v.out_stride[2];
  E* out = static_cast<E*>(v.out);
  for (int64_t h = 0; h < t.kv_heads; ++h)
    for (int64_t i = 0; i < t.tokens; ++i)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = (h * t.tokens + i) * G + g;
        const float inv = sc.l[r] > 0 ? 1.0f / sc.l[r] : 0.0f;
        const float* src = sc.o + r * D;
        E* o = out + (t.row0 + i) * v.out_stride[0] + ((t.kv_head + h) * G + g) * v.out_stride[1];
        if (os == 1)
          for (int64_t d = 0; d < D; ++d) o[d] = S::store(src[d] * inv);
        else
          for (int64_t d = 0; d < D; ++d) o[d * os] = S::store(src[d] * inv);
      }
}

// A tile of many rows (one KV head): each chunk's keys and values gathered
// as float rows, both products on the GEMM.
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE void gemm_tile(const FlashView& v, const FlashTile& t, float* base) {
  using E = typename S::E;
  const int64_t D = v.head_size, M = padded(t.tokens * v.group);
  const Scratch sc = scratch_at(v, base);
  const TileRows tr = begin_tile<S, kIsa>(v, t, sc, M);
  const int32_t* table = v.block_table + t.seq * v.table_stride[0];
  const E* kcache = static_cast<const E*>(v.key_cache);
  const E* vcache = static_cast<const E*>(v.value_cache);
  const auto prefetch_chunk = [&](int64_t k0) {
    const int64_t n = std::min(kChunk, tr.kmax - k0);
    prefetch_rows(v, kcache, v.k_stride, table, t.kv_head, k0, n);
    prefetch_rows(v, vcache, v.v_stride, table, t.kv_head, k0, n);
  };
  if (tr.kmin < tr.kmax) prefetch_chunk(tr.kmin);
  for (int64_t k0 = tr.kmin; k0 < tr.kmax; k0 += kChunk) {
    const int64_t n = std::min(kChunk, tr.kmax - k0), width = round_up(n, kWidthStep);
    for_each_row(v, kcache, v.k_stride, table, t.kv_head, k0, n, [&](int64_t j, const E* row) {
      load_row<S, kIsa>(row, v.k_stride[3], D, 1.0f, sc.k + j * D);
    });
    for_each_row(v, vcache, v.v_stride, table, t.kv_head, k0, n, [&](int64_t j, const E* row) {
      load_row<S, kIsa>(row, v.v_stride[3], D, 1.0f, sc.v + j * D);
    });
    if (k0 + kChunk < tr.kmax) prefetch_chunk(k0 + kChunk);
    std::fill(sc.k + n * D, sc.k + width * D, 0.0f);  // the padding keys: finite, and masked
    std::fill(sc.v + n * D, sc.v + width * D, 0.0f);
    plugin_kernels::gemm(false, true, M, width, D, 1.0f, sc.q, D, sc.k, D, 0.0f, sc.s, kChunk);
    softmax_chunk(v, t, tr, sc, k0, n, width);
    plugin_kernels::gemm(false, false, M, D, width, 1.0f, sc.s, kChunk, sc.v, D, 1.0f, sc.o, D);
  }
  end_tile<S>(v, t, sc);
}

// A tile of a few rows per KV head (a decode step's), for one or more KV
// heads: the products in direct_scores and direct_values, on the cache rows
// in place (float32) or converted one by one. The chunk is taken head by
// head, each head's rows prefetching the next head's (after the last head,
// the first head's values, or the next chunk's keys): reading a block's
// tokens for every head before going on keeps the pages a chunk spans few,
// where a tile per head would walk the whole sequence once per head.
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE void direct_tile(const FlashView& v, const FlashTile& t, float* base) {
  using E = typename S::E;
  const int64_t D = v.head_size;
  const Scratch sc = scratch_at(v, base);
  const TileRows tr = begin_tile<S, kIsa>(v, t, sc, t.kv_heads * t.tokens * v.group);
  const int64_t P = tr.per_head;
  const int32_t* table = v.block_table + t.seq * v.table_stride[0];
  const E* kcache = static_cast<const E*>(v.key_cache);
  const E* vcache = static_cast<const E*>(v.value_cache);
  const float* rows[kChunk];
  PrefetchList next;
  // The rows of a head's keys (or values) in chunk [k0, k0 + kChunk), as a prefetch list.
  const auto list = [&](bool keys, int64_t head, int64_t k0) {
    next.n = k0 < tr.kmax ? std::min(kChunk, tr.kmax - k0) : 0;
    const int64_t* st = keys ? v.k_stride : v.v_stride;
    next.bytes = (D - 1) * st[3] * static_cast<int64_t>(sizeof(E)) + 1;
    for_each_row(v, keys ? kcache : vcache, st, table, t.kv_head + head, k0, next.n,
                 [&](int64_t j, const E* row) { next.rows[j] = reinterpret_cast<const char*>(row); });
  };
  if (tr.kmin < tr.kmax)
    prefetch_rows(v, kcache, v.k_stride, table, t.kv_head, tr.kmin, std::min(kChunk, tr.kmax - tr.kmin));
  for (int64_t k0 = tr.kmin; k0 < tr.kmax; k0 += kChunk) {
    const int64_t n = std::min(kChunk, tr.kmax - k0);
    for (int64_t h = 0; h < t.kv_heads; ++h) {
      for_each_row(v, kcache, v.k_stride, table, t.kv_head + h, k0, n, [&](int64_t j, const E* row) {
        rows[j] = float_row<S, kIsa>(row, v.k_stride[3], D, sc.k + j * D);
      });
      if (h + 1 < t.kv_heads)
        list(true, h + 1, k0);
      else
        list(false, 0, k0);
      direct_scores(sc.q + h * P * D, P, rows, n, D, sc.s + h * P * kChunk, kChunk, next);
    }
    softmax_chunk(v, t, tr, sc, k0, n, n);
    for (int64_t h = 0; h < t.kv_heads; ++h) {
      for_each_row(v, vcache, v.v_stride, table, t.kv_head + h, k0, n, [&](int64_t j, const E* row) {
        rows[j] = float_row<S, kIsa>(row, v.v_stride[3], D, sc.v + j * D);
      });
      if (h + 1 < t.kv_heads)
        list(false, h + 1, k0);
      else
        list(true, 0, k0 + kChunk);
      direct_values(sc.s + h * P * kChunk, kChunk, P, rows, n, D, sc.o + h * P * D, next);
    }
  }
  end_tile<S>(v, t, sc);
}

template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE void tile_impl(const FlashView& v, const FlashTile& t, float* base) {
  if (flash_tile_is_direct(v, t.tokens))
    direct_tile<S, kIsa>(v, t, base);
  else
    gemm_tile<S, kIsa>(v, t, base);
}

// A tile's loops, compiled per instruction set (a dtype branch each).
struct Tile {
  template <Isa kIsa>
  static PLUGIN_KERNELS_INLINE void run(const FlashView& v, const FlashTile& t, float* scratch) {
    if (npub::sdk::same_dtype(v.dtype, npub::sdk::kFloat32))
      tile_impl<F32, kIsa>(v, t, scratch);
    else if (npub::sdk::same_dtype(v.dtype, npub::sdk::kFloat16))
      tile_impl<F16, kIsa>(v, t, scratch);
    else
      tile_impl<BF16, kIsa>(v, t, scratch);
  }
};

}  // namespace

int64_t flash_tile_scratch_floats(const FlashView& v) {
  const int64_t M = max_rows(v), D = v.head_size;
  return 2 * round_up(M * D, kAlignFloats) + round_up(M * kChunk, kAlignFloats) +
         2 * round_up(kChunk * D, kAlignFloats) + 2 * round_up(M, kAlignFloats);
}

void run_flash_tile(const FlashView& v, const FlashTile& t, float* scratch) {
  run_at_kernel_isa<Tile>(v, t, scratch);
}

}  // namespace vllm_like
