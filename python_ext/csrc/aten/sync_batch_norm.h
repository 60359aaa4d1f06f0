// SyncBatchNorm's ops on the CPU (sync_batch_norm.cpp). nn.SyncBatchNorm
// (torch/nn/modules/_functions.py) splits BatchNorm around its collectives
// into batch_norm_stats, batch_norm_gather_stats(_with_counts),
// batch_norm_elemt, batch_norm_backward_reduce and
// batch_norm_backward_elemt, which only CUDA implements: what no plugin
// serves runs here, composed of ATen's CPU ops with CUDA's math and its
// accumulation dtype (float for half and bfloat16), channels on dim 1 and
// any number of spatial dims (Note [Ops the CPU lacks] in fallback.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace npub::torch_backend {

// Whether `name` is one of SyncBatchNorm's ops (functional or .out), or
// batch_norm_update_stats, which the CPU has but whose running statistics
// its fallback would drop (Note [The gather ops write what their schema
// hides]).
bool is_sync_batch_norm_op(const c10::OperatorName& name);

// Runs SyncBatchNorm's op `op` on the CPU: pops its arguments from `stack`
// (tensors on any device) and pushes its returns as CPU tensors. The
// running statistics the gather ops update are written into the tensors
// given (npu ones included), as CUDA writes them, although the schema does
// not mark them (Note [The gather ops write what their schema hides]).
void run_sync_batch_norm_op_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace npub::torch_backend
