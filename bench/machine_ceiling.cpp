#include "machine_ceiling.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace npub::bench {

namespace {

constexpr int kAcc = 12;             // independent accumulators: hides the FMA latency
constexpr int64_t kIters = 1 << 22;  // per thread: ~0.1 s at a few GHz

// The loops' results are summed and kept, so that no loop is optimised away.
__attribute__((target("avx512f"))) float sum_lanes(const __m512* acc) {
  float out[16], s = 0;
  for (int i = 0; i < kAcc; ++i) {
    _mm512_storeu_ps(out, acc[i]);
    for (float v : out) s += v;
  }
  return s;
}

// Each iteration: kAcc vector FMAs of `lanes` lanes, 2 FLOP a lane.
__attribute__((target("avx512f"))) float fma_loop_avx512() {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  return sum_lanes(acc);
}
__attribute__((target("avx2,fma"))) float fma_loop_avx2() {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float out[8], s = 0;
  for (int i = 0; i < kAcc; ++i) {
    _mm256_storeu_ps(out, acc[i]);
    for (float v : out) s += v;
  }
  return s;
}
// vdpbf16ps: 32 bf16 products summed pairwise into 16 fp32 lanes, 4 FLOP a lane.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop() {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (int64_t it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
  return sum_lanes(acc);
}

// a = b + 3 * c at the width the kernels use (Note [The triad is a
// reference, not a memory ceiling]: a plain loop stays scalar at -O2).
__attribute__((target("avx512f"))) float triad_avx512(float* a, const float* b, const float* c, int64_t n) {
  const __m512 s = _mm512_set1_ps(3.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(a + i, _mm512_fmadd_ps(s, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
  for (; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  return a[n / 2];
}
__attribute__((target("avx2,fma"))) float triad_avx2(float* a, const float* b, const float* c, int64_t n) {
  const __m256 s = _mm256_set1_ps(3.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(s, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  for (; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  return a[n / 2];
}
float triad_scalar(float* a, const float* b, const float* c, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  return a[n / 2];
}

// Best of 3 runs of `body` on `threads` threads at once; returns work/s.
template <typename Body>
double best_rate(int threads, double work_per_thread, Body body) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> ts;
    std::vector<float> sink(static_cast<size_t>(threads));
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { sink[static_cast<size_t>(t)] = body(t); });
    for (auto& t : ts) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, work_per_thread * threads / s);
    volatile float keep = sink[0];  // the loops' results are used
    (void)keep;
  }
  return best;
}

}  // namespace

MachineCeiling measure_machine_ceiling(int threads) {
  MachineCeiling c;
  const double vec_iters = static_cast<double>(kIters) * kAcc;
  if (__builtin_cpu_supports("avx512f")) {
    c.isa = "AVX-512";
    c.fp32_gflops = best_rate(threads, vec_iters * 16 * 2, [](int) { return fma_loop_avx512(); }) / 1e9;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    c.isa = "AVX2";
    c.fp32_gflops = best_rate(threads, vec_iters * 8 * 2, [](int) { return fma_loop_avx2(); }) / 1e9;
  }
  if (__builtin_cpu_supports("avx512bf16"))
    c.bf16_gflops = best_rate(threads, vec_iters * 16 * 4, [](int) { return dpbf16_loop(); }) / 1e9;
  // Memory bandwidth as STREAM's triad measures it (a = b + s * c over
  // float arrays far larger than the caches, 12 bytes an element as an
  // elementwise binary op counts them), each thread on its share; pages
  // touched first, outside the timing. A reference, not a bound (Note
  // [The triad is a reference, not a memory ceiling], machine_ceiling.h).
  const int64_t n = int64_t{32} << 20, share = n / threads;
  std::vector<float> a(static_cast<size_t>(n), 0.f), b(static_cast<size_t>(n), 1.f),
      cc(static_cast<size_t>(n), 2.f);
  float (*triad)(float*, const float*, const float*, int64_t) =
      __builtin_cpu_supports("avx512f")                                 ? triad_avx512
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? triad_avx2
                                                                        : triad_scalar;
  c.triad_gbps =
      best_rate(threads, 12.0 * static_cast<double>(share),
                [&](int t) {
                  return triad(a.data() + share * t, b.data() + share * t, cc.data() + share * t, share);
                }) /
      1e9;
  return c;
}

}  // namespace npub::bench
