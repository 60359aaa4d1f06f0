// The PrivateUse1 hooks and the default generator of npu tensors.
#include "runtime/hooks.h"

#include <ATen/Context.h>
#include <c10/core/Storage.h>

#include <npubridge/device_sim/graph_capture.h>

#include "init.h"
#include "runtime/allocator.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/npu_runtime.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace npub::torch_backend {

bool NpuHooks::isBuilt() const { return true; }

// Answered from the settings until the runtime starts, which this does not
// do (Note [The runtime starts at the first npu use], init.cpp); a bad
// setting is no device.
bool NpuHooks::isAvailable() const {
  try {
    return device_count_now() > 0;
  } catch (const std::exception&) {
    return false;
  }
}

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

// What ATen's lazy device initialisation runs (a factory or .to() with an
// npu device, pin_memory()): starts the runtime (Note [The runtime starts
// at the first npu use], init.cpp); in a process forked after it started,
// the forked-child error (Note [A forked child cannot use the npu],
// device_sim/src/fork_guard.cpp).
void NpuHooks::init() const {
  if (runtime_started()) check_not_in_bad_fork("torch.npu.init");
  ensure_started();
}

// Note [What pinning means for the simulated device], host_allocator.cpp.
bool NpuHooks::isPinnedPtr(const void* data) const { return is_npu_pinned(data); }

c10::Allocator* NpuHooks::getPinnedMemoryAllocator() const { return npu_host_allocator(); }

void NpuHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  c10::DataPtr fresh = npu_allocator()->allocate(newsize);
  const size_t keep = std::min(newsize, storage.nbytes());
  // Inside a capture the old bytes are a record's to move (Note [Capture
  // records instead of running]): earlier records write them at replay.
  if (keep > 0 && sim::thread_is_capturing() && storage.device().is_privateuseone()) {
    int64_t bytes = static_cast<int64_t>(keep);
    DLTensor from{const_cast<void*>(storage.data()),
                  DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), storage.device().index()},
                  1,
                  DLDataType{kDLUInt, 8, 1},
                  &bytes,
                  nullptr,
                  0};
    DLTensor to = from;
    to.data = fresh.get();
    rethrow_as_torch([&] {
      sim::engine_copy(&rt().devices().at(storage.device().index()), to, from,
                       "resize_ (the storage's copy)");
    });
  } else if (keep > 0) {
    std::memcpy(fresh.get(), storage.data(), keep);
  }
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
  const_cast<c10::Storage&>(storage).set_nbytes(newsize);
}

}  // namespace npub::torch_backend
