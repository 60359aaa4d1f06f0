#include <npubridge/device_sim/device.h>
#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/support/env.h>
#include <npubridge/support/error.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

namespace npub::sim {

namespace {
std::atomic<uint64_t> g_next_device_uid{1};

// The calling thread's current stream per device, keyed by device uid (not
// pointer, so a destroyed device's entry can never match a new one).
struct CurrentStreams {
  std::vector<std::pair<uint64_t, Stream*>> entries;
  Stream* find(uint64_t uid) const {
    for (auto& [k, s] : entries)
      if (k == uid) return s;
    return nullptr;
  }
  void set(uint64_t uid, Stream* s) {
    for (auto& [k, v] : entries)
      if (k == uid) {
        v = s;
        return;
      }
    entries.emplace_back(uid, s);
  }
};
thread_local CurrentStreams tls_streams;

// Keyed by the set's uid, not its address: a set created where a destroyed
// one lived must not inherit that one's current device.
struct CurrentDevices {
  std::vector<std::pair<uint64_t, int>> entries;
};
thread_local CurrentDevices tls_devices;
}  // namespace

DeviceOptions DeviceOptions::from_env() {
  DeviceOptions o;
  // Note [A setting is read strictly or refused] (support/include/npubridge/support/env.h).
  o.num_devices =
      static_cast<int>(env::get_int_in("NPUB_SIM_DEVICES", o.num_devices, 1, 64, "a device count"));
  o.memory_bytes = env::get_positive_bytes("NPUB_SIM_MEMORY", o.memory_bytes);
  // Unset: every hardware thread (compute_threads 0).
  o.compute_threads =
      static_cast<int>(env::get_int_in("NPUB_SIM_THREADS", 0, 1, 1024, "a compute thread count"));
  o.spin = std::chrono::microseconds(
      env::get_int_in("NPUB_SIM_SPIN_US", o.spin.count(), 0, 1000000, "a spin time in microseconds"));
  o.launch_blocking = env::get_flag("NPUB_LAUNCH_BLOCKING", false);
  o.guard_bytes = env::get_flag("NPUB_VALIDATE", false) ? CachingAllocator::kGuardBytes : 0;
  return o;
}

static int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Device::Device(int index, const DeviceOptions& options)
    : index_(index),
      uid_(g_next_device_uid.fetch_add(1)),
      launch_blocking_(options.launch_blocking),
      allocator_(index, options.memory_bytes, options.guard_bytes),
      compute_(resolve_threads(options.compute_threads), options.spin) {
  streams_.push_back(std::make_unique<Stream>(index, 0, launch_blocking_));
  default_stream_ = streams_.front().get();
}

Device::~Device() {
  // Streams finish their queued work before the allocator goes away.
  streams_.clear();
}

Stream& Device::create_stream() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.push_back(std::make_unique<Stream>(index_, static_cast<int>(streams_.size()), launch_blocking_));
  return *streams_.back();
}

Stream& Device::pooled_stream() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  if (pool_.size() < kStreamPoolSize) {
    streams_.push_back(std::make_unique<Stream>(index_, static_cast<int>(streams_.size()), launch_blocking_));
    pool_.push_back(streams_.back().get());
  }
  return *pool_[pool_next_++ % pool_.size()];
}

Stream& Device::stream(int id) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  if (id < 0 || id >= static_cast<int>(streams_.size()))
    throw Error(ErrorCode::kInvalidArgument, "npu:" + std::to_string(index_) + " has no stream " +
                                                 std::to_string(id) + " (" + std::to_string(streams_.size()) +
                                                 " streams created)");
  return *streams_[static_cast<size_t>(id)];
}

Stream& Device::current_stream() {
  Stream* s = tls_streams.find(uid_);
  return s != nullptr ? *s : *default_stream_;
}

void Device::set_current_stream(Stream& stream) {
  if (stream.device_index() != index_)
    throw Error(ErrorCode::kInvalidArgument,
                "set_current_stream: expected a stream of npu:" + std::to_string(index_) +
                    " but found one of npu:" + std::to_string(stream.device_index()));
  tls_streams.set(uid_, &stream);
}

void Device::synchronize() {
  fork_guard_.check([&] { return "npu:" + std::to_string(index_); });
  if (capture_checks_needed())
    check_capture_allows(*this, "synchronize of npu:" + std::to_string(index_),
                         "the host would wait for work the capture records instead of running", true);
  std::vector<Stream*> all;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (auto& s : streams_) all.push_back(s.get());
  }
  for (Stream* s : all) s->synchronize();
  // Note [Guard zones]: what free() found overwritten since the last time.
  if (const std::string found = allocator_.take_guard_report(); !found.empty())
    throw Error(ErrorCode::kInternal, found);
}

DeviceSet::DeviceSet(const DeviceOptions& options) : uid_(g_next_device_uid.fetch_add(1)), options_(options) {
  for (int i = 0; i < options.num_devices; ++i) devices_.push_back(std::make_unique<Device>(i, options));
}

Device& DeviceSet::at(int index) {
  fork_guard_.check([&] { return "npu:" + std::to_string(index); });
  if (index < 0 || index >= count())
    throw Error(ErrorCode::kInvalidArgument,
                "npu:" + std::to_string(index) + " does not exist: expected a device index from 0 to " +
                    std::to_string(count() - 1) + " (NPUB_SIM_DEVICES=" + std::to_string(count()) + ")");
  return *devices_[static_cast<size_t>(index)];
}

int DeviceSet::current_device() const {
  for (auto& [set, idx] : tls_devices.entries)
    if (set == uid_) return idx;
  return 0;
}

void DeviceSet::set_current_device(int index) {
  (void)at(index);  // validates
  for (auto& [set, idx] : tls_devices.entries)
    if (set == uid_) {
      idx = index;
      return;
    }
  tls_devices.entries.emplace_back(uid_, index);
}

}  // namespace npub::sim
