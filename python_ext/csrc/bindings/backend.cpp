// npubridge._C's start-up (Note [The runtime starts at the first npu use],
// init.cpp): the hooks at import, the runtime at the first npu use, whether
// it started, a forked child's state, and the device count, which must not
// start it.
#include "bindings/bindings.h"

#include <c10/util/Exception.h>

#include <npubridge/device_sim/fork_guard.h>
#include <npubridge/dispatcher/runtime.h>
#include <npubridge/support/error.h>

#include "init.h"

#include <stdexcept>
#include <utility>

namespace py = pybind11;

namespace npub::torch_backend {

namespace {

// Runs `f`, turning c10's error (what the start throws for a bad NPUB_*
// setting) into a RuntimeError with the message alone (pybind11 would show
// c10's C++ backtrace too).
template <class F>
auto message_only_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

}  // namespace

void bind_backend(py::module_& m) {
  m.def("_register_backend", &register_backend);
  m.def("_set_start_hook", [](py::function hook) {
    // Kept for the process's life (the runtime never stops).
    auto* held = new py::function(std::move(hook));
    set_python_start_hook([held] { (*held)(); });
  });
  m.def("_start", [] { message_only_errors(ensure_started); });
  m.def("_is_started", &runtime_started);
  // Note [A forked child cannot use the npu] (device_sim/src/fork_guard.cpp):
  // torch.npu._is_in_bad_fork() and the error torch.npu._lazy_init() raises.
  m.def("_is_in_bad_fork", [] { return runtime_started() && Runtime::global().devices().in_forked_child(); });
  m.def("_check_not_in_bad_fork", [] {
    if (runtime_started() && Runtime::global().devices().in_forked_child())
      sim::throw_forked_child("torch.npu");
  });
  // Does not start the runtime (torch.npu.device_count/is_available before
  // the first npu use); raises the start's error naming the variable for a
  // bad setting.
  m.def("device_count", [] { return message_only_errors(device_count_now); });
}

}  // namespace npub::torch_backend
