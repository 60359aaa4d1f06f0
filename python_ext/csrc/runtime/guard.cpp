// The device guard of npu tensors (c10's DeviceGuardImplInterface,
// registered for PrivateUse1 when the module loads): the current device,
// streams (the simulated device's streams, with a small pool for new ones)
// and events (the simulator's events).
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <npubridge/support/error.h>

#include "runtime/npu_runtime.h"

#include <map>
#include <mutex>
#include <vector>

namespace npub::torch_backend {

namespace {

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kType, current_index()}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected an npu device but got ", d);
    if (d.index() >= 0) rt().devices().set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      if (d.index() >= 0) rt().devices().set_current_device(d.index());
    } catch (...) {
    }
  }
  // Streams are the device's simulated streams; a c10::Stream's id is the
  // stream's id within its device (0: the default stream).
  static c10::Stream to_c10(const sim::Stream& s) {
    return c10::Stream(c10::Stream::UNSAFE,
                       c10::Device(kType, static_cast<c10::DeviceIndex>(s.device_index())),
                       static_cast<c10::StreamId>(s.id()));
  }
  static sim::Device& device_of(c10::Device d) {
    return rt().devices().at(d.index() < 0 ? current_index() : d.index());
  }
  static sim::Stream& from_c10(const c10::Stream& s) {
    return device_of(s.device()).stream(static_cast<int>(s.id()));
  }
  c10::Stream getStream(c10::Device d) const override { return to_c10(device_of(d).current_stream()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return to_c10(device_of(d).stream(0)); }
  // New streams come from the device's pool (Device::pooled_stream), the
  // same one torch.npu.Stream() draws from.
  c10::Stream getNewStream(c10::Device d, int) const override { return to_c10(device_of(d).pooled_stream()); }
  // What c10::ivalue::Future runs its then() callbacks on (the futures of
  // the npu distributed backend carry their device: DDP's comm hooks).
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return to_c10(device_of(d).pooled_stream());
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    sim::Device& dev = device_of(s.device());
    const c10::Stream old = to_c10(dev.current_stream());
    dev.set_current_stream(from_c10(s));
    return old;
  }
  bool queryStream(const c10::Stream& s) const override { return from_c10(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override { from_c10(s).synchronize(); }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(rt().devices().count());
    } catch (...) {
      return 0;
    }
  }
  // torch.accelerator.get_device_capability: the dtypes an npu tensor can
  // hold, every one but the quantized types (quantized tensors are refused
  // on npu: Note [Quantized tensors stay on the CPU], aten/fallback.cpp).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    (void)device_of(d);  // range-checks the index
    c10::DeviceCapability cap;
    auto& types = cap.capability_data.supported_scalar_types;
    types.has_QInt8 = types.has_QUInt8 = types.has_QInt32 = types.has_QUInt4x2 = types.has_QUInt2x4 = 0;
    return cap;
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    rt().devices().at(index < 0 ? current_index() : index).synchronize();
  }
  // Events are the simulator's events (completion and timing follow the
  // stream's queued work).
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new sim::Event();
    static_cast<sim::Event*>(*event)->record(from_c10(s));
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event != nullptr) from_c10(s).wait_event(*static_cast<sim::Event*>(event));
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || static_cast<sim::Event*>(event)->query();
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) static_cast<sim::Event*>(event)->synchronize();
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "npu: elapsed_time needs both events recorded");
    try {
      return static_cast<sim::Event*>(start)->elapsed_ms(*static_cast<sim::Event*>(end));
    } catch (const Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<sim::Event*>(event);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

}  // namespace

}  // namespace npub::torch_backend
