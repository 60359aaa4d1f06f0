// Float32 elementary functions written so that loops calling them vectorise
// (libm's do not): branch-free selects and polynomials, each within a few ulps
// (the error models of aten::exp/tanh/erf/sigmoid/silu allow 4). Used by the
// in-tree plugins' elementwise, activation, softmax and attention kernels;
// the one exp polynomial of the plugins (exp_reduced) under each of them.
// (-fno-trapping-math in the plugins' CMakeLists.txt lets GCC vectorise the
// selects.) Always inlined (PLUGIN_KERNELS_INLINE): the callers' loops are
// compiled per ISA level (plugin_kernels/isa.h), and a call would keep them
// scalar.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <plugin_kernels/isa.h>

namespace plugin_kernels {

// exp(x) = 2^n * exp(r): n = round(x / ln 2) (returned), r = x - n ln 2 by
// Cody-Waite, and exp(r) by a Cephes polynomial (the return value).
PLUGIN_KERNELS_INLINE float exp_reduced(float x, float& n) {
  n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

// exp(x) for x in [-87.3, 88.7] (normal results), within ~2 ulp, no special
// cases.
PLUGIN_KERNELS_INLINE float exp_normal_range(float x) {
  float n;
  const float p = exp_reduced(x, n);
  const uint32_t bits = (static_cast<uint32_t>(static_cast<int32_t>(n)) + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// exp(x), within ~2 ulp. NaN propagates; overflow (x > 88.7228) gives inf;
// results below the smallest normal float are the subnormals ATen's exp
// gives (the power of two is applied in two steps, the second rounding
// once), and 0 below half the smallest subnormal.
PLUGIN_KERNELS_INLINE float fast_exp(float x) {
  float xc = x < -103.972084f ? -103.972084f : x;
  xc = xc > 88.72283f ? 88.72283f : xc;
  float n;
  const float p = exp_reduced(xc, n);
  // 2^n as 2^(n + 64) * 2^-64 where 2^n is below the normal floats, and as
  // 2^(n - 1) * 2 where it is above them (exp(88.5) is finite).
  const bool subnormal = (n < -126.0f);
  const bool top = (n > 127.0f);
  const int32_t e = static_cast<int32_t>(n) + (subnormal ? 64 : 0) - (top ? 1 : 0);
  const uint32_t bits = (static_cast<uint32_t>(e) + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float res = (p * scale) * (subnormal ? 5.42101086e-20f : top ? 2.0f : 1.0f);  // 2^-64
  res = x > 88.72283f ? INFINITY : res;
  res = x < -103.972084f ? 0.0f : res;
  res = x != x ? x : res;  // NaN propagates
  return res;
}
// libm's, for the kernels templated on float and double.
PLUGIN_KERNELS_INLINE double fast_exp(double x) { return std::exp(x); }

// tanh(x), within ~2 ulp: Cephes' odd polynomial below |x| = 0.625, and
// 1 - 2 / (exp(2|x|) + 1) above, where tanh >= 0.55 and the subtraction
// loses nothing; the sign is copied back. NaN propagates.
PLUGIN_KERNELS_INLINE float fast_tanh(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);
  const float res = a < 0.625f ? small : (x < 0.0f ? -large : large);
  return x != x ? x : res;
}

// erfc(a) for a >= 0 (Numerical Recipes' erfcc Chebyshev fit): t * exp(-a^2 +
// P(t)), t = 1 / (1 + a / 2). The fit's relative error is ~1.2e-7; evaluated
// in float it is up to ~5e-7 (about 4 ulp).
PLUGIN_KERNELS_INLINE float fast_erfc_nonneg(float a) {
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  // Below exp(-87.3) (a > 9.3) the result is flushed to 0 (t * 0: a NaN
  // argument stays NaN; it is clamped too, keeping the float-to-int
  // conversion defined). erfc is below 2e-39 there, and a flush to 0, not
  // to exp(-87.3), keeps gelu's gradient far left 0, not of the wrong sign.
  const float arg = p - a * a;
  const float e = exp_normal_range(arg >= -87.3f ? arg : -87.3f);
  return arg >= -87.3f ? t * e : t * 0.0f;
}

// erf(x) / x as Cephes' polynomial in z = x^2, for |x| < 0.75.
PLUGIN_KERNELS_INLINE float erf_over_x(float z) {
  float p = 7.853861353153693e-5f;
  p = p * z - 8.010193625184903e-4f;
  p = p * z + 5.188327685732524e-3f;
  p = p * z - 2.685381193529856e-2f;
  p = p * z + 1.128358514861418e-1f;
  p = p * z - 3.761262582423300e-1f;
  return p * z + 1.128379165726710e0f;
}

// erf(x), within a few ulp: Cephes' x * P(x^2) below |x| = 0.75, and
// 1 - erfc(|x|) above (erfc <= 0.29 there: no cancellation), sign copied.
PLUGIN_KERNELS_INLINE float fast_erf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = x * x;
  const float p = erf_over_x(z);
  const float small = p * x;
  const float large = 1.0f - fast_erfc_nonneg(a);
  const float res = a < 0.75f ? small : (x < 0.0f ? -large : large);
  return x != x ? x : res;
}

// gelu(x) = x / 2 * (1 + erf(x / sqrt(2))), with one erfc: 1 + erf(u) is
// 2 - erfc(|u|) for u >= 0 (at least 1, no cancellation) and erfc(|u|) for
// u < 0 (which keeps its relative accuracy where 1 + erf cancels). No
// small-argument polynomial: erf's own is there for 1 - erfc's cancellation
// near 0, which 2 - erfc does not have, and computing both (a vector loop
// computes every branch) made the loop 1.9x ATen's. The price is accuracy
// near 0: up to ~6 ulp there (erfc's float evaluation; ATen's gelu ~2),
// within gelu's error model (8 ulp of the tensor's largest value).
// gelu_cdf(x) = (1 + erf(x / sqrt(2))) / 2, the normal distribution's CDF,
// which gelu's backward needs too.
PLUGIN_KERNELS_INLINE float gelu_cdf(float x) {
  const float u = x * 0.70710678118654752440f;
  const float c = fast_erfc_nonneg(u < 0.0f ? -u : u);
  return 0.5f * (u < 0.0f ? c : 2.0f - c);
}
PLUGIN_KERNELS_INLINE float fast_gelu(float x) { return x * gelu_cdf(x); }

// exp(x) for x <= 0 where a result below the normal floats may be 0: the
// softmax numerators exp(s - max) of the attention kernels (a masked score,
// -inf, gives 0). Cheaper than fast_exp: below -87.3 it gives 0, not
// exp's subnormal; NaN stays NaN. The double overload is libm's exp.
PLUGIN_KERNELS_INLINE float exp_nonpositive(float x) {
  const float y = exp_normal_range(x >= -87.3f ? x : -87.3f);  // NaN too: n stays an integer
  return x >= -87.3f ? y : (x == x ? 0.0f : x);
}
PLUGIN_KERNELS_INLINE double exp_nonpositive(double x) { return std::exp(x); }

// sigmoid(x) = 1 / (1 + e^-x), through e = e^-|x| so that the exp never
// overflows: e / (1 + e) for negative x. Below x = -87.3 e is 0 (the
// result is below float's smallest normal, an absolute error of at most
// that); fast_exp's subnormals would make the loop about twice as slow.
// float, and double (libm's exp).
template <typename T>
PLUGIN_KERNELS_INLINE T sigmoid(T x) {
  const T e = exp_nonpositive(-std::fabs(x));
  const T s = T(1) / (T(1) + e);
  return x >= T(0) ? s : e * s;
}

}  // namespace plugin_kernels
