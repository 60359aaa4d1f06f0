// The plugins from npubridge._C (`python3 -m npubridge plugins`,
// npubridge.plugins()): those loaded, with their op counts, those rejected
// and skipped; and what decides which of their kernels are eligible, each
// plugin's switch and the optimisation level.
#include "bindings/bindings.h"

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/op_registry.h>

#include "runtime/npu_runtime.h"

#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_plugins(py::module_& m) {
  m.def("plugins", [] {
    py::list out;
    for (const auto& p : rt().loader().plugins()) {
      int ops = 0;
      for (const reg::OpEntry* e : rt().registry().ops())
        for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU))
          if (k->plugin.get() == p.get()) {
            ++ops;
            break;
          }
      py::dict d;
      d["name"] = p->name;
      d["version"] = p->version;
      d["path"] = p->path;
      d["abi"] = "1." + std::to_string(p->abi_minor);
      d["ops"] = ops;
      d["enabled"] = p->enabled.load();
      out.append(d);
    }
    return out;
  });
  // Whether the plugin named `name` is loaded and enabled (None: not
  // loaded): what SDPA's backend choice asks on every call, without
  // plugins()'s count of each plugin's ops (70 us).
  m.def("plugin_enabled", [](const std::string& name) -> py::object {
    for (const auto& p : rt().loader().plugins())
      if (p->name == name) return py::bool_(p->enabled.load());
    return py::none();
  });
  m.def("load_failures", [] {
    py::list out;
    for (const auto& f : rt().loader().failures()) out.append(f.error);
    return out;
  });
  // Libraries of a scanned directory that are not plugins (Note [A directory
  // may hold libraries that are not plugins], plugin_loader.h).
  m.def("load_skipped", [] {
    py::list out;
    for (const auto& f : rt().loader().skipped()) out.append(f.error);
    return out;
  });
  m.def("enable_plugin", [](const std::string& name, bool on) {
    auto p = rt().loader().plugin(name);
    if (!p) throw py::value_error("no plugin named '" + name + "' is loaded");
    p->enabled = on;
  });
  m.def("set_optim_level", [](int level) { rt().dispatcher().set_opt_level(level); });
  m.def("optim_level", [] { return rt().dispatcher().opt_level(); });
}

}  // namespace npub::torch_backend
