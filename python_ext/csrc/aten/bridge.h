// The boxed bridge (bridge.cpp): the kernel every routed op is registered
// with, from ATen's boxed call to npubridge's dispatcher, by one of three
// routes; and the dispatcher call with its errors as PyTorch's.
#pragma once

#include <ATen/core/boxing/OperatorKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

#include <npubridge/dispatcher/dispatcher.h>

#include "aten/routes.h"
#include "runtime/npu_runtime.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace npub::torch_backend {

// State resolved once at registration, so a call does no name lookups; the
// registry op is re-resolved only when the op-mapping table changes.
class Bridge final : public c10::OperatorKernel {
 public:
  Bridge(Route route, std::string target_name) : route_(route), target_name_(std::move(target_name)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack);

  void set_has_out(bool v) { has_out_ = v; }
  Route route() const { return route_; }

  // The registry op for this call: lock-free while the op-mapping table
  // stays as it was (an immutable resolution published by pointer; replaced
  // ones are kept until the process ends, like the registry's snapshots).
  OpHandle resolve() {
    const uint64_t v = rt().op_map().version();
    const Resolution* r = resolved_.load(std::memory_order_acquire);
    if (r != nullptr && r->map_version == v) return r->handle;
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back(std::make_unique<Resolution>(Resolution{rt().dispatcher().op(target_name_), v}));
    resolved_.store(retired_.back().get(), std::memory_order_release);
    return retired_.back()->handle;
  }

 private:
  struct Resolution {
    OpHandle handle;
    uint64_t map_version;
  };

  const Route route_;
  const std::string target_name_;
  bool has_out_ = false;
  std::atomic<const Resolution*> resolved_{nullptr};
  std::mutex mu_;  // writers of resolved_
  std::vector<std::unique_ptr<Resolution>> retired_;
};

struct TorchCall;  // fallback.h

// Dispatcher::call (or, with a plan, Dispatcher::run) for the torch call
// `call`, with its errors as PyTorch's: out of memory as
// torch.OutOfMemoryError, anything else as a RuntimeError with the message.
void call_dispatcher(const OpHandle& target, const NpubValue* args, int32_t num_args, NpubValue* rets,
                     int32_t num_rets, OutputAllocator* outs, TorchCall& call);
// The dispatcher call of an eager op by its signature's plan: the plan
// remembered for `key` (meta_cache.h's bytes of the call) on this thread,
// made by its first call (Dispatcher::plan, PlanInputs::kCall), or made
// again when the op-mapping table sent the op to another target since.
void call_planned(const std::string& key, const OpHandle& target, const NpubValue* args, int32_t num_args,
                  NpubValue* rets, int32_t num_rets, OutputAllocator* outs, TorchCall& call);

}  // namespace npub::torch_backend
