#include "runtime/npu_graph.h"

#include <ATen/ops/empty.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <npubridge/device_sim/caching_allocator.h>
#include <npubridge/device_sim/device.h>
#include <npubridge/dispatcher/trace.h>

#include "aten/boxing.h"
#include "runtime/npu_runtime.h"

#include <npubridge/device_sim/copy_engine.h>

#include <algorithm>
#include <fstream>
#include <memory>

namespace npub::torch_backend {

namespace {

sim::CaptureMode capture_mode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::Global:
      return sim::CaptureMode::kGlobal;
    case at::GraphCaptureMode::Relaxed:
      return sim::CaptureMode::kRelaxed;
    case at::GraphCaptureMode::Default:
    case at::GraphCaptureMode::ThreadLocal:
      break;
  }
  return sim::CaptureMode::kThreadLocal;
}

// The thread's NPUGraphs that began a capture (entries are checked with
// capturing(): a forbidden op ends the capture below them).
thread_local std::vector<NPUGraph*> tls_npu_graphs;

}  // namespace

NPUGraph::NPUGraph(const at::GraphImplArgs&) {}

NPUGraph::~NPUGraph() { forget(); }

void NPUGraph::forget() {
  tls_npu_graphs.erase(std::remove(tls_npu_graphs.begin(), tls_npu_graphs.end(), this), tls_npu_graphs.end());
}

void NPUGraph::capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) {
  sim::Device& device = rt().devices().at(current_index());
  // Note [Pool ids].
  const uint64_t id = pool.first != 0 ? pool.first : pool.second;
  rethrow_as_torch([&] { graph_.capture_begin(device, id, capture_mode(mode)); });
  pool_id_ = id != 0 ? pool : at::MempoolId_t{graph_.pool(), 0};
  tls_npu_graphs.push_back(this);
}

void NPUGraph::capture_end() {
  forget();
  rethrow_as_torch([&] { graph_.capture_end(); });
}

void NPUGraph::replay() {
  // One profiler slice for the replay; the replayed kernels' slices nest
  // under it (CapturedKernel::replay).
  const trace::Scope slice(trace::Kind::kReplay, [&] {
    return "NPUGraph.replay (" + std::to_string(graph_.num_nodes()) + " records)";
  });
  rethrow_as_torch([&] { graph_.replay(); });
}

void NPUGraph::reset() {
  forget();
  constants_.clear();  // before the pool goes
  rethrow_as_torch([&] { graph_.reset(); });
  pool_id_ = {0, 0};
}

at::Tensor capture_constant(const at::Tensor& cpu_scalar, c10::DeviceIndex device) {
  sim::Device& dev = rt().devices().at(device);
  NPUGraph* owner = nullptr;
  for (NPUGraph* g : tls_npu_graphs)
    if (g->capturing() && g->graph().device() == &dev) owner = g;
  // Work on another device than the capture's: that error, naming both.
  rethrow_as_torch([&] {
    sim::capture_target(dev, dev.current_stream(),
                        [] { return std::string("an op with a CPU scalar argument"); });
  });
  TORCH_CHECK(owner != nullptr, "npu:", device,
              " graph capture: a CPU scalar argument inside a capture needs the capture to be begun through "
              "torch.npu.NPUGraph (which keeps its device copy)");
  // From the ordinary cache, not the pool: a pool block may have been an
  // earlier intermediate of this capture, which the replay writes again
  // before the constant's reader runs (the value is written once, now).
  struct OutsideThePool {
    sim::Device& dev;
    uint64_t pool;
    OutsideThePool(sim::Device& d, uint64_t p) : dev(d), pool(p) { dev.allocator().end_pool_route(); }
    ~OutsideThePool() { dev.allocator().begin_pool_route(pool); }
  };
  at::Tensor t;
  {
    const OutsideThePool outside(dev, owner->graph().pool());
    t = at::empty({}, cpu_scalar.options().device(c10::DeviceType::PrivateUse1, device));
  }
  // The value is known now and is the call's constant: the copy runs at
  // capture (not recorded), from the host.
  sim::copy_tensor(DLView(t).dl, DLView(cpu_scalar).dl);
  owner->keep(t);
  return t;
}

at::MempoolId_t NPUGraph::pool() const {
  TORCH_CHECK(pool_id_ != at::MempoolId_t(0, 0),
              "NPUGraph.pool(): the graph has no pool yet (called before capture_begin or after reset)");
  return pool_id_;
}

void NPUGraph::debug_dump(const std::string& path) {
  TORCH_CHECK(debug_, "NPUGraph.debug_dump: call enable_debug_mode() before capturing");
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "NPUGraph.debug_dump: cannot write '", path, "'");
  for (const std::string& line : graph_.describe()) out << line << '\n';
}

at::MempoolId_t graph_pool_handle() { return {0, sim::CachingAllocator::new_pool_id()}; }

bool is_current_stream_capturing() {
  if (!sim::thread_is_capturing()) return false;
  return sim::capturing_graph(rt().devices().at(current_index())) != nullptr;
}

void register_graph_impl() {
  const std::string key = c10::DeviceTypeName(c10::DeviceType::PrivateUse1, /*lower_case=*/false);
  if (at::GraphImplRegistry()->Has(key)) return;
  at::GraphImplRegistry()->Register(key,
                                    [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
                                      return std::make_unique<NPUGraph>(args);
                                    });
}

}  // namespace npub::torch_backend

// Before the rename the backend's name is "PrivateUse1"; register_graph_impl
// adds the renamed key. (The registry's macros name it unqualified: at::.)
namespace at {
REGISTER_GRAPH_IMPL(PrivateUse1, npub::torch_backend::NPUGraph);
}  // namespace at
