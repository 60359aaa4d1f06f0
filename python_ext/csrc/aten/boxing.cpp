// A call's IValues as NpubValues (see boxing.h).
#include "aten/boxing.h"

#include <npubridge/device_sim/graph_capture.h>

#include "runtime/npu_graph.h"

namespace npub::torch_backend {

size_t count_tensors(c10::ArrayRef<c10::IValue> args) {
  size_t n = 0;
  for (const auto& v : args) {
    if (v.isTensor())
      ++n;
    else if (v.isList())
      n += v.toListRef().size();
  }
  return n;
}

NpubValue box(const c10::IValue& v, Boxed& b, c10::DeviceIndex device, bool metadata_only) {
  auto tensor_view = [&](at::Tensor t) -> DLTensor* {
    if (metadata_only) {
      TORCH_INTERNAL_ASSERT(b.views.size() < b.views.capacity(), "npubridge: tensor views were not reserved");
      b.views.emplace_back(t, true);
      return &b.views.back().dl;
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      // Note [Captured constants] (runtime/npu_graph.h).
      t = sim::thread_is_capturing() ? capture_constant(t, device)
                                     : t.to(at::Device(c10::DeviceType::PrivateUse1, device));
      b.keep.push_back(t);
    }
    TORCH_INTERNAL_ASSERT(b.views.size() < b.views.capacity(), "npubridge: tensor views were not reserved");
    b.views.emplace_back(t);
    return &b.views.back().dl;
  };
  return box_ivalue(v, b.storage, tensor_view);
}

c10::DeviceIndex call_device(c10::ArrayRef<c10::IValue> args) {
  for (const auto& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_privateuseone())
      return v.toTensor().device().index();
    if (v.isList())
      for (const auto& e : v.toListRef())
        if (e.isTensor() && e.toTensor().defined() && e.toTensor().is_privateuseone())
          return e.toTensor().device().index();
  }
  return current_index();
}

bool describable(c10::ArrayRef<c10::IValue> args) {
  auto ok = [](const c10::IValue& v) {
    if (!v.isTensor() || !v.toTensor().defined()) return true;
    const at::Tensor& t = v.toTensor();
    return npub_dtype(t.scalar_type()) != DType::kUnknown && !t.is_conj() && !t.is_neg();
  };
  for (const auto& v : args) {
    if (!ok(v)) return false;
    if (v.isList())
      for (const auto& e : v.toListRef())
        if (!ok(e)) return false;
  }
  return true;
}

std::string full_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

}  // namespace npub::torch_backend
