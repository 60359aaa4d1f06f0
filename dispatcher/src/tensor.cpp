#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/dispatcher/tensor.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>

#include <cstdlib>

namespace npub {

int64_t checked_numel(const int64_t* shape, int32_t ndim, int64_t element_size, const std::string& what) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0)
      throw Error(ErrorCode::kInvalidArgument, what + ": expected non-negative sizes but found " +
                                                   std::to_string(shape[i]) + " at dim " + std::to_string(i));
    if (shape[i] != 0 && n > INT64_MAX / shape[i])
      throw Error(ErrorCode::kInvalidArgument, what + ": element count overflows int64");
    n *= shape[i];
  }
  if (element_size > 0 && n > INT64_MAX / element_size)
    throw Error(ErrorCode::kInvalidArgument, what + ": byte size overflows int64");
  return n;
}

Tensor::Storage::~Storage() {
  if (data == nullptr) return;
  if (device != nullptr) {
    device->free(data);
  } else {
    std::free(data);
  }
}

Tensor Tensor::make(std::shared_ptr<Storage> storage, const std::vector<int64_t>& shape,
                    const std::vector<int64_t>& strides, DType dtype, uint64_t byte_offset) {
  Tensor t;
  t.impl_ = std::make_shared<Impl>();
  t.impl_->shape = shape;
  t.impl_->strides = strides;
  t.impl_->storage = std::move(storage);
  DLTensor& dl = t.impl_->dl;
  dl.data = t.impl_->storage->data;
  dl.device = t.impl_->storage->device != nullptr
                  ? DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), t.impl_->storage->device->index()}
                  : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(shape.size());
  dl.dtype = to_dl(dtype);
  dl.shape = t.impl_->shape.data();
  dl.strides = t.impl_->strides.data();
  dl.byte_offset = byte_offset;
  return t;
}

Tensor Tensor::empty(const std::vector<int64_t>& shape, DType dtype, sim::Device* device) {
  if (dtype == DType::kUnknown) throw Error(ErrorCode::kInvalidArgument, "Tensor::empty: unknown dtype");
  const int64_t n =
      checked_numel(shape.data(), static_cast<int32_t>(shape.size()), element_size(dtype), "Tensor::empty");
  const size_t bytes = static_cast<size_t>(n * element_size(dtype));
  auto storage = std::make_shared<Storage>();
  storage->device = device;
  if (bytes > 0) {
    storage->data = device != nullptr ? device->allocate(bytes) : std::malloc(bytes);
    if (storage->data == nullptr)
      throw Error(ErrorCode::kOutOfMemory, "Tensor::empty: host allocation failed");
  }
  std::vector<int64_t> strides(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = acc;
    acc *= shape[i];
  }
  return make(std::move(storage), shape, strides, dtype, 0);
}

Tensor Tensor::from_values(const std::vector<int64_t>& shape, DType dtype, const std::vector<double>& values,
                           sim::Device* device) {
  Tensor t = empty(shape, dtype, device);
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw Error(ErrorCode::kInvalidArgument, "Tensor::from_values: expected " + std::to_string(t.numel()) +
                                                 " values for shape " + t.shape_string() + " but found " +
                                                 std::to_string(values.size()));
  if (device != nullptr && sim::capture_checks_needed())
    sim::check_capture_allows(*device, "Tensor::from_values", "a copy from host to device memory");
  sim::write_doubles(*t.dl(), values);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : impl_->shape) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  return npub::is_contiguous(impl_->shape.data(), impl_->strides.data(),
                             static_cast<int>(impl_->shape.size()));
}

Tensor Tensor::as_strided(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                          int64_t offset_elements) const {
  if (shape.size() != strides.size())
    throw Error(ErrorCode::kInvalidArgument, "as_strided: shape and strides differ in length");
  return make(impl_->storage, shape, strides, dtype(),
              static_cast<uint64_t>(offset_elements * element_size(dtype())) + impl_->dl.byte_offset);
}

Tensor Tensor::to(sim::Device* device, DType dtype) const {
  Tensor out = empty(impl_->shape, dtype, device);
  sim::engine_copy(device != nullptr ? device : impl_->storage->device, *out.dl(), impl_->dl, "Tensor::to");
  return out;
}

std::vector<double> Tensor::to_doubles() const {
  if (impl_->storage->device != nullptr && sim::capture_checks_needed())
    sim::check_capture_allows(*impl_->storage->device, "Tensor::to_doubles",
                              "a copy from device to host memory");
  return sim::read_doubles(impl_->dl);
}

std::string Tensor::shape_string() const {
  return shape_str(impl_->shape.data(), static_cast<int>(impl_->shape.size()));
}

}  // namespace npub
