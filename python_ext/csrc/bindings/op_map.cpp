// The op-mapping table from npubridge._C (npubridge.register_op,
// unregister_op, op_map): a mapping and the kernel that routes it
// (aten/mapped_ops.cpp), and the table's entries.
#include "bindings/bindings.h"

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/registry/op_registry.h>
#include <npubridge/support/error.h>

#include "aten/mapped_ops.h"
#include "runtime/npu_runtime.h"

#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_op_map(py::module_& m) {
  m.def("register_op",
        [](const std::string& framework_op, const std::string& target_op, const std::string& plugin) {
          try {
            map_op({framework_op, target_op, plugin});
          } catch (const Error& e) {
            throw py::value_error(e.what());
          }
        });
  m.def("unregister_op", [](const std::string& framework_op) {
    if (!unmap_op(framework_op))
      throw py::value_error("cannot unmap '" + framework_op + "': the op-mapping table does not map it");
  });
  m.def("op_map", [] {
    py::list out;
    for (const reg::OpMapping& e : rt().op_map().entries())
      out.append(py::make_tuple(e.framework_op, e.target_op, e.plugin));
    return out;
  });
}

}  // namespace npub::torch_backend
