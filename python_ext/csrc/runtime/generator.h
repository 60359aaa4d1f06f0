// torch.Generator(device="npu"): PyTorch's generator interface over the
// simulated device's Philox generators (Note [Random numbers are counter
// ranges]). A device's default generator is the device's own, so that
// torch.npu.manual_seed, torch.manual_seed and C++ hosts share one stream;
// a generator made by torch.Generator(device="npu") owns its state.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <npubridge/device_sim/generator.h>

#include <memory>

namespace npub::torch_backend {

class NpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  // A generator of its own, seeded with PyTorch's default seed.
  explicit NpuGeneratorImpl(c10::DeviceIndex index);
  // The default generator of device `index`: the device's.
  NpuGeneratorImpl(c10::DeviceIndex index, sim::Generator& device_generator);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  // The state is a CPU ByteTensor of 16 bytes: the seed and the offset,
  // each a little-endian uint64 (the layout of CUDA's Philox state).
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  sim::Generator& philox() const { return *philox_; }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  NpuGeneratorImpl* clone_impl() const override;  // an independent copy of the state

  std::shared_ptr<sim::Generator> owned_;  // null for a device's default generator
  sim::Generator* philox_;
};

// The default generator of npu:`index` (the PrivateUse1 hooks' answer).
const at::Generator& default_generator(c10::DeviceIndex index);

// The generator of a call's `Generator?` argument: None gives the default
// generator of `device`; an npu generator itself; any other raises a
// TypeError naming the op and the generator's device.
NpuGeneratorImpl* call_generator(const c10::IValue& generator, c10::DeviceIndex device, const char* op);

}  // namespace npub::torch_backend
