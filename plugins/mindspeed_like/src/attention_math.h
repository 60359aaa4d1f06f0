// The building blocks of the flash-attention kernels: element loads and
// stores per dtype, the tile GEMM in the accumulator type, and a
// vectorisable exp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <plugin_kernels/gemm.h>

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like::attn {

// Element types as stored: float32, float64 and the two half types, each
// read into the accumulator type Acc (float, or double for float64).
struct F32 {
  using T = float;
  static float load(const T* p) { return *p; }
  static void store(T* p, float v) { *p = v; }
};
struct F64 {
  using T = double;
  static double load(const T* p) { return *p; }
  static void store(T* p, double v) { *p = v; }
};
struct F16 {
  using T = uint16_t;
  static float load(const T* p) { return npub::sdk::half_to_float(*p); }
  static void store(T* p, float v) { *p = npub::sdk::float_to_half(v); }
};
struct BF16 {
  using T = uint16_t;
  static float load(const T* p) { return npub::sdk::bf16_to_float(*p); }
  static void store(T* p, float v) { *p = npub::sdk::float_to_bf16(v); }
};

// Calls f(Elem{}, Acc{}) for the call's dtype: one compiled kernel per dtype.
template <typename F>
void with_attention_types(const npub::sdk::Call& call, DLDataType t, F&& f) {
  if (npub::sdk::same_dtype(t, npub::sdk::kFloat32)) {
    f(F32{}, float{});
  } else if (npub::sdk::same_dtype(t, npub::sdk::kFloat64)) {
    f(F64{}, double{});
  } else if (npub::sdk::same_dtype(t, npub::sdk::kFloat16)) {
    f(F16{}, float{});
  } else if (npub::sdk::same_dtype(t, npub::sdk::kBFloat16)) {
    f(BF16{}, float{});
  } else {
    call.fail(NPUB_ERR_UNSUPPORTED, "dtype " + npub::sdk::dtype_name(t));
  }
}

// C[m, n] = alpha * op(A) op(B) + beta * C, row-major, on this thread:
// plugins/kernels' GEMM for float, its portable blocked kernel for double.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  plugin_kernels::GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.alpha = alpha;
  g.beta = beta;
  g.a = a;
  g.b = b;
  g.c = c;
  plugin_kernels::gemm_on_this_thread(g);
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  plugin_kernels::gemm_blocked<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// exp(x) for float without a libm call, so that loops over a row
// vectorise: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for the
// reduction's precision), e^r by its degree-6 Taylor polynomial (relative
// error under 2e-7 on that interval, about 2 ulp with the rounding of the
// steps), 2^n put into the exponent bits. Inputs below -87.3 (e^x
// subnormal or 0, and -inf: a masked score) give 0; the kernels never pass
// x > 0 (scores minus their row's running maximum).
inline float exp_fast(float x) {
  // Comparisons, not fmin/fmax (library calls without -ffast-math).
  float xc = x > 88.0f ? 88.0f : x;
  xc = xc < -87.3f ? -87.3f : xc;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + magic;
  const float n = t - magic;
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  const int32_t ni = ti - 0x4B400000;  // the integer n, from t's mantissa
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (ni + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const float y = p * two_n;
  return x < -87.3f ? 0.0f : (x == x ? y : x);  // NaN stays NaN
}
inline double exp_fast(double x) { return std::exp(x); }

}  // namespace mindspeed_like::attn
