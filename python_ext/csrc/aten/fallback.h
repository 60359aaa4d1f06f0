// How calls reach the CPU (fallback.cpp): the torch call a dispatcher call
// serves, for the dispatcher's fallback (no plugin kernel for a call's
// dtypes), and PyTorch's boxed CPU fallback for the ops no plugin serves,
// counted per op in the dispatcher's stats (Dispatcher::record_host_fallback), warned once, refused under
// NPUB_FALLBACK=error.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <npubridge/dispatcher/dispatcher.h>

#include <string>

namespace npub::torch_backend {

// The torch call a dispatcher call serves, passed to the dispatcher as its
// host call (FallbackCall::host_call) so that the dispatcher's fallback runs
// ATen's CPU kernel on the caller's own arguments.
struct TorchCall {
  TorchCall(const c10::OperatorHandle* o, torch::jit::Stack* s) : op(o), stack(s) {}
  const c10::OperatorHandle* op;
  torch::jit::Stack* stack;  // null for an unboxed call until a fallback needs it
  bool fell_back = false;
  // An unboxed call's arguments, pushed onto `own` when the fallback needs a
  // stack (see Note [Unboxed entry for the common signatures]).
  void (*push_args)(const void* ctx, torch::jit::Stack& stack) = nullptr;
  const void* push_ctx = nullptr;
  torch::jit::Stack own;
};

// The dispatcher's fallback: ATen's CPU fallback on the torch call, outputs
// on the npu (Note [One way to the CPU]).
void torch_fallback(const FallbackCall& call);

// ATen's CPU fallback for the call on `stack`, counted and warned as a
// fallback of `op`.
void cpu_fallback_counted(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The op's meta kernel refused the call: ATen's CPU kernel decides. A user
// error (mismatched shapes, say) then raises ATen's own message without a
// "not supported" warning; only a call the CPU serves counts as a fallback.
void cpu_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace npub::torch_backend
