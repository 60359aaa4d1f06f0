// The Meta kernel of plugin ops outside aten (meta_bridge.cpp).
#pragma once

#include <ATen/core/boxing/OperatorKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

#include <string>

namespace npub::torch_backend {

// The Meta kernel of a plugin's own op: its outputs' shapes and dtypes from
// the meta function the plugin registered (Dispatcher::infer_meta), on meta
// tensors; what fake tensors, torch.compile and torch.export trace with.
class MetaBridge final : public c10::OperatorKernel {
 public:
  explicit MetaBridge(std::string target_name) : target_name_(std::move(target_name)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack);

 private:
  const std::string target_name_;
};

}  // namespace npub::torch_backend
