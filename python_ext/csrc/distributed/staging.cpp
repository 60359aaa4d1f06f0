// Pinned staging buffers and the copies through them (staging.h).
#include "distributed/staging.h"

#include <ATen/ops/empty.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/torch/dl_view.h>

#include <utility>

namespace npub::dist {

StagingLease::StagingLease(std::shared_ptr<StagingPool> pool, at::Tensor bytes)
    : pool_(std::move(pool)), bytes_(std::move(bytes)) {}

StagingLease::~StagingLease() {
  if (pool_ && bytes_.defined()) pool_->give_back(std::move(bytes_));
}

// Note [Staging tensors are never inference tensors]
// A caller under torch.inference_mode() (vLLM's engine runs its steps under
// it) would make the staging buffers, and the views of them each
// collective takes, inference tensors; gloo's own threads, which run
// outside inference mode, then refuse to write into them ("Inplace update
// to inference tensor outside InferenceMode"). They are internal buffers
// no autograd ever sees, so they are made and viewed outside inference
// mode whatever the caller's.
at::Tensor StagingLease::as(at::ScalarType dtype, int64_t numel, int64_t offset) const {
  c10::InferenceMode not_inference(/*enabled=*/false);
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_INTERNAL_ASSERT((offset + numel) * elem <= bytes_.numel(), "staging lease overrun");
  at::Tensor flat = bytes_.view(dtype);  // capacity is a multiple of 8 bytes
  return flat.narrow(0, offset, numel);
}

StagingLease StagingPool::acquire(size_t nbytes) {
  // Round up so that blocks are reused across nearby sizes, and to a
  // multiple of 8 so any dtype can view them.
  size_t capacity = nbytes < 4096 ? 4096 : (nbytes + 65535) / 65536 * 65536;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(capacity);
    if (it != free_.end() && it->first <= 2 * capacity) {
      at::Tensor bytes = std::move(it->second);
      cached_bytes_ -= it->first;
      free_.erase(it);
      return StagingLease(shared_from_this(), std::move(bytes));
    }
  }
  c10::InferenceMode not_inference(/*enabled=*/false);  // Note [Staging tensors are never inference tensors]
  at::Tensor bytes =
      at::empty({static_cast<int64_t>(capacity)}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  return StagingLease(shared_from_this(), std::move(bytes));
}

void StagingPool::give_back(at::Tensor bytes) {
  const size_t capacity = static_cast<size_t>(bytes.numel());
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_bytes_ + capacity > kMaxCachedBytes) return;  // freed here
  cached_bytes_ += capacity;
  free_.emplace(capacity, std::move(bytes));
}

namespace {

DLDevice npu_device(const at::Tensor& t) {
  return DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), static_cast<int32_t>(t.device().index())};
}

}  // namespace

void queue_to_host(sim::Stream& stream, const at::Tensor& dst, const at::Tensor& src) {
  TORCH_INTERNAL_ASSERT(dst.is_contiguous() && dst.numel() == src.numel() &&
                        dst.scalar_type() == src.scalar_type());
  if (src.numel() == 0) return;
  if (src.is_contiguous()) {
    sim::memcpy_async(stream, dst.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
  // Strided: the copy engine walks the source's strides into a host view of
  // its shape.
  const at::Tensor shaped = dst.view(src.sizes());
  sim::copy_tensor_async(stream, dl_view(shaped, DLDevice{kDLCPU, 0}), dl_view(src, npu_device(src)));
}

void queue_to_device(sim::Stream& stream, const at::Tensor& dst, const at::Tensor& src) {
  TORCH_INTERNAL_ASSERT(src.is_contiguous() && dst.numel() == src.numel() &&
                        dst.scalar_type() == src.scalar_type());
  if (dst.numel() == 0) return;
  if (dst.is_contiguous()) {
    sim::memcpy_async(stream, dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  const at::Tensor shaped = src.view(dst.sizes());
  sim::copy_tensor_async(stream, dl_view(dst, npu_device(dst)), dl_view(shaped, DLDevice{kDLCPU, 0}));
}

}  // namespace npub::dist
