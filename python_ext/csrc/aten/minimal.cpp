// The minimal ATen kernels of npu tensors, registered for PrivateUse1 when
// the module loads: empty, as_strided and the native views, resize_, the
// copies (_copy_from through the device's copy engine),
// _local_scalar_dense and set_.
#include "aten/minimal.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/device_sim/graph_capture.h>

#include "aten/boxing.h"
#include "runtime/allocator.h"
#include "runtime/hooks.h"
#include "runtime/npu_runtime.h"

namespace npub::torch_backend {

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> mf) {
  c10::OptionalDeviceGuard guard;
  if (device.has_value() && device->has_index() && device->index() != current_index())
    guard.reset_device(*device);
  return at::detail::empty_generic(size, npu_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(at::get_default_dtype_as_scalartype()), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::DeviceGuard guard(device.value_or(at::Device(c10::DeviceType::PrivateUse1, current_index())));
  return at::detail::empty_strided_generic(size, stride, npu_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype.value_or(at::get_default_dtype_as_scalartype()));
}

namespace {

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

}  // namespace

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> mf) {
  int64_t numel = 1;
  for (int64_t s : size) numel *= s;
  const size_t needed = static_cast<size_t>((numel + self.storage_offset()) * self.element_size());
  if (needed > self.storage().nbytes()) NpuHooks().resizePrivateUse1Bytes(self.storage(), needed);
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  if (mf.has_value() && *mf != at::MemoryFormat::Contiguous && *mf != at::MemoryFormat::Preserve)
    self.unsafeGetTensorImpl()->empty_tensor_restride(*mf);
  return self;
}

namespace {

// The same memory, sizes and strides without the lazy conjugate and
// negative bits: what the bytes hold.
at::Tensor physical(const at::Tensor& t) {
  at::Tensor p = at::native::alias(t);
  p._set_conj(false);
  p._set_neg(false);
  return p;
}

// Note [Copies resolve the conjugate and negative bits]
// A tensor with the conjugate (x.conj()) or negative bit (x.conj().imag)
// holds other values than it means, and the copy engine moves bytes. When
// both sides carry the same bits the bytes are the copy; otherwise the
// values cross on the CPU, whose copy_ resolves the bits: the source's
// bytes land in a CPU tensor that takes the source's bits, and a CPU
// tensor with the destination's bits receives them, whose bytes are then
// the destination's. Nothing here goes through the dispatcher: ATen's
// conjugate fallback resolves a conjugated argument with clone, which
// copies with this function again. Conversions between dtypes the copy
// engine does not know take the same way.
bool same_math_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.is_conj() == b.is_conj() && a.is_neg() == b.is_neg();
}

at::Tensor on_cpu_with_bits(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  at::Tensor bytes = at::empty(t.sizes(), t.options().device(at::kCPU));
  copy_from(physical(t), bytes, false);
  bytes._set_conj(t.is_conj());
  bytes._set_neg(t.is_neg());
  return bytes;
}

void copy_on_the_cpu(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const at::Tensor values = on_cpu_with_bits(self);
  if (dst.device().is_cpu()) {
    dst.copy_(values);
    return;
  }
  at::Tensor bytes = at::empty(dst.sizes(), dst.options().device(at::kCPU));
  bytes._set_conj(dst.is_conj());
  bytes._set_neg(dst.is_neg());
  bytes.copy_(values);
  copy_from(physical(bytes), physical(dst), non_blocking);
}

}  // namespace

