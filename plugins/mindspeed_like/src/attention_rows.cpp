// The float row loops of the flash-attention kernels (attention_kernels.h),
// compiled for AVX-512, AVX2 and baseline x86-64 (Note [One ISA layer for
// the in-tree plugins], plugin_kernels/isa.h): the plugin is built for
// baseline x86-64, where they would run 4 lanes wide.
// The exps of the scores cost as much as the GEMMs around them.
#include <cstdint>

#include "attention_kernels.h"

namespace mindspeed_like::attn {

namespace {

PLUGIN_KERNELS_INLINE float row_max_body(const float* s, int64_t n) {
  float mx = -__builtin_inff();
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
  return mx;
}

PLUGIN_KERNELS_INLINE float exp_row_body(float* s, int64_t n, float mx) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) {
    const float e = exp_nonpositive(s[c] - mx);
    s[c] = e;
    sum += e;
  }
  return sum;
}

PLUGIN_KERNELS_INLINE void prob_row_body(float* s, int64_t n, float mx, float inv) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpositive(s[c] - mx) * inv;
}

PLUGIN_KERNELS_INLINE void ds_row_body(float* p, const float* dp, int64_t n, float di) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - di);
}

PLUGIN_KERNELS_INLINE float dot_row_body(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace

PLUGIN_KERNELS_ISA_DISPATCH(float, dot_row, dot_row_body, (const float* a, const float* b, int64_t n),
                            (a, b, n))
PLUGIN_KERNELS_ISA_DISPATCH(float, row_max, row_max_body, (const float* s, int64_t n), (s, n))
PLUGIN_KERNELS_ISA_DISPATCH(float, exp_row, exp_row_body, (float* s, int64_t n, float mx), (s, n, mx))
PLUGIN_KERNELS_ISA_DISPATCH(void, prob_row, prob_row_body, (float* s, int64_t n, float mx, float inv),
                            (s, n, mx, inv))
PLUGIN_KERNELS_ISA_DISPATCH(void, ds_row, ds_row_body, (float* p, const float* dp, int64_t n, float di),
                            (p, dp, n, di))

}  // namespace mindspeed_like::attn
