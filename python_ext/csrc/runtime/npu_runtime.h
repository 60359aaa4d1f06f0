// The process's npubridge runtime (devices, registry, dispatcher) and the
// current npu, as every file of npubridge._C reaches them.
#pragma once

#include <c10/core/Device.h>

#include <npubridge/dispatcher/runtime.h>

namespace npub::torch_backend {

inline Runtime& rt() { return Runtime::global(); }

inline c10::DeviceIndex current_index() {
  return static_cast<c10::DeviceIndex>(rt().devices().current_device());
}

}  // namespace npub::torch_backend
