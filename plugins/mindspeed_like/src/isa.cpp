// NPUB_MINDSPEED_MAX_ISA and the CPU's instruction sets (isa.h).
#include "isa.h"

#include <atomic>

#include <plugin_kernels/isa_cap.h>

namespace mindspeed_like {

namespace {
// The highest level allowed: 2 avx512, 1 avx2, 0 baseline.
std::atomic<int> g_max_level{2};
}  // namespace

void configure_isa_from_environment() {
  // As cann_like reads NPUB_CANN_MAX_ISA (plugin_kernels/isa_cap.h).
  g_max_level.store(static_cast<int>(plugin_kernels::isa_cap_from_environment("NPUB_MINDSPEED_MAX_ISA")),
                    std::memory_order_relaxed);
}

bool has_avx2_fma() {
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return cpu && g_max_level.load(std::memory_order_relaxed) >= 1;
}

bool has_avx512() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return cpu && has_avx2_fma() && g_max_level.load(std::memory_order_relaxed) >= 2;
}

}  // namespace mindspeed_like
