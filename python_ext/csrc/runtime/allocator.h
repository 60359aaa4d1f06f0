// The allocator of npu tensors' storage (allocator.cpp): device memory from
// the simulated NPU's caching allocator, on the current device. Set as
// PrivateUse1's allocator at init; the npu factories and storage resizes
// allocate through it.
#pragma once

#include <c10/core/Allocator.h>

namespace npub::torch_backend {

c10::Allocator* npu_allocator();

}  // namespace npub::torch_backend
