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

#include "float_access.h"

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

// exp of the kernels' row loops: float_access.h's exp_nonpositive (they
// only pass scores minus their row's running maximum, x <= 0; -inf, a masked
// score, gives 0).
using mindspeed_like::exp_nonpositive;

}  // namespace mindspeed_like::attn
