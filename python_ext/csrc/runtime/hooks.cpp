// The PrivateUse1 hooks and the default generator of npu tensors.
#include "runtime/hooks.h"

#include <ATen/Context.h>
#include <c10/core/Storage.h>

#include "runtime/allocator.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/npu_runtime.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace npub::torch_backend {

bool NpuHooks::isBuilt() const { return true; }

bool NpuHooks::isAvailable() const { return rt().devices().count() > 0; }

const at::Generator& NpuHooks::getDefaultGenerator(c10::DeviceIndex device_index) const {
  return default_generator(device_index);
}

at::Generator NpuHooks::getNewGenerator(c10::DeviceIndex device_index) const {
  return at::make_generator<NpuGeneratorImpl>(device_index < 0 ? current_index() : device_index);
}

at::Device NpuHooks::getDeviceFromPtr(void* data) const {
  for (int i = 0; i < rt().devices().count(); ++i)
    if (rt().devices().at(i).allocator().contains(data, 1))
      return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i)};
  return {c10::DeviceType::PrivateUse1, current_index()};
}

bool NpuHooks::hasPrimaryContext(c10::DeviceIndex) const { return true; }

// What ATen's lazy device initialisation runs (pin_memory() first of all):
// the devices start at import, so only a forked child has something to say
// (Note [A forked child cannot use the npu], device_sim/src/fork_guard.cpp).
void NpuHooks::init() const { check_not_in_bad_fork("torch.npu.init"); }

// Note [What pinning means for the simulated device], host_allocator.cpp.
bool NpuHooks::isPinnedPtr(const void* data) const { return is_npu_pinned(data); }

c10::Allocator* NpuHooks::getPinnedMemoryAllocator() const { return npu_host_allocator(); }

void NpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  c10::DataPtr fresh = npu_allocator()->allocate(newsize);
  const size_t keep = std::min(newsize, storage.nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage.data(), keep);
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
  const_cast<c10::Storage&>(storage).set_nbytes(newsize);
}

}  // namespace npub::torch_backend
