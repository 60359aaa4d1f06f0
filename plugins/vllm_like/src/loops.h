// How vllm_like's element loops are compiled: written once as always-inline
// templates over raw pointers (plugin_kernels/float_access.h's element
// structs), instantiated twice, for AVX2 with FMA (the functions marked
// VLLM_LIKE_AVX2) and for the plugin's baseline x86-64 (4-wide float
// vectors, std::fma a library call), and chosen per call by has_avx2_fma().
// (mindspeed_like does the same, with an environment cap on top: isa.h there.)
#pragma once

#include <plugin_kernels/float_access.h>

#define VLLM_LIKE_AVX2 __attribute__((target("avx2,fma")))
#define VLLM_LIKE_INLINE PLUGIN_KERNELS_INLINE

namespace vllm_like {

inline bool has_avx2_fma() {
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return cpu;
}

}  // namespace vllm_like
