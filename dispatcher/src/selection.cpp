// Kernel selection (Note [One eligibility rule]): which kernel serves a
// validated call, and why none does.
#include "call_state.h"
#include "overlap.h"

#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/error.h>
#include "logging.h"

#include <algorithm>
#include <string>
#include <vector>

namespace npub {

namespace {
// Note [One eligibility rule]
// A kernel may serve a call when its plugin is enabled, the dispatcher's
// optimisation level reaches the kernel's, it accepts the call's dispatch
// dtype, and its predicate (if any) accepts the arguments; among eligible
// kernels the requested plugin's (an op mapping's) comes first, then the
// highest priority. select_kernel, kernel_for (no arguments, so no
// predicate) and explain_no_kernel all read these functions. A call whose
// written tensors share memory with its inputs narrows the choice further
// (overlap_allows).
bool plugin_enabled(const reg::Kernel& k) {
  return !k.plugin || k.plugin->enabled.load(std::memory_order_relaxed);
}
bool level_allows(const reg::Kernel& k, int level) { return level > 0 && k.min_opt_level <= level; }
bool statically_eligible(const reg::Kernel& k, int level, DType dtype) {
  return plugin_enabled(k) && level_allows(k, level) && k.accepts(dtype);
}

// Note [Per-argument dtypes]: the first tensor argument of the call that
// breaks `k`'s rule when it is dispatched as `dtype` (-1: none). A
// converted call (`dtype` float32 for a half-type call) stages the
// arguments of the call's own dtype to `dtype`, so those count as `dtype`.
// On a mismatch, *found is that tensor's dtype.
int32_t first_misfit(const reg::Kernel& k, const Dispatcher::CallState& cs, DType dtype, DType* found) {
  // Every tensor of the call has its dispatch dtype (validate saw no other),
  // which every rule but a list admits (a converted call stages them all).
  if (k.any_arg_dtypes || (!cs.mixed_dtypes && !k.has_listed_arg_dtypes)) return -1;
  const bool ruled = !k.arg_rules.empty();
  for (int32_t i = 0; i < cs.num_args; ++i) {
    const NpubValue& v = cs.args[i];
    if (v.tag != NPUB_VALUE_TENSOR && v.tag != NPUB_VALUE_TENSOR_LIST) continue;
    const reg::ArgDtypeRule rule = ruled ? k.arg_rules[static_cast<size_t>(i)] : reg::ArgDtypeRule{};
    if (rule.kind == reg::ArgDtypeRule::kAny) continue;
    auto fits = [&](const DLTensor* t) {
      if (t == nullptr) return true;
      DType d = dtype_of(t->dtype);
      if (d == cs.dtype) d = dtype;
      *found = d;
      return rule.kind == reg::ArgDtypeRule::kDispatch ? d == dtype
                                                       : ((rule.mask >> static_cast<int>(d)) & 1u) != 0;
    };
    if (v.tag == NPUB_VALUE_TENSOR) {
      if (!fits(v.u.tensor)) return i;
    } else {
      for (int32_t j = 0; j < v.count; ++j)
        if (!fits(v.u.tensors[j])) return i;
    }
  }
  return -1;
}

bool args_fit(const reg::Kernel& k, const Dispatcher::CallState& cs, DType dtype) {
  DType found = DType::kUnknown;
  const int32_t i = first_misfit(k, cs, dtype, &found);
  if (i < 0) return true;
  if (log().should_log(spdlog::level::debug))
    log().debug("op '{}': the kernel of plugin '{}' does not take argument '{}' as {} (dispatch dtype {})",
                cs.op->name(), k.plugin_name(), cs.op->schema().arguments[static_cast<size_t>(i)].name,
                dtype_name(found), dtype_name(dtype));
  return false;
}

// Note [Memory overlap]: the same view written and read needs a kernel
// that declares it may; any other overlap none may serve.
bool overlap_allows(const reg::Kernel& k, Overlap o) {
  return o == Overlap::kNone || (o == Overlap::kFull && (k.flags & NPUB_KERNEL_ALIAS_SAFE) != 0);
}
template <typename Eligible>
const reg::Kernel* first_eligible(const reg::KernelList& list, const reg::PluginRecord* preferred,
                                  Eligible&& eligible) {
  if (preferred != nullptr)
    for (const reg::Kernel* k : list)
      if (k->plugin.get() == preferred && eligible(*k)) return k;
  for (const reg::Kernel* k : list)
    if (eligible(*k)) return k;
  return nullptr;
}
}  // namespace

const reg::Kernel* Dispatcher::select_kernel(CallState& cs, DType dtype) const {
  const int level = opt_level_.load(std::memory_order_relaxed);
  return first_eligible(
      cs.op->kernels(cs.device.device_type), cs.handle->preferred_plugin, [&](const reg::Kernel& k) {
        return statically_eligible(k, level, dtype) && overlap_allows(k, cs.overlap) &&
               args_fit(k, cs, dtype) &&
               (k.supports == nullptr || k.supports(k.user_data, cs.args, cs.num_args) != 0);
      });
}

const reg::Kernel* Dispatcher::select(const OpHandle& handle, const NpubValue* args, int32_t num_args) const {
  CallState cs;
  cs.handle = &handle;
  cs.op = handle.op;
  cs.args = args;
  cs.num_args = num_args;
  std::vector<NpubValue> rets(handle.op->schema().returns.size(), NpubValue{});
  cs.rets = rets.data();
  cs.num_rets = static_cast<int32_t>(rets.size());
  validate(cs);
  cs.overlap = classify_overlap(cs, refuses_overlaps());
  if (!cs.has_device)
    cs.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), devices_.current_device()};
  DType convert_from = DType::kUnknown;
  return choose(cs, &convert_from);
}

