// torch.npu's stream functions from npubridge._C, streams by id within their
// device, and the timing of two events. Includes torch's THPEvent (the events
// themselves are the device guard's, runtime/guard.cpp).
#include "bindings/bindings.h"

#include <torch/csrc/Event.h>

#include <npubridge/dispatcher/runtime.h>

#include "runtime/npu_runtime.h"

#include <string>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_stream(py::module_& m) {
  // torch.npu.Stream() draws from the pool torch.Stream(device="npu") uses.
  m.def("stream_new", [](int d) { return rt().devices().at(d).pooled_stream().id(); });
  m.def("stream_synchronize", [](int d, int id) {
    py::gil_scoped_release nogil;
    rt().devices().at(d).stream(id).synchronize();
  });
  m.def("stream_query", [](int d, int id) { return rt().devices().at(d).stream(id).query(); });
  m.def("set_current_stream", [](int d, int id) {
    auto& dev = rt().devices().at(d);
    dev.set_current_stream(dev.stream(id));
  });
  m.def("current_stream", [](int d) { return rt().devices().at(d).current_stream().id(); });
  // torch.npu.Event.elapsed_time: torch.Event's own refuses a subclass
  // (it compares the exact type), so torch.npu.Event, a torch.Event, times
  // its c10::Event here.
  m.def("event_elapsed_ms", [](py::handle start, py::handle end) {
    for (py::handle e : {start, end}) {
      if (!THPEvent_Check(e.ptr())) {
        throw py::type_error(std::string("torch.npu.Event.elapsed_time: expected a torch.Event but found ") +
                             Py_TYPE(e.ptr())->tp_name);
      }
    }
    return reinterpret_cast<THPEvent*>(start.ptr())
        ->event.elapsedTime(reinterpret_cast<THPEvent*>(end.ptr())->event);
  });
}

}  // namespace npub::torch_backend
