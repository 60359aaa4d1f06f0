// Paged attention's inner loops (paged_attention_rows.h).
//
// Note [Paged attention's loops]
// The legacy cache layout decides the loop shapes. A key block of one KV
// head is [head_size/x, block_size, x]: for each chunk c of x dimensions,
// block_size * x contiguous elements whose dimension repeats with period x.
// The scores are therefore accumulated lane-wise, acc[j*x + i] +=
// q[c*x + i] * K[c][j][i], against a 16-lane pattern of the query
// (q[c*x + l % x]; x divides 16), which is plain contiguous FMA work; the x
// lanes of a token are added up once per block. A value block is
// [head_size, block_size]: acc[d*B + j] += p[j] * V[d][j], contiguous again,
// and the block_size lanes of a dimension are added up once per range. The
// query heads of a GQA group share each block's K and V while it is in L1.
// Tokens of a block beyond the range (the tail of a sequence's last block,
// or of a partition) are never read as values: vLLM zeroes them for the same
// reason, a free slot's contents are arbitrary (NaN included).
//
// The loops are written once (always-inline templates) and compiled three
// times: AVX-512, AVX2 (with F16C for float16 caches) and baseline x86-64,
// chosen by the plugin's level (Note [One ISA layer for the in-tree
// plugins], plugin_kernels/isa.h).
#include "paged_attention_rows.h"

#include "loops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace vllm_like {

namespace {

using plugin_kernels::BF16;
using plugin_kernels::F16;
using plugin_kernels::F32;

constexpr int64_t kLanes = 16;       // the query pattern's width (x divides it)
constexpr int64_t kValueBlocks = 4;  // value blocks accumulated per pass
// How far ahead the key pass prefetches: enough blocks to cover the memory
// latency when a block's arithmetic is short (one query head, small heads).
constexpr int64_t kPrefetchBytes = 32768;

// How the loops read a cache block: bfloat16 and float32 as stored (a
// bfloat16 widens with a shift, in the loop); float16 through a converted
// float copy, since its conversion takes F16C instructions the baseline
// variant lacks.
template <typename S>
using ReadAs = std::conditional_t<std::is_same_v<S, BF16>, BF16, F32>;

// A block's n elements as the loops read them (ReadAs<S>): in place, or
// for float16 converted into `buf`.
template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE const typename ReadAs<S>::E* block_view(const typename S::E* src, float* buf,
                                                              int64_t n) {
  if constexpr (!std::is_same_v<S, F16>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    if constexpr (kIsa >= Isa::kAvx2)
      plugin_kernels::f16_to_f32_f16c(src, buf, n);
    else
      for (int64_t i = 0; i < n; ++i) buf[i] = S::load(src[i]);
    return buf;
  }
}

// a[j] += p[j] * v[j] over one dimension's row of a value block, j in
// [j0, j1); a compile-time block size for the common ones.
template <int64_t kB, typename R>
PLUGIN_KERNELS_INLINE void value_rows(float* __restrict a, const float* __restrict p,
                                      const typename R::E* __restrict v, int64_t D, int64_t B) {
  const int64_t b = kB > 0 ? kB : B;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < b; ++j) a[d * b + j] += p[j] * R::load(v[d * b + j]);
}

// Starts loading the next block of the range into the cache while this one
// is computed: a sequence's blocks are scattered over the cache, so the
// hardware prefetcher, which follows one address stream, stops at every
// block boundary, and the loops would wait for memory at the start of each.
template <typename E>
PLUGIN_KERNELS_INLINE void prefetch_block(const E* base, const int32_t* table, int64_t b, int64_t b1,
                                          int64_t stride, int64_t kvh, int64_t block_elems) {
  if (b >= b1) return;
  const char* p = reinterpret_cast<const char*>(base + (table[b] * stride + kvh) * block_elems);
  const int64_t bytes = block_elems * static_cast<int64_t>(sizeof(E));
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 2);
}

