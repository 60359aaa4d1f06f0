// A kernel step's boxed call and its plan (see step_call.h).
#include "compile/step_call.h"

#include <c10/util/Exception.h>

#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>
#include <npubridge/torch/dtype.h>

#include "aten/boxing.h"
#include "runtime/npu_runtime.h"

#include <optional>

namespace npub::torch_backend {

StepCall::StepCall() = default;
StepCall::~StepCall() = default;
StepCall::StepCall(StepCall&&) noexcept = default;

void describe_slot(DLTensor& dl, const SlotSpec& spec, int device) {
  dl.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), device};
  dl.ndim = static_cast<int32_t>(spec.sizes.size());
  dl.dtype = to_dl(npub_dtype(spec.dtype));
  // Borrowed: the spec outlives the DLTensor.
  dl.shape = const_cast<int64_t*>(spec.sizes.data());
  dl.strides = const_cast<int64_t*>(spec.strides.data());
}

void box_step(const StepSpec& spec, const OpHandle& target, int device,
              const std::function<DLTensor*(int64_t)>& dl_of, StepCall& out) {
  out.boxed = std::make_unique<Boxed>();
  out.boxed->views.reserve(spec.args.size());  // box() hands out addresses into it
  out.lists.reserve(spec.args.size());
  for (const ArgSpec& a : spec.args) {
    if (a.kind == ArgSpec::Kind::kSlot) {
      out.args.push_back(tensor_value(dl_of(a.slot)));
    } else if (a.kind == ArgSpec::Kind::kSlots) {
      out.lists.emplace_back();
      for (int64_t k : a.slots) out.lists.back().push_back(k < 0 ? nullptr : dl_of(k));
      out.args.push_back(tensor_list_value(out.lists.back()));
    } else {
      out.args.push_back(box(a.value, *out.boxed, static_cast<c10::DeviceIndex>(device)));
    }
  }
  const size_t nret = target.op->schema().returns.size();
  for (int64_t o : spec.outs) {
    const NpubValue v = o < 0 ? none_value() : tensor_value(dl_of(o));
    if (spec.via_out)
      out.args.push_back(v);
    else
      out.rets.push_back(v);
  }
  if (spec.via_out) out.rets.assign(nret, none_value());
  TORCH_CHECK(out.rets.size() == nret, "graph node '", spec.node, "': the registry op '", spec.target,
              "' has ", nret, " returns but the node ", spec.outs.size());
}

CallPlan plan_step(int device, const std::unordered_map<int64_t, SlotSpec>& slots, const StepSpec& spec) {
  std::unordered_map<int64_t, DLTensor> dls;
  for (const auto& [k, s] : slots) describe_slot(dls[k], s, device);
  auto dl_of = [&](int64_t k) -> DLTensor* {
    const auto it = dls.find(k);
    TORCH_CHECK(it != dls.end(), "graph node '", spec.node, "': slot ", k, " was not given");
    return &it->second;
  };
  const OpHandle target = rt().dispatcher().op(spec.target);
  StepCall call;
  box_step(spec, target, device, dl_of, call);
  std::optional<CallPlan> plan;
  try {
    plan = rt().dispatcher().plan(target, call.args.data(), static_cast<int32_t>(call.args.size()),
                                  PlanInputs::kMetadata, /*with_returns=*/true);
  } catch (const Error& e) {
    TORCH_CHECK(false, "graph node '", spec.node, "': ", e.what());
  }
  return std::move(*plan);
}

}  // namespace npub::torch_backend
