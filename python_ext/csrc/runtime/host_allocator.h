// Pinned host memory for the npu (host_allocator.cpp): what
// Tensor.pin_memory(), torch.empty(..., pin_memory=True) and
// DataLoader(pin_memory=True) allocate, and what Tensor.is_pinned()
// recognises. Set as PrivateUse1's host allocator at init and returned by
// the hooks' getPinnedMemoryAllocator.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace npub::torch_backend {

at::HostAllocator* npu_host_allocator();

// True when `ptr` lies inside a live block of npu_host_allocator() (any
// byte of it, as CUDA answers for a view into pinned memory).
bool is_npu_pinned(const void* ptr);

}  // namespace npub::torch_backend
