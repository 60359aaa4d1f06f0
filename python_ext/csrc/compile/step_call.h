// A kernel step's call as the dispatcher takes it (step_call.cpp): its
// NpubValue arguments and returns over the slots' DLTensors, and its plan.
// The loop builds it once per step (Note [One loop over resolved steps],
// program.cpp); the lowering asks the plan of a step before any memory
// exists (Note [A plan's returns are its kernel's], dispatcher).
#pragma once

#include <npubridge/dispatcher/dispatcher.h>

#include "compile/program.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace npub::torch_backend {

struct Boxed;  // aten/boxing.h

// A slot's DLTensor: the spec's dtype, sizes and strides on npu:`device`;
// its data stays NULL until a run places it.
void describe_slot(DLTensor& dl, const SlotSpec& spec, int device);

struct StepCall {
  StepCall();
  ~StepCall();
  StepCall(StepCall&&) noexcept;
  std::unique_ptr<Boxed> boxed;  // the values' storage (lists, strings, scalars moved to the device)
  std::vector<std::vector<DLTensor*>> lists;
  std::vector<NpubValue> args, rets;
};

// The registry op `target`'s arguments and returns for `spec`: the ATen
// op's arguments, then (the .out route) its outputs as out=; `dl_of(slot)`
// gives a slot's DLTensor. Throws c10::Error naming the node.
void box_step(const StepSpec& spec, const OpHandle& target, int device,
              const std::function<DLTensor*(int64_t)>& dl_of, StepCall& out);

// The plan of a kernel step from the specs of the slots it names alone
// (PlanInputs::kMetadata): its kernel and conversion, or why the fallback
// serves it, and what the kernel returns (CallPlan::returns). Throws
// c10::Error naming the node on arguments the dispatcher rejects.
CallPlan plan_step(int device, const std::unordered_map<int64_t, SlotSpec>& slots, const StepSpec& spec);

}  // namespace npub::torch_backend
