// Python bindings of graph capture: npubridge._C._NPUGraph (what
// torch.npu.NPUGraph wraps, npubridge/_graphs.py), the pool handle, the
// capture query and the registration for torch.accelerator.Graph.
#include "bindings/bindings.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "runtime/npu_graph.h"

#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

namespace {

at::GraphCaptureMode parse_mode(const std::string& mode) {
  if (mode == "thread_local" || mode == "default") return at::GraphCaptureMode::ThreadLocal;
  if (mode == "global") return at::GraphCaptureMode::Global;
  if (mode == "relaxed") return at::GraphCaptureMode::Relaxed;
  throw py::value_error(
      "capture_error_mode: expected 'default', 'global', 'thread_local' or 'relaxed' but found '" + mode +
      "'");
}

}  // namespace

void bind_npu_graph(py::module& m) {
  py::class_<NPUGraph>(m, "_NPUGraph")
      .def(py::init<>())
      .def(
          "capture_begin",
          [](NPUGraph& g, std::pair<uint64_t, uint64_t> pool, const std::string& mode) {
            g.capture_begin(pool, parse_mode(mode));
          },
          py::arg("pool") = std::pair<uint64_t, uint64_t>{0, 0},
          py::arg("capture_error_mode") = "thread_local")
      .def("capture_end", &NPUGraph::capture_end)
      .def("replay", &NPUGraph::replay, py::call_guard<py::gil_scoped_release>())
      .def("reset", &NPUGraph::reset)
      .def("pool", &NPUGraph::pool)
      .def("enable_debug_mode", &NPUGraph::enable_debug_mode)
      .def("debug_dump", &NPUGraph::debug_dump)
      .def("nodes", &NPUGraph::nodes)
      .def("capturing", &NPUGraph::capturing);
  m.def("_graph_pool_handle", &graph_pool_handle);
  m.def("_is_current_stream_capturing", &is_current_stream_capturing);
  m.def("_register_graph_impl", &register_graph_impl);
}

}  // namespace npub::torch_backend
