// The minimal ATen kernels of npu tensors (minimal.cpp): factories, views,
// resize_, copies between host and device, .item() and set_. The bridges
// allocate outputs, resize out= tensors and move host<->device data with
// the three declared here.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace npub::torch_backend {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> mf);

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>);

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> mf);

// Copies between npu and cpu tensors of any dtype and layout, through the
// device's copy engine (device memory is never aliased by a host tensor).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);

}  // namespace npub::torch_backend
