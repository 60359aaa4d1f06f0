// The Python module npubridge._C. Each concept binds its own functions
// (bindings/bindings.h lists them and their files); this file only calls
// them in order.
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  using namespace npub::torch_backend;
  m.doc() = "npubridge: PyTorch on the simulated NPU through acceleration-library plugins";
  bind_backend(m);
  bind_compiled_program(m);
  bind_npu_graph(m);
  bind_device(m);
  bind_random(m);
  bind_stream(m);
  bind_memory(m);
  bind_plugins(m);
  bind_stats(m);
  bind_op_map(m);
  bind_precision(m);
  bind_registry(m);
  bind_routes(m);
  bind_fusion_patterns(m);
}
