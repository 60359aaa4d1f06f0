// torch.npu's random-number functions from npubridge._C: seeds, the Philox
// state of each device's own generator (Note [Random numbers are counter
// ranges], device_sim/generator.h), and that generator as a torch.Generator.
// Includes torch's pybind11 casters for at::Generator.
#include "bindings/bindings.h"

#include <torch/csrc/utils/pybind.h>

#include <npubridge/dispatcher/runtime.h>

#include "runtime/generator.h"
#include "runtime/npu_runtime.h"

#include <cstdint>

namespace py = pybind11;

namespace npub::torch_backend {

void bind_random(py::module_& m) {
  m.def("manual_seed", [](int d, uint64_t seed) { rt().devices().at(d).manual_seed(seed); });
  // torch.npu.default_generators[d]: the device's own generator as a
  // torch.Generator (the state manual_seed and get_rng_state see).
  m.def("default_generator", [](int d) { return default_generator(static_cast<c10::DeviceIndex>(d)); });
  m.def("get_rng_state", [](int d) {
    const auto s = rt().devices().at(d).philox_state();
    return py::make_tuple(s.seed, s.offset);
  });
  m.def("set_rng_state", [](int d, uint64_t seed, uint64_t offset) {
    rt().devices().at(d).set_philox_state({seed, offset});
  });
}

}  // namespace npub::torch_backend
