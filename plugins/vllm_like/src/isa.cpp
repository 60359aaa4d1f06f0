#include "isa.h"

#include <plugin_kernels/isa_cap.h>

namespace vllm_like {

namespace {

Isa g_isa = Isa::kBaseline;

}  // namespace

void configure_isa_from_environment() {
  const plugin_kernels::IsaCap cap = plugin_kernels::isa_cap_from_environment("NPUB_VLLM_MAX_ISA");
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && cap >= plugin_kernels::IsaCap::kAvx512)
    g_isa = Isa::kAvx512;
  else if (avx2 && cap >= plugin_kernels::IsaCap::kAvx2)
    g_isa = Isa::kAvx2;
  else
    g_isa = Isa::kBaseline;
}

Isa isa() { return g_isa; }

}  // namespace vllm_like
