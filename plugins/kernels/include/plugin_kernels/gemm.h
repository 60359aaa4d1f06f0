// The GEMM the in-tree plugins share: one row-major product computed on the
// calling thread. cann_like's matrix products and convolutions and
// mindspeed_like's attention run on it. It is a static library compiled into
// each plugin (plugins/kernels), as a vendor's kernel library is linked into
// each of its operator libraries: the plugins still share nothing at run time.
//
// Note [GEMM runs on the caller's thread only]
// Kernels split a product into blocks of rows and spread the blocks over the
// device's compute threads (call.parallel_for); each block is one
// gemm_on_this_thread call. So the function must be safe to call from any
// number of threads at once (the compute threads of both devices and every
// host thread that submits work) and must not start threads of its own: the
// device's compute threads are the one pool that runs work. With oneDNN
// (gemm.cpp) that means one OpenMP thread for the duration of the call, and
// each thread running the shared primitives on its own scratchpad (Note
// [oneDNN primitives are created once and run from any thread]). Debian's serial
// OpenBLAS, used before, fails the first requirement (wrong blocks of rows
// when two threads call it at once).
#pragma once

#include <algorithm>
#include <cstdint>

namespace plugin_kernels {

// Element types of the library path. bf16 and f16 accumulate in fp32 and
// round once to the output type (C's type is A's and B's unless c_float32).
enum class GemmType : uint8_t { f32, bf16, f16 };

// C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, all row-major with
// leading dimensions lda/ldb/ldc; op(X) is X, or X stored transposed
// (column-major) when trans_x is set. beta == 0 overwrites C (NaNs in C
// included), as BLAS and ATen do.
struct GemmArgs {
  GemmType type = GemmType::f32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  // bf16 or f16 A and B with a float32 C: the fp32 accumulation is not
  // rounded to the half type (a float32 gradient accumulated from half
  // activations).
  bool c_float32 = false;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  // float32 only, with alpha == 1 and beta == 0: C[i, j] = (A @ B)[i, j] +
  // bias[j], the bias added to the accumulator (addmm's bias row: no pass
  // that copies it into C first, no read of C).
  const float* bias = nullptr;
};

// Keeps oneDNN and libgomp mapped when the plugin is unloaded. First thing
// in the plugin's initialize, before anything there can fail: they are
// loaded with the plugin and keep heap blocks only their static data points
// to, which an unload would leak (LeakSanitizer saw it when a bad
// NPUB_PLUGINS_MAX_ISA rejected the plugin).
void gemm_pin_libraries();

// One product on the calling thread (Note [GEMM runs on the caller's thread
// only]). f32 always works (the built-in kernel without oneDNN); bf16 and
// f16 only where gemm_supports() says so.
void gemm_on_this_thread(const GemmArgs& g);

// Whether gemm_on_this_thread takes `type` on this CPU: oneDNN is built in
// and has a kernel for it under the ISA it may use (ONEDNN_MAX_CPU_ISA caps
// that), with a C of that type and with c_float32. Probed once.
bool gemm_supports(GemmType type);

// Which implementation runs `type` ("oneDNN brg:avx512_core_bf16", "built-in
// blocked kernel"): for logs and benchmarks.
const char* gemm_implementation(GemmType type);

// The portable cache-blocked kernel, in T's arithmetic (alpha and beta
// applied in double and rounded to T, as the integer products need): the
// path of float64 and integer dtypes, and of float32 without oneDNN.
template <typename T>
void gemm_blocked(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a,
                  int64_t lda, const T* b, int64_t ldb, double beta, T* c, int64_t ldc) {
  constexpr int64_t kBlockK = 256;
  for (int64_t i = 0; i < m; ++i) {
    T* ci = c + i * ldc;
    if (beta == 0) {
      for (int64_t j = 0; j < n; ++j) ci[j] = T(0);
    } else if (beta != 1) {
      for (int64_t j = 0; j < n; ++j) ci[j] = static_cast<T>(ci[j] * beta);
    }
  }
  for (int64_t kb = 0; kb < k; kb += kBlockK) {
    const int64_t ke = std::min(k, kb + kBlockK);
    for (int64_t i = 0; i < m; ++i) {
      T* ci = c + i * ldc;
      for (int64_t p = kb; p < ke; ++p) {
        const T av = static_cast<T>((trans_a ? a[p * lda + i] : a[i * lda + p]) * alpha);
        if (trans_b) {
          for (int64_t j = 0; j < n; ++j) ci[j] += av * b[j * ldb + p];
        } else {
          const T* bp = b + p * ldb;
          for (int64_t j = 0; j < n; ++j) ci[j] += av * bp[j];
        }
      }
    }
  }
}

// C[m, n] = alpha * op(A) @ op(B) + beta * C on this thread (the shapes and
// leading dimensions as GemmArgs'; a leading dimension of 0, an empty
// operand's, taken as 1), for kernels templated on the accumulator type:
// float32 on gemm_on_this_thread, float64 on gemm_blocked.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  GemmArgs g;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = std::max<int64_t>(lda, 1);
  g.ldb = std::max<int64_t>(ldb, 1);
  g.ldc = std::max<int64_t>(ldc, 1);
  g.alpha = alpha;
  g.beta = beta;
  g.a = a;
  g.b = b;
  g.c = c;
  gemm_on_this_thread(g);
}
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                 int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_blocked<double>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace plugin_kernels
