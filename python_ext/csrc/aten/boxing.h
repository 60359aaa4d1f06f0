// Torch values as the dispatcher's (boxing.cpp): a torch tensor as a
// DLTensor that points into the tensor's own metadata, a call's IValues as
// NpubValues, the torch tensors a kernel allocates for its returns, and the
// small questions the bridges ask of a call's arguments (its device,
// whether plugins can describe its dtypes, the op's registry name).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>
#include <npubridge/torch/boxing.h>
#include <npubridge/torch/dl_view.h>
#include <npubridge/torch/dtype.h>

#include "runtime/npu_runtime.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace npub::torch_backend {

// A DLTensor describing a torch tensor, valid while the tensor lives and
// keeps its shape: shape and strides point into the tensor's own metadata
// (kernels only read them).
// A metadata-only view (data NULL) describes a meta or fake tensor as a
// tensor of the current npu.
struct DLView {
  DLTensor dl{};
  explicit DLView(const at::Tensor& t, bool metadata_only = false)
      : dl(dl_view(t,
                   t.device().is_cpu() && !metadata_only
                       ? DLDevice{kDLCPU, 0}
                       : DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU),
                                  t.device().is_privateuseone() ? t.device().index() : current_index()},
                   metadata_only)) {}
};

// Produces torch npu tensors for returns the kernel allocates (rare: ops
// whose output shape depends on data).
class TorchOutputs final : public OutputAllocator {
 public:
  DLTensor* allocate(int32_t ret_index, const DLDevice& device, int32_t ndim, const int64_t* shape,
                     DLDataType dtype) override {
    c10::DeviceGuard guard(
        at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device.device_id)));
    at::Tensor t;
    try {
      t = at::empty(std::vector<int64_t>(shape, shape + ndim),
                    at::TensorOptions()
                        .dtype(torch_dtype(dtype_of(dtype)))
                        .device(c10::DeviceType::PrivateUse1, device.device_id));
    } catch (const c10::OutOfMemoryError& e) {
      // The OutputAllocator contract: out of memory is npub's error, so
      // that it crosses the plugin as NPUB_ERR_OUT_OF_MEMORY and comes
      // back to Python as torch.OutOfMemoryError.
      throw OutOfMemoryError(e.what_without_backtrace());
    }
    slots_.push_back({ret_index, t, std::make_unique<DLView>(t)});
    return &slots_.back().view->dl;
  }
  const at::Tensor* find(int32_t ret_index) const {
    for (const Slot& s : slots_)
      if (s.index == ret_index) return &s.tensor;
    return nullptr;
  }

 private:
  struct Slot {
    int32_t index;
    at::Tensor tensor;
    std::unique_ptr<DLView> view;
  };
  std::vector<Slot> slots_;
};

// One call's arguments as NpubValues, and what they point to. `views` is
// reserved for every tensor of the call up front, so the DLTensor addresses
// handed out stay put; the rarer kinds live behind their own pointers.
struct Boxed {
  c10::SmallVector<NpubValue, 8> values;
  c10::SmallVector<DLView, 6> views;
  std::vector<at::Tensor> keep;  // CPU scalars moved to the device
  BoxedStorage storage;          // lists and strings
};

size_t count_tensors(c10::ArrayRef<c10::IValue> args);

// Converts one IValue. A 0-d CPU tensor (a wrapped Python number) joins the
// call's device, as CUDA accepts CPU scalars.
NpubValue box(const c10::IValue& v, Boxed& b, c10::DeviceIndex device, bool metadata_only = false);

// The device of the call's first npu tensor, else the current npu.
c10::DeviceIndex call_device(c10::ArrayRef<c10::IValue> args);

// False when some tensor argument has a dtype without a DLPack code plugins
// know (DType::kUnknown: complex, float8, ...) or a lazy conjugate or
// negative bit (the bytes are not the values, and plugins see bytes), so
// the host computes the op. The CPU fallback's copies to the CPU resolve
// the bits without the dispatcher (Note [Copies resolve the conjugate and
// negative bits], minimal.cpp), so this never recurses.
bool describable(c10::ArrayRef<c10::IValue> args);

// "aten::add.out": the registry's spelling of an ATen operator name.
std::string full_name(const c10::OperatorName& n);

// The same value with every tensor mapped by `fn` (lists of tensors too).
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorVector()) l.push_back(fn(t));
    return l;
  }
  bool tensors = v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList();
  if (tensors)
    for (const c10::IValue& e : v.toListRef()) tensors = tensors && (e.isNone() || e.isTensor());
  if (tensors) {
    c10::List<std::optional<at::Tensor>> l;
    for (const c10::IValue& e : v.toListRef())
      l.push_back(e.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(fn(e.toTensor())));
    return l;
  }
  return v;
}

}  // namespace npub::torch_backend
