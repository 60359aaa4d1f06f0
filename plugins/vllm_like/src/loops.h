// How vllm_like's element loops are compiled: written once as always-inline
// templates over raw pointers (plugin_kernels/float_access.h's element
// structs), instantiated twice, for AVX2 with FMA (the functions marked
// VLLM_LIKE_AVX2) and for the plugin's baseline x86-64 (4-wide float
// vectors, std::fma a library call), and chosen per call by has_avx2_fma()
// (the plugin's level: isa.h).
#pragma once

#include <plugin_kernels/float_access.h>

#include "isa.h"

#define VLLM_LIKE_AVX2 __attribute__((target("avx2,fma")))
#define VLLM_LIKE_INLINE PLUGIN_KERNELS_INLINE

namespace vllm_like {

inline bool has_avx2_fma() { return isa() >= Isa::kAvx2; }

}  // namespace vllm_like
