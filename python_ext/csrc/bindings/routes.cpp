// npubridge._C.routed_ops(): the ops registered for PyTorch, as
// register_plugin_ops.cpp and mapped_ops.cpp recorded them (native: aten ops
// a plugin implements under their own name; via_out: functional and in-place
// forms served by a plugin's .out op; custom: plugin ops outside aten;
// mapped: the op-mapping table's routes).
#include "bindings/bindings.h"

#include "aten/mapped_ops.h"
#include "aten/register_plugin_ops.h"

namespace py = pybind11;

namespace npub::torch_backend {

void bind_routes(py::module_& m) {
  m.def("routed_ops", [] {
    py::dict d;
    d["native"] = g_native;
    d["via_out"] = g_via_out;
    d["custom"] = g_custom;
    d["mapped"] = mapped_routes();
    return d;
  });
}

}  // namespace npub::torch_backend
