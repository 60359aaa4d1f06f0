// Pinned host staging for the npu backend: the host buffers gloo reads and
// writes in place of device memory, and the copies between them and npu
// tensors, queued on the collective stream.
//
// Device memory is owned by the simulated device and is never aliased as a
// CPU tensor: data crosses only through the device's copy engine
// (device_sim copy_engine.h), as it would over PCIe.
#pragma once

#include <ATen/core/Tensor.h>

#include <npubridge/device_sim/stream.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace npub::dist {

class StagingPool;

// A pinned host buffer lent to one collective. Returned to its pool when the
// lease goes, unless discarded (after an error, when gloo may still hold
// it: it is then freed once gloo lets go, never reused).
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(std::shared_ptr<StagingPool> pool, at::Tensor bytes);
  StagingLease(StagingLease&&) noexcept = default;
  StagingLease& operator=(StagingLease&&) noexcept = default;
  ~StagingLease();
  // The first `numel` elements of the buffer as a contiguous 1-D tensor of
  // `dtype` (`offset` elements in).
  at::Tensor as(at::ScalarType dtype, int64_t numel, int64_t offset = 0) const;
  void discard() { pool_.reset(); }

 private:
  std::shared_ptr<StagingPool> pool_;
  at::Tensor bytes_;  // uint8 [capacity], pinned
};

// Reuses pinned blocks across collectives: a fresh block costs an mmap and
// page faults on first touch, per collective otherwise.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  StagingLease acquire(size_t nbytes);
  void give_back(at::Tensor bytes);

 private:
  static constexpr size_t kMaxCachedBytes = size_t{512} << 20;
  std::mutex mu_;
  std::multimap<size_t, at::Tensor> free_;  // by capacity
  size_t cached_bytes_ = 0;
};

// Queues the copy of npu tensor `src` (any strides) into the contiguous host
// tensor `dst` of the same dtype and numel on `stream`. Both must stay alive
// until the stream has run it.
void queue_to_host(sim::Stream& stream, const at::Tensor& dst, const at::Tensor& src);
// The reverse: host contiguous `src` into npu tensor `dst` (any strides).
void queue_to_device(sim::Stream& stream, const at::Tensor& dst, const at::Tensor& src);

}  // namespace npub::dist
