// The Python module npubridge._C, one concept per file, as PyTorch's OpenReg
// backend binds its own: each file defines one bind_<concept>(m), and
// module.cpp's PYBIND11_MODULE calls them in order.
//
// Build time: a file that includes a torch header (<torch/extension.h>,
// ATen) takes many times longer to compile than one with pybind11 and
// npubridge's headers alone, so a binding file includes torch only when the
// values it binds are torch's (a tensor, a generator, an event) or it needs a
// declaration that lives beside the ATen registrations. python_ext's
// CMakeLists.txt compiles the torch-free ones as a unity group of their own.
#pragma once

#include <pybind11/pybind11.h>
// Every binding file sees the same casters: pybind11 requires a type to be
// converted alike wherever it is (std::map, std::vector: stl.h).
#include <pybind11/stl.h>

namespace npub::torch_backend {

// Torch-free (pybind11, npubridge's headers, runtime/npu_runtime.h's c10).
void bind_backend(pybind11::module_& m);   // bindings/backend.cpp: start-up, forked child, device count
void bind_device(pybind11::module_& m);    // bindings/device.cpp: current device, synchronize, properties
void bind_memory(pybind11::module_& m);    // bindings/memory.cpp: the caching allocator's stats and cache
void bind_plugins(pybind11::module_& m);   // bindings/plugins.cpp: loaded plugins, failures, enabling
void bind_op_map(pybind11::module_& m);    // bindings/op_map.cpp: the op-mapping table
void bind_registry(pybind11::module_& m);  // bindings/registry.cpp: ops, derivative formulas, schemas
void bind_routes(pybind11::module_& m);    // bindings/routes.cpp: how each ATen op reaches the npu
void bind_fusion_patterns(pybind11::module_& m);  // compile/fusion_pattern_bindings.cpp

// With torch headers.
void bind_random(pybind11::module_& m);     // bindings/random.cpp: seeds, generators (at::Generator)
void bind_stream(pybind11::module_& m);     // bindings/stream.cpp: streams, event timing (THPEvent)
void bind_stats(pybind11::module_& m);      // bindings/stats.cpp: dispatch statistics (aten/fallback.h)
void bind_precision(pybind11::module_& m);  // bindings/precision.cpp: precision check, judge (at::Tensor)
void bind_compiled_program(pybind11::module_& m);  // compile/program_bindings.cpp
void bind_npu_graph(pybind11::module_& m);         // runtime/npu_graph_bindings.cpp

}  // namespace npub::torch_backend
