// A simulated NPU device and the set of devices of one runtime.
//
// Configuration (environment, read by DeviceOptions::from_env):
//   NPUB_SIM_DEVICES     number of devices (default 2)
//   NPUB_SIM_MEMORY      capacity per device, e.g. 16G (default 16 GiB)
//   NPUB_SIM_THREADS     compute threads per device (default: hardware threads)
//   NPUB_SIM_SPIN_US     microseconds a compute thread polls for work before
//                        it sleeps (default ComputePool::kDefaultSpin)
//   NPUB_LAUNCH_BLOCKING 1 = streams run work inline (default 0)
//   NPUB_VALIDATE        1 = guard zones around device memory blocks (Note
//                        [Guard zones], caching_allocator.h; default 0)
#pragma once

#include <npubridge/device_sim/caching_allocator.h>
#include <npubridge/device_sim/compute_pool.h>
#include <npubridge/device_sim/fork_guard.h>
#include <npubridge/device_sim/generator.h>
#include <npubridge/device_sim/stream.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace npub::sim {

struct DeviceOptions {
  int num_devices = 2;
  uint64_t memory_bytes = 16ull << 30;
  int compute_threads = 0;  // 0 = std::thread::hardware_concurrency()
  // How long a compute thread polls for work before it sleeps (Note
  // [Compute threads spin before they sleep], compute_pool.cpp).
  std::chrono::microseconds spin = ComputePool::kDefaultSpin;
  bool launch_blocking = false;
  size_t guard_bytes = 0;  // Note [Guard zones]: CachingAllocator::kGuardBytes under NPUB_VALIDATE=1
  static DeviceOptions from_env();
};

class Device {
 public:
  Device(int index, const DeviceOptions& options);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int index() const { return index_; }
  CachingAllocator& allocator() { return allocator_; }
  ComputePool& compute() { return compute_; }

  Stream& default_stream() { return *default_stream_; }
  // A new stream owned by the device; valid while the device lives.
  Stream& create_stream();
  // A stream from the device's pool of kStreamPoolSize, handed out round
  // robin (as CUDA's stream pool): what a host's "new stream" gets, so that
  // making streams in a loop does not make threads without bound (each
  // stream owns a worker thread).
  static constexpr int kStreamPoolSize = 4;
  Stream& pooled_stream();
  // Stream `id` of this device (0 is the default stream); throws npub::Error
  // for an id the device never handed out.
  Stream& stream(int id);
  // The calling thread's current stream on this device (default: the
  // default stream).
  Stream& current_stream();
  void set_current_stream(Stream& stream);
  // Waits for every stream of the device. Throws in a forked child (Note [A
  // forked child cannot use the npu]).
  void synchronize();

  // The device's default random number generator (Note [Random numbers are
  // counter ranges]); the philox_* calls are its.
  Generator& generator() { return generator_; }
  using PhiloxState = Generator::State;
  void manual_seed(uint64_t seed) { generator_.manual_seed(seed); }
  PhiloxState philox_state() const { return generator_.state(); }
  void set_philox_state(const PhiloxState& state) { generator_.set_state(state); }
  // Reserves `count` counters; returns the seed and the first counter.
  PhiloxState philox_reserve(uint64_t count) { return generator_.reserve(count); }
  static constexpr uint64_t kDefaultSeed = Generator::kDefaultSeed;

  // Device memory on the current stream.
  void* allocate(size_t bytes) { return allocator_.allocate(bytes, &current_stream()); }
  void free(void* ptr) { allocator_.free(ptr); }

 private:
  const ForkGuard fork_guard_;
  const int index_;
  const uint64_t uid_;  // unique across devices of all runtimes (thread-local keys)
  const bool launch_blocking_;
  CachingAllocator allocator_;
  ComputePool compute_;
  std::mutex streams_mu_;
  std::vector<std::unique_ptr<Stream>> streams_;  // under streams_mu_ (create_stream grows it)
  Stream* default_stream_ = nullptr;
  std::vector<Stream*> pool_;  // under streams_mu_
  size_t pool_next_ =
      0;  // under streams_mu_                // streams_[0], fixed at construction: read without the lock
  Generator generator_;
};

class DeviceSet {
 public:
  explicit DeviceSet(const DeviceOptions& options);
  int count() const { return static_cast<int>(devices_.size()); }
  // Throws npub::Error naming the index and the count when out of range,
  // and the forked-child error in a process forked after this set was made
  // (Note [A forked child cannot use the npu], fork_guard.cpp).
  Device& at(int index);
  // True in a process forked after this set was made: its devices are
  // unusable there (torch.npu._is_in_bad_fork()).
  bool in_forked_child() const noexcept { return fork_guard_.in_forked_child(); }
  const DeviceOptions& options() const { return options_; }

  // The calling thread's current device index (default 0).
  int current_device() const;
  void set_current_device(int index);

 private:
  const ForkGuard fork_guard_;
  const uint64_t uid_;  // unique across all sets (the thread-local current device's key)
  DeviceOptions options_;
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace npub::sim
