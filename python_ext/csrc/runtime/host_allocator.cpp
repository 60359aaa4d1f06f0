// Pinned host memory for the npu.
//
// Note [What pinning means for the simulated device]
// A real device can only DMA from page-locked host memory, so CUDA's
// pinned allocator locks pages and PyTorch code branches on is_pinned():
// DataLoader pins batches in a thread, non_blocking copies from pinned
// memory may overlap the host. The simulated device reads any host memory,
// so nothing needs locking (and mlock would fail under a small
// RLIMIT_MEMLOCK, turning a DataLoader flag into an error). What stays true
// is the contract PyTorch relies on: pinned memory is page-aligned memory
// handed out by this allocator, is_pinned() is true for exactly its bytes,
// and it is returned to the OS when the last tensor on it goes. Copies
// from and to it stay synchronous (non_blocking permits asynchrony and
// does not require it), so no block outlives a copy that reads it and
// record_event has nothing to wait for.
#include "runtime/host_allocator.h"

#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace npub::torch_backend {

namespace {

constexpr size_t kPage = 4096;

class NpuHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    const size_t size = (n + kPage - 1) / kPage * kPage;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK_WITH(OutOfMemoryError, p != MAP_FAILED, "npu pinned host memory: cannot allocate ", n,
                     " bytes (mmap of ", size, " bytes failed: ", std::strerror(errno), ")");
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_.emplace(reinterpret_cast<uintptr_t>(p), size);
      stats_.active_requests.increase(1);
      stats_.allocations.increase(1);
      stats_.active_bytes.increase(size);
      stats_.allocated_bytes.increase(size);
      ++stats_.num_host_alloc;
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // Note [What pinning means for the simulated device]: copies are
  // synchronous, so a block is never still in use by a stream.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  // Blocks go back to the OS when freed: there is no cache to empty.
  void empty_cache() override {}
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s :
         {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_accumulated();
    stats_.num_host_alloc = stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* s :
         {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes})
      s->reset_peak();
  }

  bool contains(const void* ptr) const {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(p);  // the first block starting after p
    if (it == blocks_.begin()) return false;
    --it;
    return p < it->first + it->second;
  }

 private:
  static void release(void* ptr);
  void free_block(void* ptr) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "npu pinned host memory: free of ", ptr,
                            ", which this allocator did not hand out");
      size = it->second;
      blocks_.erase(it);
      stats_.active_requests.decrease(1);
      stats_.allocations.decrease(1);
      stats_.active_bytes.decrease(size);
      stats_.allocated_bytes.decrease(size);
      ++stats_.num_host_free;
    }
    ::munmap(ptr, size);
  }

  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> blocks_;  // base -> mapped size, under mu_
  at::HostStats stats_;                 // under mu_
};

// A function-local static: the allocator outlives every pinned tensor,
// including ones Python frees at interpreter exit.
NpuHostAllocator& instance() {
  static auto* allocator = new NpuHostAllocator();
  return *allocator;
}

void NpuHostAllocator::release(void* ptr) {
  if (ptr != nullptr) instance().free_block(ptr);
}

}  // namespace

at::HostAllocator* npu_host_allocator() { return &instance(); }

bool is_npu_pinned(const void* ptr) { return ptr != nullptr && instance().contains(ptr); }

}  // namespace npub::torch_backend
