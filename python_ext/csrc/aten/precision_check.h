// The precision check from PyTorch (precision_check.cpp): while on
// (npubridge.precision_check), every routed call is run again through
// ATen's CPU kernels on copies of its inputs and judged by the op's error
// model; mismatches go to the dispatcher's report.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <npubridge/dispatcher/dispatcher.h>

#include <atomic>
#include <vector>

namespace npub::torch_backend {

extern std::atomic<bool> g_precision_on;

// CPU copies of a call's arguments, taken before the plugin runs.
std::vector<c10::IValue> cpu_copies(c10::ArrayRef<c10::IValue> args);

// Runs `op` through ATen on the CPU copies (in the op's dtype, in float64
// and on |inputs| as the op's error model asks) and judges the returns and
// written arguments the plugin left in `results` and `args`.
void check_against_cpu(const c10::OperatorHandle& op, const OpHandle& target,
                       std::vector<c10::IValue> cpu_args, c10::ArrayRef<c10::IValue> args,
                       const std::vector<c10::IValue>& results);

}  // namespace npub::torch_backend
