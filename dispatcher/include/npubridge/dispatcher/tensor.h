// npub::Tensor: an owning tensor for C++ hosts, tests and the dispatcher's
// own temporaries. Its data lives on an npu device (allocated by the device's
// caching allocator) or in host memory; dl() exposes it as a DLTensor whose
// address is stable for the tensor's life.
//
// PyTorch hosts do not use this class: python_ext wraps torch tensors.
#pragma once

#include <npubridge/device_sim/device.h>
#include <npubridge/plugin_api.h>
#include <npubridge/support/dtype.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace npub {

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised contiguous tensor; device == nullptr means host memory.
  static Tensor empty(const std::vector<int64_t>& shape, DType dtype, sim::Device* device);
  // A tensor holding `values` (converted from double), on `device`.
  static Tensor from_values(const std::vector<int64_t>& shape, DType dtype, const std::vector<double>& values,
                            sim::Device* device);

  bool defined() const { return impl_ != nullptr; }
  DLTensor* dl() const { return impl_ ? &impl_->dl : nullptr; }
  const std::vector<int64_t>& shape() const { return impl_->shape; }
  const std::vector<int64_t>& strides() const { return impl_->strides; }
  DType dtype() const { return dtype_of(impl_->dl.dtype); }
  int64_t numel() const;
  bool is_contiguous() const;
  sim::Device* device() const { return impl_->storage->device; }

  // A view sharing storage (as torch.as_strided); offset in elements.
  Tensor as_strided(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                    int64_t offset_elements) const;
  // A contiguous copy with `dtype` on `device` (nullptr = host).
  Tensor to(sim::Device* device, DType dtype) const;
  Tensor to(sim::Device* device) const { return to(device, dtype()); }
  Tensor clone() const { return to(device(), dtype()); }
  // Values converted to double, in row-major order, via the copy engine.
  std::vector<double> to_doubles() const;
  std::string shape_string() const;

 private:
  struct Storage {
    sim::Device* device = nullptr;
    void* data = nullptr;
    ~Storage();
  };
  struct Impl {
    DLTensor dl{};
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    std::shared_ptr<Storage> storage;
  };
  static Tensor make(std::shared_ptr<Storage> storage, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides, DType dtype, uint64_t byte_offset);
  std::shared_ptr<Impl> impl_;
};

// Checks that a shape's element count and byte size fit in int64; throws
// npub::Error naming `what` otherwise. Returns the element count.
int64_t checked_numel(const int64_t* shape, int32_t ndim, int64_t element_size, const std::string& what);

}  // namespace npub
