// The fork handler and the forked-child error of the simulated NPU (see
// fork_guard.h).
#include <npubridge/device_sim/fork_guard.h>
#include <npubridge/support/error.h>

#include <pthread.h>

#include <atomic>
#include <mutex>

namespace npub::sim {

// Note [A forked child cannot use the npu]
// fork() copies a process's memory but only the thread that called it. A
// child forked while the simulated devices run has none of their compute
// threads or stream workers, and a device lock (allocator, stream queue,
// compute pool, generator) that another thread held at that moment stays
// locked in the child forever: the child's first npu op would wait on a
// thread that does not exist or a lock nobody will release.
// As PyTorch does for CUDA, the child is refused instead of hanging:
//  - a handler registered with pthread_atfork when the first device object
//    is made counts, in each child, one more fork generation (a lock-free
//    atomic increment: all a child handler may do);
//  - every device object (DeviceSet, Device, Stream, Event, CachingAllocator,
//    ComputePool) holds a ForkGuard that remembers the generation it was
//    made in; in a later generation its entry points throw
//    throw_forked_child's error before they take a lock or wait on a thread
//    (DeviceSet::at, Device::synchronize, Stream::push, synchronize and
//    wait_event, Event::record and synchronize, CachingAllocator::allocate);
//    ComputePool::parallel_for, which kernels call behind the C ABI where
//    nothing may throw, runs the loop on the calling thread alone;
//  - memory freed in the child is not returned to the allocator (its lock may
//    be held; the block is the parent's, and the child's copy of the heap
//    goes away with the child), so tensor destructors never throw or hang.
// Objects made in the child after the fork work normally. The CPU is never
// affected. Under PyTorch the devices start at `import npubridge` (which
// `import torch` autoloads), so every child forked after that is in a "bad
// fork": torch.npu._is_in_bad_fork() is true, torch.npu._lazy_init() raises
// this error, device_count() still reports the devices, as torch.cuda does.
// Destroying in the child a runtime made before the fork is not supported
// (its destructors would join threads the child does not have): a child
// leaves with _exit or exec, and Runtime::global() is never destroyed.
// Tests: tests/python/test_fork.py, Devices.ForkedChild*.

namespace {

std::atomic<uint64_t> g_fork_generation{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the child handler must not take a lock");

void count_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

uint64_t current_generation() {
  static std::once_flag registered;
  std::call_once(registered, [] {
    if (pthread_atfork(nullptr, nullptr, &count_fork_in_child) != 0)
      throw Error(ErrorCode::kInternal, "pthread_atfork: could not register npubridge's fork handler");
  });
  return g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace

ForkGuard::ForkGuard() : generation_(current_generation()) {}

bool ForkGuard::in_forked_child() const noexcept {
  return g_fork_generation.load(std::memory_order_relaxed) != generation_;
}

void throw_forked_child(const std::string& what) {
  throw Error(ErrorCode::kUnsupported,
              "Cannot re-initialize npu in forked subprocess. To use npu with multiprocessing, you must use "
              "the 'spawn' start method (" +
                  what +
                  ": this process was forked from one that had started the npu runtime, and its device "
                  "threads and locks do not survive fork())");
}

}  // namespace npub::sim
