// The CPU run of a call whose tensors share memory or carry math bits (see
// aliased_fallback.h).
#include "aten/aliased_fallback.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include "aten/minimal.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace npub::torch_backend {

namespace {

bool is_npu(const at::Tensor& t) { return t.defined() && t.is_privateuseone(); }

bool written(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

// fn(tensor, written) for every defined tensor among the call's arguments,
// list elements included.
template <class Fn>
void for_each_tensor(const c10::OperatorHandle& op, const torch::jit::Stack& stack, Fn fn) {
  const auto& schema = op.schema().arguments();
  const size_t first = stack.size() - schema.size();
  for (size_t i = 0; i < schema.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) fn(v.toTensor(), written(schema[i]));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector())
        if (t.defined()) fn(t, written(schema[i]));
    } else if (v.isOptionalTensorList()) {
      for (const auto& t : v.toOptionalTensorVector())
        if (t.has_value() && t->defined()) fn(*t, written(schema[i]));
    }
  }
}

// One npu storage the call's tensors use, and its CPU copy: the bytes from
// the first to one past the last byte any of them spans.
struct StorageCopy {
  const c10::StorageImpl* impl = nullptr;
  c10::Storage npu;
  int64_t lo = 0, hi = 0;  // bytes of the storage
  bool written = false;
  at::Tensor cpu;  // uint8 [hi - lo]
};

// A uint8 view of bytes [lo, lo + n) of an npu storage.
at::Tensor npu_bytes(const c10::Storage& storage, int64_t lo, int64_t n, c10::Device device) {
  at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
  bytes.set_(storage, lo, {n}, {1});
  return bytes;
}

class CpuViews {
 public:
  explicit CpuViews(c10::Device npu) : npu_(npu) {}

  void note(const at::Tensor& t, bool is_written) {
    StorageCopy& s = copy_of(t);
    s.written = s.written || is_written;
    if (t.numel() == 0) return;
    const int64_t es = static_cast<int64_t>(t.element_size());
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const int64_t lo = t.storage_offset() * es, hi = (last + 1) * es;
    if (s.hi == s.lo) {
      s.lo = lo;
      s.hi = hi;
    } else {
      s.lo = std::min(s.lo, lo);
      s.hi = std::max(s.hi, hi);
    }
  }

  void copy_to_cpu() {
    for (StorageCopy& s : copies_) {
      s.lo -= s.lo % 16;  // a multiple of every element size
      s.cpu = at::empty({s.hi - s.lo}, at::TensorOptions().dtype(at::kByte));
      if (s.hi > s.lo) copy_from(npu_bytes(s.npu, s.lo, s.hi - s.lo, npu_), s.cpu, false);
    }
  }

  // The CPU view of npu tensor `t`: its sizes, strides and math bits, into
  // its storage's CPU copy.
  at::Tensor view(const at::Tensor& t, bool is_written) {
    if (!is_npu(t)) return t;
    const StorageCopy& s = copy_of(t);
    const int64_t es = static_cast<int64_t>(t.element_size());
    const int64_t offset = t.numel() == 0 ? 0 : (t.storage_offset() * es - s.lo) / es;
    at::Tensor c = at::empty({0}, t.options().device(at::kCPU));
    c.set_(s.cpu.storage(), offset, t.sizes(), t.strides());
    c._set_conj(t.is_conj());
    c._set_neg(t.is_neg());
    if (is_written) written_.push_back({t, c});
    return c;
  }

  // After the CPU kernel: each written tensor's elements go back (only
  // those: the span copied to the CPU also holds read-only inputs and gaps
  // another thread may write meanwhile), and a written tensor the kernel
  // resized (out= of another shape) takes its new shape and values. A
  // written tensor whose elements share memory (an expanded self that
  // masked_fill_ may write) goes back as its bytes.
  void write_back() {
    for (const auto& [npu, cpu] : written_) {
      const bool in_place =
          cpu.sizes().equals(npu.sizes()) && cpu.strides().equals(npu.strides()) &&
          cpu.storage().unsafeGetStorageImpl() == copy_of(npu).cpu.storage().unsafeGetStorageImpl();
      if (!in_place) {
        resize_(npu, cpu.sizes(), std::nullopt);
        copy_from(cpu, npu, false);
      } else if (npu.numel() > 0 && at::has_internal_overlap(npu) != at::MemOverlap::No) {
        const StorageCopy& s = copy_of(npu);
        copy_from(s.cpu, npu_bytes(s.npu, s.lo, s.hi - s.lo, npu_), false);
      } else if (npu.numel() > 0) {
        copy_from(cpu, npu, false);
      }
    }
  }