// a[m] = sum_c qp[c][m % 16] * kb[c * BX + m] over a key block (Note
// [Paged attention's loops]). With BX known at compile time the whole
// block's lanes stay in registers across the chunks, so each key element
// costs one load and one FMA; otherwise 16 lanes at a time.
template <int64_t kBX, typename R>
PLUGIN_KERNELS_INLINE void key_lanes(const float* __restrict qp, const typename R::E* __restrict kb,
                                     int64_t C, int64_t BX, float* __restrict a) {
  if constexpr (kBX > 0) {
    (void)BX;
    float acc[kBX] = {};
    for (int64_t c = 0; c < C; ++c) {
#pragma GCC unroll 16
      for (int64_t m = 0; m < kBX; m += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) acc[m + l] += qp[c * kLanes + l] * R::load(kb[c * kBX + m + l]);
    }
    for (int64_t m = 0; m < kBX; ++m) a[m] = acc[m];
  } else {
    int64_t m = 0;
    for (; m + kLanes <= BX; m += kLanes) {
      float lanes[kLanes] = {};
      for (int64_t c = 0; c < C; ++c)
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] += qp[c * kLanes + l] * R::load(kb[c * BX + m + l]);
      for (int64_t l = 0; l < kLanes; ++l) a[m + l] = lanes[l];
    }
    for (; m < BX; ++m) {
      float sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += qp[c * kLanes + m % kLanes] * R::load(kb[c * BX + m]);
      a[m] = sum;
    }
  }
}

// The value rows of four full blocks at once, a[d][j] += sum_i p_i[j] *
// v_i[d][j]: one load and store of the accumulator per four FMAs.
template <int64_t kB, typename R>
PLUGIN_KERNELS_INLINE void value_rows4(float* __restrict a, const float* __restrict p,
                                       const typename R::E* const* vs, int64_t D, int64_t B) {
  const int64_t b = kB > 0 ? kB : B;
  const typename R::E* __restrict v0 = vs[0];
  const typename R::E* __restrict v1 = vs[1];
  const typename R::E* __restrict v2 = vs[2];
  const typename R::E* __restrict v3 = vs[3];
  const float* p0 = p;
  const float* p1 = p + b;
  const float* p2 = p + 2 * b;
  const float* p3 = p + 3 * b;
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < b; ++j)
      a[d * b + j] += (p0[j] * R::load(v0[d * b + j]) + p1[j] * R::load(v1[d * b + j])) +
                      (p2[j] * R::load(v2[d * b + j]) + p3[j] * R::load(v3[d * b + j]));
}

// out[j] = the sum of token j's x lanes of a key block's accumulator, for
// its B tokens. With x known at compile time the sums run across tokens as
// vector adds (in an explicit order: nothing for the compiler to
// reassociate).
template <int64_t kX>
PLUGIN_KERNELS_INLINE void token_sums(const float* __restrict a, int64_t B, float* __restrict out,
                                      int64_t x = kX) {
  if constexpr (kX == 4) {
    (void)x;
    for (int64_t j = 0; j < B; ++j) out[j] = (a[4 * j] + a[4 * j + 1]) + (a[4 * j + 2] + a[4 * j + 3]);
  } else if constexpr (kX == 8) {
    (void)x;
    for (int64_t j = 0; j < B; ++j)
      out[j] = ((a[8 * j] + a[8 * j + 1]) + (a[8 * j + 2] + a[8 * j + 3])) +
               ((a[8 * j + 4] + a[8 * j + 5]) + (a[8 * j + 6] + a[8 * j + 7]));
  } else {
    for (int64_t j = 0; j < B; ++j) {
      float sum = 0;
      for (int64_t i = 0; i < x; ++i) sum += a[j * x + i];
      out[j] = sum;
    }
  }
}

// o[d] = sum_j a[d * B + j], the value accumulator's lanes of each
// dimension, by halving (vector adds for the first halves) for the
// compile-time block sizes. Overwrites a.
template <int64_t kB>
PLUGIN_KERNELS_INLINE void row_sums(float* __restrict a, int64_t D, float* __restrict o, int64_t B) {
  if constexpr (kB > 0) {
    (void)B;
    for (int64_t d = 0; d < D; ++d) {
      float* r = a + d * kB;
#pragma GCC unroll 8
      for (int64_t w = kB / 2; w >= 1; w /= 2)
        for (int64_t j = 0; j < w; ++j) r[j] += r[j + w];
      o[d] = r[0];
    }
  } else {
    for (int64_t d = 0; d < D; ++d) {
      float sum = 0;
      for (int64_t j = 0; j < B; ++j) sum += a[d * B + j];
      o[d] = sum;
    }
  }
}

struct Layout {
  int64_t G, D, B, x, C, BX, n;
  float *qpat, *kacc, *dots, *scores, *vacc, *kconv, *vconv;
};

PLUGIN_KERNELS_INLINE Layout layout_of(const PagedView& v, int64_t n, float* scratch) {
  Layout l;
  l.G = v.group;
  l.D = v.head_size;
  l.B = v.block_size;
  l.x = v.x;
  l.C = l.D / l.x;
  l.BX = l.B * l.x;
  l.n = n;
  l.qpat = scratch;
  l.kacc = l.qpat + l.G * l.C * kLanes;
  l.dots = l.kacc + l.G * l.BX;
  l.scores = l.dots + l.B;
  l.vacc = l.scores + l.G * n;
  l.kconv = l.vacc + l.G * l.D * l.B;
  l.vconv = l.kconv + l.D * l.B;
  return l;
}

