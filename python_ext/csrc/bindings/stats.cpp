// The dispatcher's statistics from npubridge._C (npubridge.stats()): calls,
// fallbacks, conversions, errors and time per op, calls per kernel, and the
// reason of each op's latest fallback (Dispatcher::fallback_reasons).
#include "bindings/bindings.h"

#include <npubridge/dispatcher/runtime.h>

#include "runtime/npu_runtime.h"

#include <cstdint>
#include <map>
#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_stats(py::module_& m) {
  m.def("stats", [] {
    py::dict out;
    for (const auto& s : rt().dispatcher().stats()) {
      py::dict d;
      d["calls"] = s.calls;
      d["fallbacks"] = s.fallbacks;
      d["conversions"] = s.conversions;
      d["errors"] = s.errors;
      d["precision_mismatches"] = s.precision_mismatches;
      d["time_ms"] = s.total_ms;
      std::map<std::string, int64_t> calls_by_plugin;  // a plugin may have several kernels for the op
      py::list kernels;
      for (const auto& k : s.kernels) {
        if (k.calls > 0) calls_by_plugin[k.plugin] += k.calls;
        py::dict kd;
        kd["plugin"] = k.plugin;
        kd["dtypes"] = k.dtypes;
        kd["priority"] = k.priority;
        kd["calls"] = k.calls;
        kernels.append(kd);
      }
      py::dict by_plugin;
      for (const auto& [plugin, calls] : calls_by_plugin) by_plugin[py::str(plugin)] = calls;
      d["native"] = by_plugin;
      d["kernels"] = kernels;
      out[py::str(s.op)] = d;
    }
    return out;
  });
  // Per registry op, the reason of its latest fallback (a kernel's decline
  // message, or why no kernel was eligible).
  m.def("fallback_reasons", [] { return rt().dispatcher().fallback_reasons(); });
  m.def("reset_stats", [] { rt().dispatcher().reset_stats(); });
}

}  // namespace npub::torch_backend
