// Internal: one plugin kernel call as invoke_kernel makes it and as a graph
// replays it (captured_kernel.cpp).
#pragma once

#include "call_state.h"

#include <npubridge/device_sim/device.h>
#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/dispatcher/dispatcher.h>

#include <cstdint>
#include <string>

namespace npub {

// What a kernel's context is made of besides the arguments.
struct KernelLaunch {
  const reg::Kernel* kernel = nullptr;
  const std::string* op_name = nullptr;
  sim::Device* device = nullptr;
  sim::Stream* stream = nullptr;
  sim::Generator* generator = nullptr;  // the call's explicit generator; null: the device's
  DLDevice dl_device{};
  void* workspace = nullptr;
  uint64_t workspace_bytes = 0;
};

// Calls the kernel (scratch freed after it; the workspace is the caller's).
// Throws KernelError naming the op and the plugin.
void call_kernel_fn(const KernelLaunch& launch, const NpubValue* args, int32_t num_args, NpubValue* rets,
                    int32_t num_rets, OutputAllocator* outputs);
// The kernel's workspace size for these arguments (0 without a query).
uint64_t query_workspace(const KernelLaunch& launch, const NpubValue* args, int32_t num_args);

// Note [Capture records instead of running]: records the call in `graph`
// instead of running it. Returns the kernel would allocate are allocated
// now from the op's meta function (in the graph's pool); calls that cannot
// be recorded end the capture with an error naming the op (Graph::forbid).
void capture_kernel(sim::Graph& graph, const Dispatcher::CallState& cs, KernelLaunch launch,
                    const NpubValue* args, NpubValue* rets, OutputAllocator* outputs);

}  // namespace npub
