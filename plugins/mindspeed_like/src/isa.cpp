// NPUB_MINDSPEED_MAX_ISA and the CPU's instruction sets (isa.h).
#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like {

namespace {
// The highest level allowed: 2 avx512, 1 avx2, 0 baseline.
std::atomic<int> g_max_level{2};
}  // namespace

void configure_isa_from_environment() {
  // As cann_like reads NPUB_CANN_MAX_ISA: white space aside, one of the names.
  const char* raw = std::getenv("NPUB_MINDSPEED_MAX_ISA");
  std::string v = raw ? raw : "";
  const size_t first = v.find_first_not_of(" \t\r\n");
  v = first == std::string::npos ? "" : v.substr(first, v.find_last_not_of(" \t\r\n") - first + 1);
  if (v != "" && v != "avx512" && v != "avx2" && v != "baseline")
    throw npub::sdk::Error(
        NPUB_ERR_INVALID_ARGUMENT,
        "NPUB_MINDSPEED_MAX_ISA: expected one of baseline, avx2, avx512 (or unset) but found '" + v + "'");
  g_max_level.store(v == "baseline" ? 0 : v == "avx2" ? 1 : 2, std::memory_order_relaxed);
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
