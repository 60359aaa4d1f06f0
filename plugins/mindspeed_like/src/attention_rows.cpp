// The float row loops of the flash-attention kernels (attention_kernels.h),
// compiled for AVX-512, AVX2 and baseline x86-64 and picked once by the CPU:
// the plugin is built for baseline x86-64, where they would run 4 lanes wide.
// The exps of the scores cost as much as the GEMMs around them.
#include <cstdint>

#include "attention_kernels.h"
#include "isa.h"

namespace mindspeed_like::attn {

namespace {

#define ROWS_BODY inline __attribute__((always_inline))

ROWS_BODY float row_max_body(const float* s, int64_t n) {
  float mx = -__builtin_inff();
#pragma omp simd reduction(max : mx)
  for (int64_t c = 0; c < n; ++c) mx = s[c] > mx ? s[c] : mx;
  return mx;
}

ROWS_BODY float exp_row_body(float* s, int64_t n, float mx) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < n; ++c) {
    const float e = exp_nonpositive(s[c] - mx);
    s[c] = e;
    sum += e;
  }
  return sum;
}

ROWS_BODY void prob_row_body(float* s, int64_t n, float mx, float inv) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpositive(s[c] - mx) * inv;
}

ROWS_BODY void ds_row_body(float* p, const float* dp, int64_t n, float di) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - di);
}

ROWS_BODY float dot_row_body(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// One function per ISA level for each body.
#define ROWS_VARIANTS(ret, name, body, params, args)                                       \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) ret name##_avx512 params { \
    return body args;                                                                      \
  }                                                                                        \
  __attribute__((target("avx2,fma"))) ret name##_avx2 params { return body args; }         \
  ret name##_baseline params { return body args; }                                         \
  using name##_fn = ret(*) params;                                                         \
  name##_fn pick_##name() {                                                                \
    if (has_avx512()) return &name##_avx512;                                               \
    if (has_avx2_fma()) return &name##_avx2;                                               \
    return &name##_baseline;                                                               \
  }

ROWS_VARIANTS(float, dot_row, dot_row_body, (const float* a, const float* b, int64_t n), (a, b, n))
ROWS_VARIANTS(float, row_max, row_max_body, (const float* s, int64_t n), (s, n))
ROWS_VARIANTS(float, exp_row, exp_row_body, (float* s, int64_t n, float mx), (s, n, mx))
ROWS_VARIANTS(void, prob_row, prob_row_body, (float* s, int64_t n, float mx, float inv), (s, n, mx, inv))
ROWS_VARIANTS(void, ds_row, ds_row_body, (float* p, const float* dp, int64_t n, float di), (p, dp, n, di))

}  // namespace

float dot_row(const float* a, const float* b, int64_t n) { return pick_dot_row()(a, b, n); }

float row_max(const float* s, int64_t n) { return pick_row_max()(s, n); }

float exp_row(float* s, int64_t n, float mx) { return pick_exp_row()(s, n, mx); }

void prob_row(float* s, int64_t n, float mx, float inv) { pick_prob_row()(s, n, mx, inv); }

void ds_row(float* p, const float* dp, int64_t n, float di) { pick_ds_row()(p, dp, n, di); }

}  // namespace mindspeed_like::attn
