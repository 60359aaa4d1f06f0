// torch.npu's device functions from npubridge._C: the current device,
// synchronize, the device's properties and its DLPack device type.
#include "bindings/bindings.h"

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/plugin_api.h>

#include "runtime/npu_runtime.h"

namespace py = pybind11;

namespace npub::torch_backend {

void bind_device(py::module_& m) {
  // The npu's DLPack device type (npubridge/_dlpack.py).
  m.attr("DLPACK_DEVICE_TYPE") = static_cast<int>(NPUB_DEVICE_NPU);
  m.def("current_device", [] { return rt().devices().current_device(); });
  m.def("set_device", [](int d) { rt().devices().set_current_device(d); });
  m.def("synchronize", [](int d) {
    auto& ds = rt().devices();
    // Without the GIL, as stream_synchronize: a queued task may wait for a
    // thread that needs it (the npu backend's completer releasing a finished
    // collective's tensors; Note [The engine's threads are joined without
    // the GIL], distributed/collective_engine.cpp).
    py::gil_scoped_release nogil;
    if (d < 0)
      for (int i = 0; i < ds.count(); ++i) ds.at(i).synchronize();
    else
      ds.at(d).synchronize();
  });
  // torch.npu.get_device_properties: the simulated device's name, its
  // capacity (NPUB_SIM_MEMORY), its compute threads (NPUB_SIM_THREADS, as a
  // GPU's multiprocessors) and, as its "compute capability", the plugin ABI
  // version it runs kernels of (what a kernel may rely on, as sm_80 for CUDA).
  m.def("device_properties", [](int d) {
    auto& dev = rt().devices().at(d);
    py::dict r;
    r["name"] = "npubridge simulated NPU";
    r["total_memory"] = dev.allocator().capacity();
    r["multi_processor_count"] = dev.compute().num_threads();
    r["major"] = NPUB_ABI_MAJOR;
    r["minor"] = NPUB_ABI_MINOR;
    return r;
  });
}

}  // namespace npub::torch_backend
