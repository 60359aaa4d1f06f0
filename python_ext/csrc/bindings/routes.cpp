// npubridge._C.routes(): the route table (aten/routes.h), typed: how each op
// registered for PyTorch reaches the dispatcher (op, kind: direct / via_out
// / inplace_via_out, target, origin: aten / custom / mapped). The lowering
// and npubridge.routed_ops() read it.
#include "bindings/bindings.h"

#include <pybind11/stl.h>

#include "aten/routes.h"

#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_routes(py::module_& m) {
  py::class_<RouteEntry>(m, "Route")
      .def_readonly("op", &RouteEntry::op)
      .def_property_readonly("kind", [](const RouteEntry& e) { return route_name(e.route); })
      .def_readonly("target", &RouteEntry::target)
      .def_property_readonly("origin", [](const RouteEntry& e) { return route_origin_name(e.origin); })
      .def("__repr__", [](const RouteEntry& e) {
        return "Route(" + e.op + " -> " + e.target + ", " + route_name(e.route) + ", " +
               route_origin_name(e.origin) + ")";
      });
  m.def("routes", &routes);
}

}  // namespace npub::torch_backend
