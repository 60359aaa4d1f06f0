// The registry from npubridge._C: its ops with their kernels, the derivative
// formulas plugins declared, for the package to register with
// torch.library.register_autograd (npubridge/_autograd.py), and its schema
// parser.
#include "bindings/bindings.h"

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/op_registry.h>
#include <npubridge/registry/schema.h>

#include "runtime/npu_runtime.h"

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_registry(py::module_& m) {
  // Derivative formulas plugins declared (NpubHostApi.define_derivative).
  m.def("derivatives", [] {
    py::list out;
    for (const reg::OpEntry* e : rt().registry().ops()) {
      const reg::Derivative* d = e->derivative();
      if (d == nullptr || e->kernels(NPUB_DEVICE_NPU).empty()) continue;
      py::dict r;
      r["op"] = e->name();
      r["backward"] = d->backward;
      r["formula"] = d->formula;
      r["plugin"] = d->plugin;
      py::list inputs, args;
      for (int32_t i : d->inputs) inputs.append(i);
      for (const auto& a : d->args)
        args.append(py::make_tuple(a.kind == reg::Derivative::Arg::kGrad     ? "grad"
                                   : a.kind == reg::Derivative::Arg::kResult ? "result"
                                                                             : "input",
                                   a.index));
      r["inputs"] = inputs;
      r["args"] = args;
      out.append(r);
    }
    return out;
  });
  // npubridge's schema parser, for the tests that hold it against PyTorch's
  // (Note [Defaults PyTorch takes], registry/src/schema.cpp): the canonical
  // text, or ValueError with the parser's message.
  m.def("parse_schema", [](const std::string& text) {
    try {
      return reg::parse_schema(text).to_string();
    } catch (const reg::SchemaError& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("ops", [](const std::string& plugin) {
    py::list out;
    for (const reg::OpEntry* e : rt().registry().ops()) {
      for (const reg::Kernel* k : e->kernels(NPUB_DEVICE_NPU)) {
        if (!plugin.empty() && k->plugin_name() != plugin) continue;
        py::dict d;
        d["op"] = e->name();
        d["plugin"] = k->plugin_name();
        d["dtypes"] = k->dtypes_string();
        d["priority"] = k->priority;
        d["schema"] = e->schema().to_string();
        out.append(d);
      }
    }
    return out;
  });
}

}  // namespace npub::torch_backend
