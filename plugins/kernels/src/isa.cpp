// NPUB_PLUGINS_MAX_ISA and the CPU's level (plugin_kernels/isa.h).
#include <plugin_kernels/isa.h>

#include <npubridge/plugin_sdk.hpp>

#include <atomic>
#include <cstdlib>
#include <string>

namespace plugin_kernels {

namespace {

constexpr const char* kCapVariable = "NPUB_PLUGINS_MAX_ISA";

// The level kernel_isa() returns: the portable one until an initialize
// has read the cap.
std::atomic<Isa> g_level{Isa::kBaseline};

// The variable's value without surrounding white space ("" when unset).
std::string setting(const char* variable) {
  const char* raw = std::getenv(variable);
  const std::string v = raw ? raw : "";
  const size_t first = v.find_first_not_of(" \t\r\n");
  return first == std::string::npos ? "" : v.substr(first, v.find_last_not_of(" \t\r\n") - first + 1);
}

Isa cap_from_environment() {
  // The per-plugin caps of earlier releases: refused, so that a setting
  // that no longer caps anything is not silently ignored.
  for (const char* retired : {"NPUB_CANN_MAX_ISA", "NPUB_MINDSPEED_MAX_ISA", "NPUB_VLLM_MAX_ISA"}) {
    const std::string v = setting(retired);
    if (!v.empty())
      throw npub::sdk::Error(NPUB_ERR_INVALID_ARGUMENT,
                             std::string(retired) + ": expected unset (the in-tree " +
                                 "plugins read one cap, " + kCapVariable + ") but found '" + v + "'");
  }
  const std::string v = setting(kCapVariable);
  if (v.empty()) return Isa::kAvx512;
  for (const Isa level : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512})
    if (v == isa_name(level)) return level;
  throw npub::sdk::Error(NPUB_ERR_INVALID_ARGUMENT, std::string(kCapVariable) +
                                                        ": expected one of baseline, avx2, avx512 (or unset) "
                                                        "but found '" +
                                                        v + "'");
}

}  // namespace

const char* isa_name(Isa level) {
  static const char* const kNames[] = {"baseline", "avx2", "avx512"};  // in Isa's order
  return kNames[static_cast<int>(level)];
}

Isa cpu_isa() {
  static const Isa level = [] {
    __builtin_cpu_init();  // a no-op once libgcc's constructor has run
    const bool avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kBaseline;
  }();
  return level;
}

void configure_isa_from_environment(const char* plugin) {
  const Isa cap = cap_from_environment();
  const Isa cpu = cpu_isa();
  const Isa level = cap < cpu ? cap : cpu;
  g_level.store(level, std::memory_order_relaxed);
  const std::string cap_text = setting(kCapVariable);
  npub::sdk::host().log(NPUB_LOG_INFO, (std::string(plugin) + ": ISA level " + isa_name(level) +
                                        " for its own loops (the CPU's: " + isa_name(cpu) + "; " +
                                        kCapVariable + ": " + (cap_text.empty() ? "unset" : cap_text) + ")")
                                           .c_str());
}

Isa kernel_isa() { return g_level.load(std::memory_order_relaxed); }

}  // namespace plugin_kernels
