// Dtype and layout conversion around a kernel ("staging").
//
// When the only capable kernel lacks the call's half-precision dtype, the
// dispatcher runs it in float32: inputs of that dtype are cast to float32
// temporaries, outputs come back in float32 and are cast to the call's dtype.
// When a kernel declares NPUB_KERNEL_CONTIGUOUS_ONLY, strided tensors are
// copied to contiguous temporaries. Both go through one mechanism: every
// tensor that needs it is staged into a contiguous temporary of the target
// dtype on the call's device; written ones (Tensor(a!)) are copied back.
#include "call_state.h"

#include <npubridge/device_sim/graph_capture.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/trace.h>
#include <npubridge/support/error.h>

#include <optional>
#include <unordered_map>

namespace npub {

namespace {

// Kernel-allocated outputs during a converted call: float32 outputs are made
// as temporaries and cast to the call's dtype afterwards.
class ConvertingOutputs final : public OutputAllocator {
 public:
  ConvertingOutputs(OutputAllocator& inner, sim::Device& device, bool converting)
      : inner_(inner), device_(device), converting_(converting) {}
  DLTensor* allocate(int32_t ret_index, const DLDevice& dev, int32_t ndim, const int64_t* shape,
                     DLDataType dtype) override {
    if (converting_ && dtype_of(dtype) == DType::kFloat32) {
      temps_.push_back(
          {ret_index, Tensor::empty(std::vector<int64_t>(shape, shape + ndim), DType::kFloat32, &device_)});
      return temps_.back().second.dl();
    }
    return inner_.allocate(ret_index, dev, ndim, shape, dtype);
  }
  std::vector<std::pair<int32_t, Tensor>> temps_;

 private:
  OutputAllocator& inner_;
  sim::Device& device_;
  bool converting_;
};

}  // namespace

std::string conversion_name(DType from, bool back) {
  if (from == DType::kUnknown) return "";
  const std::string half = dtype_name(from);
  return back ? "float32->" + half : half + "->float32";
}

void Dispatcher::run_staged(CallState& cs, const reg::Kernel& k, DType convert_from) {
  const int index =
      cs.device.device_type == NPUB_DEVICE_NPU ? cs.device.device_id : devices_.current_device();
  sim::Device& dev = devices_.at(index);
  const StagingRule rule(k, convert_from);
  const bool converting = rule.converting();
  const auto& sargs = cs.op->schema().arguments;

  std::vector<Tensor> temps;
  std::unordered_map<DLTensor*, DLTensor*> staged;  // original -> temporary
  std::vector<std::pair<DLTensor*, DLTensor*>> write_back;
  auto needs = [&](const DLTensor* t) { return rule.needs(t); };
  auto stage = [&](DLTensor* t, bool written) -> DLTensor* {
    auto it = staged.find(t);
    DLTensor* tmp = nullptr;
    if (it != staged.end()) {
      tmp = it->second;
    } else {
      const DType from = dtype_of(t->dtype);
      const DType to = converting && from == convert_from ? DType::kFloat32 : from;
      temps.push_back(Tensor::empty(std::vector<int64_t>(t->shape, t->shape + t->ndim), to, &dev));
      tmp = temps.back().dl();
      sim::engine_copy(&dev, *tmp, *t, "op '" + cs.op->name() + "' (staging)");
      staged.emplace(t, tmp);
    }
    if (written) {
      bool listed = false;
      for (auto& [o, s] : write_back) listed = listed || o == t;
      if (!listed) write_back.emplace_back(t, tmp);
    }
    return tmp;
  };

  // Slices of their own for the profiler (trace.h): the staging of the
  // inputs, the kernel (invoke_kernel's), the copies back.
  auto slice_name = [&](bool back) {
    if (!converting) return std::string(back ? "contiguous: copy back" : "contiguous: staged copies");
    return "convert: " + conversion_name(convert_from, back);
  };
  std::optional<trace::Scope> staging(std::in_place, trace::Kind::kConversion,
                                      [&] { return slice_name(false); });
  std::vector<NpubValue> args(cs.args, cs.args + cs.num_args);
  std::vector<std::vector<DLTensor*>> lists;
  lists.reserve(static_cast<size_t>(cs.num_args));
  for (int32_t i = 0; i < cs.num_args; ++i) {
    NpubValue& v = args[static_cast<size_t>(i)];
    const bool written = sargs[static_cast<size_t>(i)].is_write();
    if (v.tag == NPUB_VALUE_TENSOR && needs(v.u.tensor)) {
      v.u.tensor = stage(v.u.tensor, written);
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
      bool any = false;
      for (int32_t j = 0; j < v.count; ++j) any = any || needs(v.u.tensors[j]);
      if (!any) continue;
      lists.emplace_back(v.u.tensors, v.u.tensors + v.count);
      for (auto& t : lists.back())
        if (needs(t)) t = stage(t, written);
      v.u.tensors = lists.back().data();
    }
  }
  std::vector<NpubValue> rets(cs.rets, cs.rets + cs.num_rets);
  const auto& alias = cs.op->return_alias();
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    NpubValue& r = rets[static_cast<size_t>(i)];
    if (alias[static_cast<size_t>(i)] >= 0) {
      r = args[static_cast<size_t>(alias[static_cast<size_t>(i)])];
    } else if (r.tag == NPUB_VALUE_TENSOR && needs(r.u.tensor)) {
      r.u.tensor = stage(r.u.tensor, /*written=*/true);
    }
  }

  staging.reset();
  ConvertingOutputs outs(*cs.outputs, dev, converting);
  invoke_kernel(devices_, cs, k, args.data(), rets.data(), &outs);
  const trace::Scope back(trace::Kind::kConversion, [&] { return slice_name(true); });

  for (auto& [original, tmp] : write_back)
    sim::engine_copy(&dev, *original, *tmp, "op '" + cs.op->name() + "' (write back)");
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    const auto ui = static_cast<size_t>(i);
    if (alias[ui] >= 0 || (cs.rets[i].tag == NPUB_VALUE_TENSOR))
      continue;  // caller's tensor, already written back
    cs.rets[i] = rets[ui];
  }
  for (auto& [ret_index, tmp] : outs.temps_) {
    DLTensor* src = tmp.dl();
    DLTensor* final_out =
        cs.outputs->allocate(ret_index, cs.device, src->ndim, src->shape, to_dl(convert_from));
    sim::engine_copy(&dev, *final_out, *src, "op '" + cs.op->name() + "' (converted output)");
    cs.rets[ret_index].tag = NPUB_VALUE_TENSOR;
    cs.rets[ret_index].u.tensor = final_out;
  }
  cs.op->stats().conversions.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace npub
