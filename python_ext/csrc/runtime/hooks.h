// The PrivateUse1 hooks (hooks.cpp): what ATen asks the backend about
// itself (built, available, the device of a pointer, the default generator,
// host memory) and how an npu storage grows. Registered at init.
#pragma once

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace npub::torch_backend {

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override;
  bool isAvailable() const override;
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override;
  at::Generator getNewGenerator(c10::DeviceIndex device_index = -1) const override;
  at::Device getDeviceFromPtr(void* data) const override;
  bool hasPrimaryContext(c10::DeviceIndex) const override;
  void init() const override;
  bool isPinnedPtr(const void* data) const override;
  c10::Allocator* getPinnedMemoryAllocator() const override;
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace npub::torch_backend
