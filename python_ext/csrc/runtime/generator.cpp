#include "runtime/generator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "runtime/npu_runtime.h"

#include <cstring>
#include <deque>
#include <mutex>

namespace npub::torch_backend {

namespace {

c10::Device npu(c10::DeviceIndex index) { return {c10::DeviceType::PrivateUse1, index}; }

}  // namespace

NpuGeneratorImpl::NpuGeneratorImpl(c10::DeviceIndex index)
    : c10::GeneratorImpl(npu(index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      owned_(std::make_shared<sim::Generator>()),
      philox_(owned_.get()) {}

NpuGeneratorImpl::NpuGeneratorImpl(c10::DeviceIndex index, sim::Generator& device_generator)
    : c10::GeneratorImpl(npu(index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      philox_(&device_generator) {}

void NpuGeneratorImpl::set_current_seed(uint64_t seed) { philox_->manual_seed(seed); }

void NpuGeneratorImpl::set_offset(uint64_t offset) { philox_->set_offset(offset); }

uint64_t NpuGeneratorImpl::get_offset() const { return philox_->state().offset; }

uint64_t NpuGeneratorImpl::current_seed() const { return philox_->state().seed; }

uint64_t NpuGeneratorImpl::seed() {
  const uint64_t s = c10::detail::getNonDeterministicRandom();
  philox_->manual_seed(s);
  return s;
}

void NpuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  TORCH_CHECK(new_state.numel() == 16,
              "npu generator: set_state expects a state of 16 bytes (seed and offset, "
              "as get_state() returns) but found ",
              new_state.numel());
  uint64_t words[2];
  std::memcpy(words, new_state.data(), sizeof(words));
  philox_->set_state({words[0], words[1]});
}

c10::intrusive_ptr<c10::TensorImpl> NpuGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  const sim::Generator::State s = philox_->state();
  const uint64_t words[2] = {s.seed, s.offset};
  std::memcpy(state.data_ptr(), words, sizeof(words));
  return state.getIntrusivePtr();
}

NpuGeneratorImpl* NpuGeneratorImpl::clone_impl() const {
  auto* copy = new NpuGeneratorImpl(device().index());
  copy->philox_->set_state(philox_->state());
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  // One per device, made on first use; a deque keeps the references the
  // hooks hand out stable.
  static std::mutex mu;
  static std::deque<at::Generator> generators;
  std::lock_guard<std::mutex> lock(mu);
  const int count = rt().devices().count();
  const c10::DeviceIndex i = index < 0 ? current_index() : index;
  TORCH_CHECK(i < count, "npu: no device ", static_cast<int>(i), " (", count, " devices)");
  while (static_cast<int>(generators.size()) < count) {
    const auto d = static_cast<c10::DeviceIndex>(generators.size());
    generators.push_back(at::make_generator<NpuGeneratorImpl>(d, rt().devices().at(d).generator()));
  }
  return generators[static_cast<size_t>(i)];
}

NpuGeneratorImpl* call_generator(const c10::IValue& generator, c10::DeviceIndex device, const char* op) {
  if (generator.isNone()) return default_generator(device).get<NpuGeneratorImpl>();
  const at::Generator& g = generator.toGenerator();
  TORCH_CHECK_TYPE(g.device().type() == c10::DeviceType::PrivateUse1, op,
                   ": expected a generator of device type 'npu' for argument 'generator' but found one of '",
                   g.device().str(), "'");
  return g.get<NpuGeneratorImpl>();
}

}  // namespace npub::torch_backend
