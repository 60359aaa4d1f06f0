// The CPU run of a call whose tensors share memory or carry a lazy
// conjugate or negative bit (aliased_fallback.cpp), for the fallback
// (fallback.cpp) when PyTorch's cpu_fallback would lose either: it copies
// each tensor on its own, so out=x beside input x becomes two tensors and
// ATen's overlap checks pass where they refuse on the CPU; and its copies
// to the CPU dispatch _to_copy, whose conjugate fallback clones on the npu,
// which falls back again.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

namespace npub::torch_backend {

// True when the call's arguments on `stack` need run_aliased_on_cpu: an npu
// tensor with the conjugate or negative bit, or a written npu tensor whose
// storage another tensor argument shares or whose elements overlap (an
// expanded out=, which cpu_fallback's copy would make dense).
bool needs_aliased_cpu_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// How the call's written npu tensors share memory with its other tensor
// arguments: not at all, only as the very same view (add(x, y, out=x), which
// ATen's elementwise ops allow), or otherwise (also: a written tensor that
// overlaps itself, or math bits).
enum class Sharing { kNone, kSameView, kOther };
Sharing written_sharing(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// Runs `op` on ATen's CPU kernel with every npu tensor argument replaced by
// a CPU view of the same geometry and math bits into one CPU copy of its
// storage (one copy per storage, so the CPU sees the sharing the npu
// tensors have), writes the written storages back, and leaves the returns
// on `stack` on `npu` (written arguments returned as themselves; a
// quantized return stays on the CPU, for the caller to refuse).
void run_aliased_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device npu);

}  // namespace npub::torch_backend