template <typename S, Isa kIsa>
PLUGIN_KERNELS_INLINE void attend_impl(const PagedView& v, const typename S::E* q, int64_t seq, int64_t kvh,
                                       int64_t seq_len, int64_t t0, int64_t t1, const RangeStats& out,
                                       float* scratch) {
  using E = typename S::E;
  using R = ReadAs<S>;
  using RE = typename R::E;
  const Layout L = layout_of(v, t1 - t0, scratch);
  const int64_t G = L.G, D = L.D, B = L.B, x = L.x, C = L.C, BX = L.BX, n = L.n;
  for (int64_t g = 0; g < G; ++g) {
    out.max[g] = -std::numeric_limits<float>::infinity();
    out.sum[g] = 0;
  }
  std::fill(out.acc, out.acc + G * D, 0.0f);
  if (n <= 0) return;
  // The query pattern, each element converted once (x is 4 or 8: a mask,
  // not a division, picks the lane's dimension; a range of v2 is short
  // enough for either to show).
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < C; ++c) {
      float qx[kLanes];
      for (int64_t i = 0; i < x; ++i) qx[i] = S::load(q[g * D + c * x + i]);
      for (int64_t l = 0; l < kLanes; ++l) L.qpat[(g * C + c) * kLanes + l] = qx[l & (x - 1)];
    }
  const E* kcache = static_cast<const E*>(v.key_cache);
  const E* vcache = static_cast<const E*>(v.value_cache);
  const int32_t* table = v.block_tables + seq * v.max_blocks;
  const int64_t b0 = t0 / B, b1 = (t1 + B - 1) / B;

  // Scores, block by block, the key blocks about kPrefetchBytes ahead in flight.
  const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / (D * B * static_cast<int64_t>(sizeof(E))));
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t block = table[b];
    if (b == b0)
      for (int64_t i = 1; i < ahead; ++i)
        prefetch_block(kcache, table, b + i, b1, v.num_kv_heads, kvh, D * B);
    prefetch_block(kcache, table, b + ahead, b1, v.num_kv_heads, kvh, D * B);
    const RE* kb = block_view<S, kIsa>(kcache + (block * v.num_kv_heads + kvh) * D * B, L.kconv, D * B);
    const int64_t j0 = std::max<int64_t>(t0 - b * B, 0), j1 = std::min<int64_t>(t1 - b * B, B);
    for (int64_t g = 0; g < G; ++g) {
      float* a = L.kacc + g * BX;
      const float* qp = L.qpat + g * C * kLanes;
      if (BX == 64)
        key_lanes<64, R>(qp, kb, C, BX, a);
      else if (BX == 128)
        key_lanes<128, R>(qp, kb, C, BX, a);
      else if (BX == 32)
        key_lanes<32, R>(qp, kb, C, BX, a);
      else if (BX == 256)
        key_lanes<256, R>(qp, kb, C, BX, a);
      else
        key_lanes<0, R>(qp, kb, C, BX, a);
      const float slope = v.alibi_slopes != nullptr ? v.alibi_slopes[kvh * G + g] : 0.0f;
      float* s = L.scores + g * n + (b * B - t0);
      float* dots = L.dots;
      if (x == 4)
        token_sums<4>(a, B, dots);
      else if (x == 8)
        token_sums<8>(a, B, dots);
      else
        token_sums<0>(a, B, dots, x);
      const float pos0 = static_cast<float>(b * B - (seq_len - 1));
      for (int64_t j = j0; j < j1; ++j) s[j] = v.scale * dots[j] + slope * (pos0 + static_cast<float>(j));
    }
  }

  // The first value blocks start loading while the softmax runs (in a
  // partition, a pass is short enough for a cold start to show).
  for (int64_t i = 0; i < 2 * kValueBlocks; ++i)
    prefetch_block(vcache, table, b0 + i, b1, v.num_kv_heads, kvh, D * B);

  // Softmax numerators and their sums.
  for (int64_t g = 0; g < G; ++g) {
    float* s = L.scores + g * n;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[t]);
    for (int64_t t = 0; t < n; ++t) s[t] = plugin_kernels::exp_nonpositive(s[t] - mx);
    out.max[g] = mx;
    out.sum[g] = plugin_kernels::blocked_sum<float>(n, [&](int64_t t) { return s[t]; });
  }

  // Values, block by block, lane-wise per dimension.
  std::fill(L.vacc, L.vacc + G * D * B, 0.0f);
  for (int64_t b = b0; b < b1; ++b) {
    // Four full blocks at once where the range has them.
    if (b * B >= t0 && (b + kValueBlocks) * B <= t1) {
      const RE* vs[kValueBlocks];
      for (int64_t i = 0; i < kValueBlocks; ++i) {
        prefetch_block(vcache, table, b + kValueBlocks + i, b1, v.num_kv_heads, kvh, D * B);
        vs[i] = block_view<S, kIsa>(vcache + (table[b + i] * v.num_kv_heads + kvh) * D * B,
                                    L.vconv + i * D * B, D * B);
      }
      for (int64_t g = 0; g < G; ++g) {
        float* a = L.vacc + g * D * B;
        const float* p = L.scores + g * n + (b * B - t0);
        if (B == 16)
          value_rows4<16, R>(a, p, vs, D, B);
        else if (B == 32)
          value_rows4<32, R>(a, p, vs, D, B);
        else if (B == 8)
          value_rows4<8, R>(a, p, vs, D, B);
        else
          value_rows4<0, R>(a, p, vs, D, B);
      }
      b += kValueBlocks - 1;
      continue;
    }
    const int64_t block = table[b];
    prefetch_block(vcache, table, b + 1, b1, v.num_kv_heads, kvh, D * B);
    const RE* vb = block_view<S, kIsa>(vcache + (block * v.num_kv_heads + kvh) * D * B, L.vconv, D * B);
    const int64_t j0 = std::max<int64_t>(t0 - b * B, 0), j1 = std::min<int64_t>(t1 - b * B, B);
    for (int64_t g = 0; g < G; ++g) {
      float* a = L.vacc + g * D * B;
      const float* p = L.scores + g * n + (b * B - t0);
      if (j0 == 0 && j1 == B) {
        if (B == 16)
          value_rows<16, R>(a, p, vb, D, B);
        else if (B == 32)
          value_rows<32, R>(a, p, vb, D, B);
        else if (B == 8)
          value_rows<8, R>(a, p, vb, D, B);
        else
          value_rows<0, R>(a, p, vb, D, B);
      } else {
        for (int64_t d = 0; d < D; ++d)
          for (int64_t j = j0; j < j1; ++j) a[d * B + j] += p[j] * R::load(vb[d * B + j]);
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* a = L.vacc + g * D * B;
    float* o = out.acc + g * D;
    if (B == 16)
      row_sums<16>(a, D, o, B);
    else if (B == 32)
      row_sums<32>(a, D, o, B);
    else if (B == 8)
      row_sums<8>(a, D, o, B);
    else
      row_sums<0>(a, D, o, B);
  }
}

// The loops of one range, compiled per instruction set (a dtype branch
// each).
struct Attend {
  template <Isa kIsa>
  static PLUGIN_KERNELS_INLINE void run(const PagedView& v, const void* q, int64_t seq, int64_t kvh,
                                        int64_t seq_len, int64_t t0, int64_t t1, const RangeStats& out,
                                        float* scratch) {
    if (npub::sdk::same_dtype(v.dtype, npub::sdk::kFloat32))
      attend_impl<F32, kIsa>(v, static_cast<const float*>(q), seq, kvh, seq_len, t0, t1, out, scratch);
    else if (npub::sdk::same_dtype(v.dtype, npub::sdk::kFloat16))
      attend_impl<F16, kIsa>(v, static_cast<const uint16_t*>(q), seq, kvh, seq_len, t0, t1, out, scratch);
    else
      attend_impl<BF16, kIsa>(v, static_cast<const uint16_t*>(q), seq, kvh, seq_len, t0, t1, out, scratch);
  }
};

}  // namespace

int64_t attend_scratch_floats(const PagedView& v, int64_t tokens) {
  const int64_t G = v.group, D = v.head_size, B = v.block_size, x = std::max<int64_t>(v.x, 1);
  return G * (D / x) * kLanes + G * B * x + B + G * tokens + G * D * B + (1 + kValueBlocks) * D * B;
}

void attend_range(const PagedView& v, const void* q, int64_t seq, int64_t kv_head, int64_t seq_len,
                  int64_t t0, int64_t t1, const RangeStats& out, float* scratch) {
  run_at_kernel_isa<Attend>(v, q, seq, kv_head, seq_len, t0, t1, out, scratch);
}

}  // namespace vllm_like
