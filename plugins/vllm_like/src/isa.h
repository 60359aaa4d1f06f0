// Which instruction sets vllm_like's own loops run with: one setting for
// the whole plugin, read once at registration.
//
// The loops are written once as always-inline templates and compiled per
// level: the element loops (loops.h) for AVX2+FMA and baseline x86-64, the
// paged-attention rows (paged_attention_rows.cpp) for AVX-512 as well.
// NPUB_VLLM_MAX_ISA=avx512|avx2|baseline caps the level, so that a test
// runs the portable variants on a CPU that has the wider ones (CTest
// conformance.torch.vllm_like_baseline_isa).
#pragma once

namespace vllm_like {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// Reads NPUB_VLLM_MAX_ISA (plugin_kernels::isa_cap_from_environment: a bad
// value fails the plugin's initialize with a message naming it) and the
// CPU's features. Called first in initialize.
void configure_isa_from_environment();

// The level the loops run with: AVX2 needs FMA and F16C (the float16
// caches' conversions); AVX-512 needs F, BW, DQ and VL.
Isa isa();

}  // namespace vllm_like
