// isa_cap_from_environment (plugin_kernels/isa_cap.h).
#include <plugin_kernels/isa_cap.h>

#include <npubridge/plugin_sdk.hpp>

#include <cstdlib>
#include <string>

namespace plugin_kernels {

IsaCap isa_cap_from_environment(const char* variable) {
  const char* raw = std::getenv(variable);
  std::string v = raw ? raw : "";
  const size_t first = v.find_first_not_of(" \t\r\n");
  v = first == std::string::npos ? "" : v.substr(first, v.find_last_not_of(" \t\r\n") - first + 1);
  if (v.empty() || v == "avx512") return IsaCap::kAvx512;
  if (v == "avx2") return IsaCap::kAvx2;
  if (v == "baseline") return IsaCap::kBaseline;
  throw npub::sdk::Error(NPUB_ERR_INVALID_ARGUMENT, std::string(variable) +
                                                        ": expected one of baseline, avx2, avx512 (or unset) "
                                                        "but found '" +
                                                        v + "'");
}

}  // namespace plugin_kernels
