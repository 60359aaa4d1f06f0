// How vllm_like's element loops are compiled: written once as always-inline
// templates over raw pointers (plugin_kernels/float_access.h's element
// structs), instantiated twice, for AVX2 with FMA (the functions marked
// VLLM_LIKE_AVX2) and for the plugin's baseline x86-64 (4-wide float
// vectors, std::fma a library call), and chosen per call by has_avx2_fma()
// (the plugin's level: isa.h).
#pragma once

#include <plugin_kernels/float_access.h>

#include <immintrin.h>

#include <cstdint>

#include "isa.h"

#define VLLM_LIKE_AVX2 __attribute__((target("avx2,fma")))
#define VLLM_LIKE_INLINE PLUGIN_KERNELS_INLINE

namespace vllm_like {

inline bool has_avx2_fma() { return isa() >= Isa::kAvx2; }

// float16 to float, 8 at a time with F16C, for the AVX2 and AVX-512
// variants of the attention loops (paged_attention_rows.cpp,
// flash_attention.cpp): a function of its own, since an intrinsic cannot be
// inlined into a template that is also compiled for baseline x86-64.
__attribute__((target("avx2,f16c"))) inline void f16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

}  // namespace vllm_like
