// What the flash-attention forward (attention.cpp) and backward
// (attention_backward.cpp) share: block sizes, the work list, tile loads,
// masking and the row loops of the online softmax.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <plugin_kernels/gemm.h>

#include "attention_layout.h"
#include "float_access.h"

namespace mindspeed_like {

void register_attention_backward(npub::sdk::Registrar& r);

namespace attn {

// The tile products in the accumulator type (plugin_kernels' GEMM for
// float, its blocked kernel for double) and the exp of the softmax rows
// (scores minus their row's running maximum, x <= 0; -inf, a masked score,
// gives 0).
using plugin_kernels::exp_nonpositive;
using plugin_kernels::gemm;

// Rows of queries x keys per tile. 128 x 128 float tiles with D = 64 keep
// Q, K, V, the scores and the output block (about 260 KiB) in a core's
// 1 MiB L2 with room for the GEMM's own packing; the fastest of the shapes
// measured (commit 3dc4441).
constexpr int64_t kBlockQ = 128;
constexpr int64_t kBlockK = 128;

// One block of query rows of one head of one batch.
struct Task {
  int64_t b, n, q0;
};

inline std::vector<Task> query_block_tasks(const AttnProblem& p) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t n = 0; n < p.heads; ++n)
      for (int64_t q0 = 0; q0 < p.q_len[b]; q0 += kBlockQ) tasks.push_back({b, n, q0});
  return tasks;
}

// Scratch slots: each holds one task's tiles; slot i runs tasks i, i +
// slots, ... (interleaved, so that the longer rows of a causal mask spread
// over the threads). A few per thread, for the balance.
inline int64_t num_slots(const npub::sdk::Call& call, int64_t tasks) {
  return std::max<int64_t>(1, std::min<int64_t>(tasks, 4 * static_cast<int64_t>(call.num_threads())));
}

// Q and O, the scores, and K and V converted (half types only).
inline int64_t forward_scratch_elems(int64_t D, bool convert) {
  return 2 * kBlockQ * D + kBlockQ * kBlockK + (convert ? 2 * kBlockK * D : 0);
}

// dst[r * ldd + d] = scale * src[r * stride + d] in the accumulator type.
template <typename Elem, typename Acc>
void load_rows(const typename Elem::E* src, int64_t stride, int64_t rows, int64_t D, Acc scale, Acc* dst,
               int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const typename Elem::E* s = src + r * stride;
    Acc* o = dst + r * ldd;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<Acc>(Elem::load(s[d])) * scale;
  }
}

// A tile of `rows` rows of D elements at `src` (row stride `stride`) in the
// accumulator type: the tensor's own memory when it is of that type (the
// GEMM reads it with its stride), else a converted copy in `buf`.
template <typename Acc>
struct Tile {
  const Acc* data;
  int64_t ld;
};
template <typename Elem, typename Acc>
Tile<Acc> tile(const typename Elem::E* src, int64_t stride, int64_t rows, int64_t D, Acc* buf) {
  if constexpr (std::is_same_v<typename Elem::E, Acc>) {
    return {src, stride};
  } else {
    load_rows<Elem>(src, stride, rows, D, Acc(1), buf, D);
    return {buf, D};
  }
}

// Sets the scores of keys k0 .. k0 + kn that row i (of head n, batch b)
// may not see to -inf: outside [lo, hi) (causal or band), or True in the
// explicit mask.
template <typename Acc>
void mask_scores(const AttnProblem& p, int64_t b, int64_t n, int64_t i, int64_t k0, int64_t kn, int64_t lo,
                 int64_t hi, const uint8_t* mask, Acc* s) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const int64_t a = std::clamp<int64_t>(lo - k0, 0, kn), e = std::clamp<int64_t>(hi - k0, a, kn);
  std::fill(s, s + a, kNegInf);
  std::fill(s + e, s + kn, kNegInf);
  if (mask != nullptr) {
    const uint8_t* m = p.mask_row(mask, b, n, i) + k0;
    for (int64_t c = a; c < e; ++c) s[c] = m[c] ? kNegInf : s[c];
  }
}

inline double row_max(const double* s, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
  return mx;
}
float row_max(const float* s, int64_t n);  // attention_rows.cpp: per ISA

// s = exp(s - mx) in place; returns the row's sum.
inline double exp_row(double* s, int64_t n, double mx) {
  double sum = 0;
  for (int64_t c = 0; c < n; ++c) {
    s[c] = std::exp(s[c] - mx);
    sum += s[c];
  }
  return sum;
}
float exp_row(float* s, int64_t n, float mx);  // attention_rows.cpp: per ISA

// s = exp(s - mx) * inv in place: the probabilities of a row from its
// statistics (masked scores are -inf and give 0).
inline void prob_row(double* s, int64_t n, double mx, double inv) {
  for (int64_t c = 0; c < n; ++c) s[c] = std::exp(s[c] - mx) * inv;
}
void prob_row(float* s, int64_t n, float mx, float inv);

// p = p * (dp - di) in place: dS from P and dP.
inline void ds_row(double* p, const double* dp, int64_t n, double di) {
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - di);
}
void ds_row(float* p, const float* dp, int64_t n, float di);

// sum_c a[c] * b[c]
inline double dot_row(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}
float dot_row(const float* a, const float* b, int64_t n);

}  // namespace attn

}  // namespace mindspeed_like
