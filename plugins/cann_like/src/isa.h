// Which x86 instruction sets cann_like's own kernels use: the CPU's, capped
// by NPUB_CANN_MAX_ISA. See Note [One ISA cap for the plugin's own kernels].
#pragma once

namespace cann_like {

// Levels, each a superset of the one before. kAvx512 is AVX-512 F, BW, DQ
// and VL (every AVX-512 server CPU since Skylake-SP has the four).
enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// Reads and checks NPUB_CANN_MAX_ISA (baseline | avx2 | avx512; unset or
// empty: no cap). Called from the plugin's initialize; the cap is
// process-wide, so the environment of the last initialize holds; a value outside
// those throws npub::sdk::Error naming the variable, the accepted values and
// what was found, so the host rejects the plugin with that message.
void configure_isa_from_environment();

// The level the kernels run at: min(the CPU's, the cap).
Isa kernel_isa();
bool use_f16c();  // kernel_isa() >= kAvx2 and the CPU has F16C

// The variant of a kernel compiled for the level kernel_isa() picks.
template <typename Fn>
Fn pick_isa(Fn avx512, Fn avx2, Fn baseline) {
  switch (kernel_isa()) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    default:
      return baseline;
  }
}

}  // namespace cann_like

// A loop body written once and compiled at each level: always inlined into
// the per-level variants that CANN_LIKE_ISA_DISPATCH defines, so that the
// compiler vectorises it for that level.
#define CANN_LIKE_ISA_BODY inline __attribute__((always_inline))

// Defines `ret name params`, which calls `body args` compiled for the level
// kernel_isa() picks (AVX-512: F, BW, DQ, VL; AVX2; baseline x86-64).
#define CANN_LIKE_ISA_DISPATCH(ret, name, body, params, args)                                     \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) static ret name##_avx512 params { \
    return body args;                                                                             \
  }                                                                                               \
  __attribute__((target("avx2"))) static ret name##_avx2 params { return body args; }             \
  static ret name##_baseline params { return body args; }                                         \
  ret name params { return ::cann_like::pick_isa(&name##_avx512, &name##_avx2, &name##_baseline) args; }
