// NPUB_MINDSPEED_MAX_ISA and the CPU's instruction sets (isa.h).
#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like {

namespace {
std::atomic<bool> g_avx2_allowed{true};
}  // namespace

void configure_isa_from_environment() {
  // As cann_like reads NPUB_CANN_MAX_ISA: white space aside, one of the names.
  const char* raw = std::getenv("NPUB_MINDSPEED_MAX_ISA");
  std::string v = raw ? raw : "";
  const size_t first = v.find_first_not_of(" \t\r\n");
  v = first == std::string::npos ? "" : v.substr(first, v.find_last_not_of(" \t\r\n") - first + 1);
  if (v != "" && v != "avx2" && v != "baseline")
    throw npub::sdk::Error(
        NPUB_ERR_INVALID_ARGUMENT,
        "NPUB_MINDSPEED_MAX_ISA: expected one of baseline, avx2 (or unset) but found '" + v + "'");
  g_avx2_allowed.store(v != "baseline", std::memory_order_relaxed);
}

bool has_avx2_fma() {
  static const bool cpu = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return cpu && g_avx2_allowed.load(std::memory_order_relaxed);
}

}  // namespace mindspeed_like
