// Which instruction sets mindspeed_like's element loops run with.
//
// Note [Loops compiled twice]
// The element loops are written once, as always-inline templates, and
// compiled into two variants: one for AVX2 with FMA (the functions marked
// MINDSPEED_LIKE_AVX2) and one for baseline x86-64, chosen per call by
// has_avx2_fma(); the attention's row loops have an AVX-512 variant as well
// (attention_rows.cpp, has_avx512()). The plugin is built for baseline x86-64, where a float
// loop is 4 wide and std::fma is a library call. NPUB_MINDSPEED_MAX_ISA=baseline
// keeps every call on the baseline variants, so that a test runs them on a
// CPU that has AVX2 (CTest conformance.torch.mindspeed_like_baseline_isa).
#pragma once

#define MINDSPEED_LIKE_AVX2 __attribute__((target("avx2,fma")))
#define MINDSPEED_LIKE_INLINE inline __attribute__((always_inline))

namespace mindspeed_like {

// Reads NPUB_MINDSPEED_MAX_ISA (baseline | avx2 | avx512; unset or empty: no cap),
// from the plugin's initialize; another value throws npub::sdk::Error
// naming the variable, the accepted values and what was found, and the host
// rejects the plugin with it.
void configure_isa_from_environment();

// Whether the AVX2+FMA variants run: the CPU has both and no cap forbids them.
bool has_avx2_fma();

// Whether the AVX-512 variants (the attention's row loops) run: the CPU has
// AVX-512 F/BW/DQ/VL and the cap is avx512 or unset.
bool has_avx512();

}  // namespace mindspeed_like
