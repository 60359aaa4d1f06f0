// torch.npu.NPUGraph and torch.accelerator.Graph's backend: the simulated
// device's graph capture (device_sim/graph_capture.h) behind PyTorch's
// at::GraphImplInterface (npu_graph.cpp; Python bindings in
// npu_graph_bindings.cpp).
#pragma once

#include <ATen/core/GraphImplInterface.h>
#include <ATen/core/Tensor.h>

#include <npubridge/device_sim/graph_capture.h>

#include <string>
#include <vector>

namespace npub::torch_backend {

// Note [Pool ids]: PyTorch's MempoolId_t is a pair; as CUDA's, a graph's own
// pool is {id, 0} and graph_pool_handle() gives {0, id}. Either way the id
// is the caching allocator's pool id (Note [Private pools]).
class NPUGraph final : public at::GraphImplInterface {
 public:
  explicit NPUGraph(const at::GraphImplArgs& args = {});
  // On the current device; `mode` Default is ThreadLocal.
  void capture_begin(at::MempoolId_t pool = {0, 0},
                     at::GraphCaptureMode mode = at::GraphCaptureMode::Default) override;
  void capture_end() override;
  void instantiate() override {}  // the records are the executable graph
  void replay() override;
  void reset() override;
  at::MempoolId_t pool() const override;
  void enable_debug_mode() override { debug_ = true; }
  // Writes one line per record ("kernel cann_like: aten::add.out"); needs
  // enable_debug_mode() first, as CUDA's.
  void debug_dump(const std::string& path) override;

  ~NPUGraph() override;
  std::vector<std::string> nodes() const { return graph_.describe(); }
  bool capturing() const { return graph_.capturing(); }
  const sim::Graph& graph() const { return graph_; }
  // Note [Captured constants]: keeps `t` alive until reset.
  void keep(at::Tensor t) { constants_.push_back(std::move(t)); }

 private:
  void forget();  // no longer the thread's capturing NPUGraph
  sim::Graph graph_;
  std::vector<at::Tensor> constants_;
  at::MempoolId_t pool_id_{0, 0};
  bool debug_ = false;
};

// Note [Captured constants]
// A 0-d CPU tensor argument (a Python number: x + 1) is a value of the call,
// as CUDA passes it to the kernel by value: inside a capture it is copied to
// the device once, at capture, into the ordinary cache (not the pool: a pool
// block may be an earlier intermediate that every replay writes again), and
// the capturing NPUGraph keeps that tensor until reset. Throws when the
// thread's capture was not begun through an NPUGraph.
at::Tensor capture_constant(const at::Tensor& cpu_scalar, c10::DeviceIndex device);

// A fresh pool id for graphs to share ({0, id}).
at::MempoolId_t graph_pool_handle();
// True when the calling thread captures on the current npu.
bool is_current_stream_capturing();
// Registers NPUGraph as the graph implementation of PrivateUse1 under the
// backend's current name (torch.accelerator.Graph looks it up by that name,
// which the rename to "npu" changes): call after the rename.
void register_graph_impl();

}  // namespace npub::torch_backend