// Copies between npu and cpu tensors of any dtype and layout, through the
// device's copy engine (device memory is never aliased by a host tensor).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.is_conj() || self.is_neg() || dst.is_conj() || dst.is_neg()) {
    if (same_math_bits(self, dst))
      copy_from(physical(self), physical(dst), non_blocking);
    else
      copy_on_the_cpu(self, dst, non_blocking);
    return dst;
  }
  // A conversion the copy engine cannot make (complex64 -> complex128,
  // float -> complex) is the CPU's copy_ too.
  if (self.scalar_type() != dst.scalar_type() && (npub_dtype(self.scalar_type()) == DType::kUnknown ||
                                                  npub_dtype(dst.scalar_type()) == DType::kUnknown)) {
    copy_on_the_cpu(self, dst, non_blocking);
    return dst;
  }
  // Types the copy engine does not know move as their real components or
  // as same-size integers (bit-exact): complex as pairs of floats, uint64
  // as int64.
  if (self.scalar_type() == dst.scalar_type() && npub_dtype(self.scalar_type()) == DType::kUnknown) {
    if (self.is_complex()) {
      // The native views directly: through the dispatcher they could land
      // in the CPU fallback, which copies with this function again.
      copy_from(at::native::view_as_real(self), at::native::view_as_real(dst), non_blocking);
      return dst;
    }
    if (self.element_size() == 8 || self.element_size() == 4 || self.element_size() == 2 ||
        self.element_size() == 1) {
      const at::ScalarType as = self.element_size() == 8   ? at::kLong
                                : self.element_size() == 4 ? at::kInt
                                : self.element_size() == 2 ? at::kShort
                                                           : at::kByte;
      copy_from(at::native::view_dtype(self, as), at::native::view_dtype(dst, as), non_blocking);
      return dst;
    }
  }
  TORCH_CHECK(
      npub_dtype(self.scalar_type()) != DType::kUnknown && npub_dtype(dst.scalar_type()) != DType::kUnknown,
      "npu copy: unsupported dtype ", self.scalar_type(), " -> ", dst.scalar_type());
  if (dst.numel() == 0) return dst;
  // Broadcast, or (as copy_ allows) the same number of elements in another
  // shape, e.g. [1] into [].
  at::Tensor src = self.sizes().equals(dst.sizes()) ? self
                   : self.numel() == dst.numel()    ? self.reshape(dst.sizes())
                                                    : self.expand_as(dst);
  // Note [Capture records instead of running]: inside a capture a copy
  // between npu tensors is recorded, one with the host refused.
  if (sim::capture_checks_needed()) {
    sim::Device& npu = rt().devices().at((dst.is_privateuseone() ? dst : self).device().index());
    const bool host_side = !self.is_privateuseone() || !dst.is_privateuseone();
    bool recorded = false;
    rethrow_as_torch([&] {  // Note [Work a capture cannot see]
      recorded = sim::capture_target(npu, npu.current_stream(), [] { return std::string("aten::copy_"); }) !=
                 nullptr;
    });
    if (recorded || host_side) {
      rethrow_as_torch([&] {
        sim::engine_copy(&npu, DLView(dst).dl, DLView(src).dl,
                         host_side ? (dst.is_privateuseone()
                                          ? "a copy from cpu to npu (aten::copy_, .to(\"npu\"))"
                                          : "a copy from npu to cpu (aten::copy_, .cpu(), .to(\"cpu\"))")
                                   : "aten::copy_");
      });
      return dst;
    }
  }
  if (self.is_privateuseone()) rt().devices().at(self.device().index()).synchronize();
  sim::copy_tensor(DLView(dst).dl, DLView(src).dl);
  return dst;
}

namespace {

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  if (sim::capture_checks_needed())
    rethrow_as_torch([&] {
      sim::check_capture_allows(rt().devices().at(self.device().index()),
                                "aten::_local_scalar_dense (.item())",
                                "reading a value back to the host needs the result of work the capture "
                                "records instead of running");
    });
  at::Tensor cpu = at::empty({}, self.options().device(at::kCPU));
  copy_from(self, cpu, false);
  return cpu.item();
}

// set_: a tensor onto (part of) an npu storage; what storage copies and
// torch.save / torch.load use.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, npu_allocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, empty, 0, {0}, {});
}

// Note [npu tensors are shallow-copy compatible with CPU ones]
// Module._apply (what .to("npu") runs) keeps each Parameter object and
// swaps its data (`param.data = param_applied`) only when
// _has_compatible_shallow_copy_type says the two tensor types may share a
// TensorImpl shape; otherwise it makes a new Parameter per module, and
// weights tied by object identity (a language model's input and output
// embeddings) come apart into two tensors that train separately.
// c10's default lists CUDA, XPU, ... but not PrivateUse1, so the device
// says it here, for dense strided tensors, as OpenReg's does.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return dense(self) && dense(from);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", &has_compatible_shallow_copy_type);
  m.impl("set_.source_Storage", &at::native::set_);
  m.impl("set_.source_Storage_storage_offset", &set_storage);
  m.impl("set_.source_Tensor", &at::native::set_tensor_);
  m.impl("set_", &set_empty);
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &as_strided);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("alias", &at::native::alias);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
  m.impl("view.dtype", &at::native::view_dtype);
  m.impl("resize_", &resize_);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("_local_scalar_dense", &local_scalar_dense);
}

}  // namespace

}  // namespace npub::torch_backend
