// A DLTensor that describes a torch tensor in place, for hosts built against
// LibTorch (the PyTorch extension, npub-conformance, the benchmarks).
// Header-only; the core libraries never include it.
#pragma once

#include <ATen/core/Tensor.h>

#include <npubridge/torch/dtype.h>

namespace npub {

// The view's shape and strides point into the tensor's own metadata, so it
// is valid while the tensor lives and keeps its sizes (kernels only read
// them). `device` is where the data lives as npubridge names it (kDLCPU for
// a CPU tensor, NPUB_DEVICE_NPU and an index for an npu tensor). A
// metadata-only view (data NULL) describes a meta or fake tensor.
inline DLTensor dl_view(const at::Tensor& t, DLDevice device, bool metadata_only = false) {
  DLTensor dl{};
  dl.data = metadata_only ? nullptr : t.data_ptr();
  dl.device = device;
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = to_dl(npub_dtype(t.scalar_type()));
  dl.shape = const_cast<int64_t*>(t.sizes().data());
  dl.strides = const_cast<int64_t*>(t.strides().data());
  return dl;
}

}  // namespace npub
