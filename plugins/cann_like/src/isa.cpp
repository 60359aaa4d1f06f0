#include "isa.h"

#include <plugin_kernels/isa_cap.h>

#include <atomic>

namespace cann_like {

// Note [One ISA cap for the plugin's own kernels]
// cann_like's hand-written loops come in AVX-512, AVX2 and baseline x86-64
// variants, plus F16C conversions; oneDNN (GEMM) picks its own. The correctness suite must pass on whichever
// path a CPU takes, so one CI run forces every path down to the portable one: oneDNN through
// ONEDNN_MAX_CPU_ISA, these kernels through NPUB_CANN_MAX_ISA, ATen (the
// reference) through ATEN_CPU_CAPABILITY. The variants are picked here, at
// run time, rather than by the loader's ifunc resolution (target_clones),
// which follows the CPU alone and cannot be capped.

namespace {
std::atomic<int> g_cap{static_cast<int>(Isa::kAvx512)};

Isa cpu_isa() {
  static const Isa isa = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
                             ? Isa::kAvx512
                         : __builtin_cpu_supports("avx2") ? Isa::kAvx2
                                                          : Isa::kBaseline;
  return isa;
}
}  // namespace

static_assert(static_cast<int>(plugin_kernels::IsaCap::kAvx512) == static_cast<int>(Isa::kAvx512) &&
              static_cast<int>(plugin_kernels::IsaCap::kBaseline) == static_cast<int>(Isa::kBaseline));

void configure_isa_from_environment() {
  // Read as the host reads its own settings (plugin_kernels/isa_cap.h); the
  // levels are the same numbers.
  g_cap.store(static_cast<int>(plugin_kernels::isa_cap_from_environment("NPUB_CANN_MAX_ISA")),
              std::memory_order_relaxed);
}

Isa kernel_isa() {
  const int cap = g_cap.load(std::memory_order_relaxed);
  const int cpu = static_cast<int>(cpu_isa());
  return static_cast<Isa>(cap < cpu ? cap : cpu);
}

bool use_f16c() {
  static const bool cpu = __builtin_cpu_supports("f16c");
  return cpu && kernel_isa() >= Isa::kAvx2;
}

}  // namespace cann_like