  // The npu tensor a CPU return stands for (a written argument returned as
  // itself), else the return moved to the npu (a quantized one stays, for
  // the fallback's refusal: Note [Quantized tensors stay on the CPU]).
  at::Tensor result(const at::Tensor& r) const {
    if (!r.defined() || !r.device().is_cpu() || r.is_quantized()) return r;
    for (const auto& [npu, cpu] : written_)
      if (cpu.is_same(r)) return npu;
    return r.to(npu_);
  }

 private:
  StorageCopy& copy_of(const at::Tensor& t) {
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    for (StorageCopy& s : copies_)
      if (s.impl == impl) return s;
    StorageCopy s;
    s.impl = impl;
    s.npu = t.storage();
    copies_.push_back(std::move(s));
    return copies_.back();
  }

  c10::Device npu_;
  std::vector<StorageCopy> copies_;
  std::vector<std::pair<at::Tensor, at::Tensor>> written_;  // (npu, its CPU view)
};

}  // namespace

Sharing written_sharing(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  bool bits = false, internal = false;
  std::vector<std::pair<at::Tensor, bool>> tensors;  // (npu tensor, written)
  for_each_tensor(op, stack, [&](const at::Tensor& t, bool is_written) {
    if (!is_npu(t)) return;
    bits = bits || t.is_conj() || t.is_neg();
    internal = internal || (is_written && at::has_internal_overlap(t) == at::MemOverlap::Yes);
    tensors.emplace_back(t, is_written);
  });
  if (bits || internal) return Sharing::kOther;
  auto same_view = [](const at::Tensor& a, const at::Tensor& b) {
    return a.data_ptr() == b.data_ptr() && a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) &&
           a.strides().equals(b.strides());
  };
  Sharing sharing = Sharing::kNone;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].second) continue;
    const at::Tensor& w = tensors[i].first;
    for (size_t j = 0; j < tensors.size(); ++j) {
      const at::Tensor& r = tensors[j].first;
      if (i == j || !w.storage().is_alias_of(r.storage())) continue;
      if (tensors[j].second || !same_view(w, r)) return Sharing::kOther;
      sharing = Sharing::kSameView;
    }
  }
  return sharing;
}

bool needs_aliased_cpu_run(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  return written_sharing(op, stack) != Sharing::kNone;
}

void run_aliased_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device npu) {
  // A view's result must share the npu input's memory; one computed on the
  // CPU and moved back would be a silent copy (as ATen's cpu_fallback
  // refuses views).
  for (const c10::Argument& r : op.schema().returns())
    TORCH_CHECK(r.alias_info() == nullptr || r.alias_info()->isWrite(), "npubridge: the operator '",
                op.schema().operator_name(), "' is a view operator, and views of npu tensors cannot be ",
                "computed on the CPU (the storage cannot be shared across devices); this call has tensors ",
                "that share memory or carry the conjugate or negative bit");
  const auto& schema = op.schema().arguments();
  const size_t first = stack->size() - schema.size();
  CpuViews views(npu);
  for_each_tensor(op, *stack, [&](const at::Tensor& t, bool is_written) {
    if (is_npu(t)) views.note(t, is_written);
  });
  views.copy_to_cpu();
  for (size_t i = 0; i < schema.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    const bool w = written(schema[i]);
    if (v.isTensor()) {
      v = views.view(v.toTensor(), w);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorVector()) l.push_back(views.view(t, w));
      v = l;
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> l;
      for (const auto& t : v.toOptionalTensorVector())
        l.push_back(t.has_value() ? std::optional<at::Tensor>(views.view(*t, w)) : std::nullopt);
      v = l;
    } else if (v.isDevice()) {
      v = c10::Device(c10::kCPU);
    }
  }
  // ATen's own checks (overlap, dtypes, shapes) raise here, before any
  // byte goes back.
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  views.write_back();
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (r.isTensor()) {
      r = views.result(r.toTensor());
    } else if (r.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : r.toTensorVector()) l.push_back(views.result(t));
      r = l;
    }
  }
}

}  // namespace npub::torch_backend
