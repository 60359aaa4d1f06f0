// npu device memory for PyTorch: a c10::DeviceAllocator over the simulated
// NPU's caching allocator, with the stats torch.accelerator's memory
// functions read.
#include "runtime/allocator.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <npubridge/support/error.h>

#include "runtime/npu_runtime.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

namespace npub::torch_backend {

namespace {

// The deleter of a device's memory: one function per device index, the
// context being the pointer itself, so handing out a DataPtr allocates
// nothing on the host (see Note [A cache hit does not touch the heap]).
constexpr int kMaxDevices = 64;  // NPUB_SIM_DEVICES' upper bound
// In a forked child the memory is left alone (Note [A forked child cannot use
// the npu], device_sim/src/fork_guard.cpp): DeviceSet::at would throw, and a
// deleter must not.
template <int kDevice>
void free_on_device(void* ptr) {
  if (rt().devices().in_forked_child()) return;
  rt().devices().at(kDevice).free(ptr);
}
template <int... kDevices>
constexpr std::array<c10::DeleterFnPtr, sizeof...(kDevices)> make_deleters(
    std::integer_sequence<int, kDevices...>) {
  return {&free_on_device<kDevices>...};
}
constexpr auto kDeleters = make_deleters(std::make_integer_sequence<int, kMaxDevices>());

// Device memory from the simulated NPU's caching allocator, on the current
// device. The memory is reached only through the device's copy APIs. A
// c10::DeviceAllocator, so torch.accelerator's memory functions work too.
class NpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const int dev = rt().devices().current_device();
    void* p = nullptr;
    try {
      p = rt().devices().at(dev).allocate(n);
    } catch (const OutOfMemoryError& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
    TORCH_INTERNAL_ASSERT(dev >= 0 && dev < kMaxDevices, "npu: device index ", dev, " has no deleter");
    return {p, p, kDeleters[static_cast<size_t>(dev)],
            c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {
    for (int i = 0; i < rt().devices().count(); ++i) rt().devices().at(i).allocator().empty_cache();
  }
  // Blocks are stream-ordered and kernels run in stream order (Note [Blocks
  // are stream-ordered]); a tensor used on another stream is synchronised by
  // its user, as the caching allocator's note says.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const sim::AllocatorStats s = allocator_of(device).stats();
    c10::CachingDeviceAllocator::DeviceStats d;
    auto fill = [](c10::CachingDeviceAllocator::StatArray& a, int64_t current, int64_t peak,
                   int64_t allocated, int64_t freed) {
      auto& all = a[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      all.current = current;
      all.peak = peak;
      all.allocated = allocated;
      all.freed = freed;
    };
    fill(d.allocated_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.total_allocated_bytes,
         s.total_freed_bytes);
    fill(d.active_bytes, s.allocated_bytes, s.peak_allocated_bytes, s.total_allocated_bytes,
         s.total_freed_bytes);
    fill(d.reserved_bytes, s.reserved_bytes, s.peak_reserved_bytes, s.total_reserved_bytes,
         s.total_released_bytes);
    fill(d.requested_bytes, s.requested_bytes, s.requested_bytes, 0, 0);
    fill(d.allocation, s.active_blocks, s.active_blocks, s.num_allocs, s.num_frees);
    fill(d.active, s.active_blocks, s.active_blocks, s.num_allocs, s.num_frees);
    fill(d.segment, s.num_segments, s.num_segments, 0, 0);
    d.num_ooms = s.num_ooms;
    return d;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    allocator_of(device).reset_accumulated_stats();
  }
  void resetPeakStats(c10::DeviceIndex device) override { allocator_of(device).reset_peak_stats(); }
  // (free, total): the capacity not reserved by the cache, and the capacity.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    sim::CachingAllocator& a = allocator_of(device);
    const uint64_t reserved = static_cast<uint64_t>(a.stats().reserved_bytes);
    return {a.capacity() - std::min(reserved, a.capacity()), a.capacity()};
  }

 private:
  static sim::CachingAllocator& allocator_of(c10::DeviceIndex device) {
    TORCH_CHECK(device >= 0 && device < rt().devices().count(), "npu: device index ",
                static_cast<int>(device), " is out of range (", rt().devices().count(), " devices)");
    return rt().devices().at(device).allocator();
  }
};

NpuAllocator g_allocator;

}  // namespace

c10::Allocator* npu_allocator() { return &g_allocator; }

}  // namespace npub::torch_backend
