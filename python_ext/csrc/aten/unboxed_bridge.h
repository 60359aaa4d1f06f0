// The kernel a routed op is registered with (unboxed_bridge.cpp): an
// unboxed entry for the common signatures (Note [Unboxed entry for the
// common signatures]), else the boxed bridge.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "aten/bridge.h"

#include <string>

namespace npub::torch_backend {

// The kernel registered for a routed op: the unboxed entry when the schema
// has one of its shapes (Note [Unboxed entry for the common signatures]),
// else the boxed bridge.
torch::CppFunction bridge_kernel(Route route, const std::string& target, const c10::OperatorHandle& op,
                                 bool has_out = false);

}  // namespace npub::torch_backend
