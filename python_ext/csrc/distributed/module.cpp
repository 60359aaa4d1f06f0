// The Python module npubridge._C_dist: the npu backend's class, which
// npubridge/distributed/__init__.py wraps around a ProcessGroupGloo in the
// creator it registers with torch.distributed.
//
// Note [_C_dist is built against torch's own pybind11]
// The class derives from c10d::Backend as torch._C binds it, and receives a
// ProcessGroupGloo made in Python: both need the pybind11 internals of
// torch._C, which pybind11 keys by its internals version. pip's pybind11
// (3.1, internals 12) and torch's bundled copy (3.0.4, internals 11) do not
// share them, so this module compiles against the headers under
// torch/include (python_ext/CMakeLists.txt does not link pybind11::module
// for it) and `_check_interop` below proves the sharing at import.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/process_group_npu.h"

namespace py = pybind11;

PYBIND11_MODULE(_C_dist, m) {
  m.doc() = "npubridge's torch.distributed backend for npu tensors (gloo transport, pinned staging)";
  // c10d::Backend's Python type must exist before a subclass binds to it.
  py::module_::import("torch._C._distributed_c10d");

  py::class_<npub::dist::ProcessGroupNPU, c10d::Backend, c10::intrusive_ptr<npub::dist::ProcessGroupNPU>>(
      m, "ProcessGroupNPU",
      "The npu backend: npu tensors staged through pinned host memory, carried by `gloo` (a ProcessGroupGloo "
      "of "
      "the same ranks). Made by the creator registered for \"npu\" (npubridge.distributed).")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& gloo, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<npub::dist::ProcessGroupNPU>(gloo, rank, size, timeout);
           }),
           py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("timeout"))
      .def_property_readonly("gloo", &npub::dist::ProcessGroupNPU::gloo,
                             "The ProcessGroupGloo that carries the data")
      .def_property_readonly("broken_reason", &npub::dist::ProcessGroupNPU::broken_reason,
                             "The failure that made the group unusable, or ''");

  // Returns the backend it was given: a gloo backend made in Python comes
  // back as the same Python object only when the internals are shared
  // (Note [_C_dist is built against torch's own pybind11]).
  m.def("_check_interop", [](const c10::intrusive_ptr<c10d::Backend>& backend) { return backend; });
}