const reg::Kernel* Dispatcher::choose(CallState& cs, DType* convert_from) const {
  *convert_from = DType::kUnknown;
  const reg::Kernel* k = select_kernel(cs, cs.dtype);
  if (k == nullptr && (cs.dtype == DType::kFloat16 || cs.dtype == DType::kBFloat16) &&
      dtype_conversion_.load(std::memory_order_relaxed)) {
    k = select_kernel(cs, DType::kFloat32);
    if (k != nullptr) *convert_from = cs.dtype;
  }
  return k;
}

const reg::Kernel* Dispatcher::kernel_for(const OpHandle& handle, DType dtype, int32_t device_type) const {
  if (!handle) return nullptr;
  const int level = opt_level();
  return first_eligible(handle.op->kernels(device_type), handle.preferred_plugin,
                        [&](const reg::Kernel& k) { return statically_eligible(k, level, dtype); });
}

std::string explain_no_kernel(const Dispatcher& d, const Dispatcher::CallState& cs) {
  const reg::OpEntry& op = *cs.op;
  const DType dtype = cs.dtype;
  const auto& list = op.kernels(cs.device.device_type);
  if (d.opt_level() == 0) return "optimisation level 0 disables every plugin kernel";
  if (cs.overlap == Overlap::kUnsafe)
    return "tensors it writes share memory with other tensors of the call, which no kernel may serve";
  if (cs.overlap == Overlap::kFull &&
      std::any_of(list.begin(), list.end(), [&](const reg::Kernel* k) { return k->accepts(dtype); }) &&
      std::none_of(list.begin(), list.end(), [&](const reg::Kernel* k) {
        return k->accepts(dtype) && (k->flags & NPUB_KERNEL_ALIAS_SAFE) != 0;
      }))
    return std::string("an output is the same memory as an input, and no kernel for dtype ") +
           dtype_name(dtype) + " declares NPUB_KERNEL_ALIAS_SAFE";
  if (list.empty())
    return std::string("no plugin registers a kernel for it on ") +
           (cs.device.device_type == NPUB_DEVICE_CPU ? "cpu" : "npu");
  // Note [Per-argument dtypes]: kernels that take the dispatch dtype but
  // not another argument's; for a half-type call with no such kernel, the
  // float32 kernels the dtype conversion would have run it on.
  std::string misfits;
  auto note_misfits = [&](DType as, const char* how) {
    for (const reg::Kernel* k : list) {
      if (!statically_eligible(*k, d.opt_level(), as)) continue;
      DType found = DType::kUnknown;
      const int32_t i = first_misfit(*k, cs, as, &found);
      if (i < 0) continue;
      const reg::ArgDtypeRule rule =
          k->arg_rules.empty() ? reg::ArgDtypeRule{} : k->arg_rules[static_cast<size_t>(i)];
      misfits +=
          (misfits.empty() ? "" : "; ") + std::string("plugin '") + k->plugin_name() + "'" + how +
          " expects argument '" + op.schema().arguments[static_cast<size_t>(i)].name + "' to be " +
          (rule.kind == reg::ArgDtypeRule::kListed ? "one of {" + reg::dtypes_string(rule.mask) + "}"
                                                   : std::string(dtype_name(as)) + " (the dispatch dtype)") +
          " but found " + dtype_name(found);
    }
  };
  note_misfits(dtype, "");
  if (misfits.empty() && d.dtype_conversion() && (dtype == DType::kFloat16 || dtype == DType::kBFloat16))
    note_misfits(DType::kFloat32, " (float32, for the conversion)");
  if (!misfits.empty()) return "no kernel accepts the arguments' dtypes (" + misfits + ")";
  std::string s = std::string("no kernel accepts dtype ") + dtype_name(dtype) + " (";
  for (size_t i = 0; i < list.size(); ++i) {
    const reg::Kernel* k = list[i];
    s += (i ? "; " : "") + std::string("plugin '") + k->plugin_name() + "': {" + k->dtypes_string() + "}";
    if (!plugin_enabled(*k)) s += " disabled";
    if (!level_allows(*k, d.opt_level())) s += " needs O" + std::to_string(k->min_opt_level);
    if (k->supports != nullptr) s += " with a predicate";
  }
  return s + ")";
}

}  // namespace npub
