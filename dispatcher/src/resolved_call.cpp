// Resolve once, call resolved (see Dispatcher::resolve in dispatcher.h).
#include "call_state.h"

#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>
#include <npubridge/support/tick_clock.h>

#include <algorithm>
#include <cstring>

namespace npub {

// dispatcher.cpp: why no kernel serves a validated call.
std::string explain_no_kernel(const Dispatcher& d, const Dispatcher::CallState& cs);

// Note [Resolve once, call resolved]
// A compiled graph makes the same calls on every run: the same ops on
// tensors of the same dtypes, shapes and strides, only their data moving.
// Validating the arguments and selecting the kernel are then the same work
// each run, so graph mode does them once, at lowering (resolve), and each
// run only calls the kernel it found (call_resolved). What stays per call
// is what depends on the data or must stay observable: staging (a
// contiguous-only kernel, a half-type call on a float32 kernel), a kernel
// declining the call at run time (it then goes to the fallback, as on every
// path), the precision check and the statistics. A resolution holds under
// the settings it was made with: a changed optimisation level or dtype
// conversion switch, or a disabled plugin, sends the call down the full
// path of Dispatcher::call, which selects again.

const std::string& ResolvedCall::plugin() const {
  static const std::string none;
  return kernel != nullptr && kernel->plugin ? kernel->plugin->name : none;
}

ResolvedCall Dispatcher::resolve(const OpHandle& handle, const NpubValue* args, int32_t num_args) const {
  if (!handle) throw Error(ErrorCode::kInvalidArgument, "Dispatcher::resolve: empty op handle");
  ResolvedCall rc;
  rc.handle = handle;
  rc.num_rets = static_cast<int32_t>(handle.op->schema().returns.size());
  std::vector<NpubValue> rets(static_cast<size_t>(rc.num_rets), none_value());
  CallState cs;
  cs.handle = &rc.handle;
  cs.op = handle.op;
  cs.args = args;
  cs.num_args = num_args;
  cs.rets = rets.data();
  cs.num_rets = rc.num_rets;
  cs.meta = true;  // data may be NULL: only the metadata decides
  validate(cs);
  rc.num_args = cs.num_args;
  rc.filled.assign(cs.args + num_args, cs.args + cs.num_args);
  cs.overlap = Overlap::kNone;  // the caller's guarantee (see dispatcher.h)
  if (!cs.has_device)
    cs.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), devices_.current_device()};
  rc.device = cs.device;
  rc.dtype = cs.dtype;
  rc.opt_level = opt_level();
  rc.dtype_conversion = dtype_conversion();
  rc.kernel = select_kernel(cs, cs.dtype);
  if (rc.kernel == nullptr && (cs.dtype == DType::kFloat16 || cs.dtype == DType::kBFloat16) &&
      rc.dtype_conversion) {
    rc.kernel = select_kernel(cs, DType::kFloat32);
    if (rc.kernel != nullptr) rc.convert_from = cs.dtype;
  }
  if (rc.kernel == nullptr) rc.fallback_reason = explain_no_kernel(*this, cs);
  return rc;
}

void Dispatcher::call_resolved(const ResolvedCall& rc, const NpubValue* args, int32_t num_args,
                               NpubValue* rets, int32_t num_rets, OutputAllocator* outputs) {
  const reg::Kernel* k = rc.kernel;
  if (rc.opt_level != opt_level_.load(std::memory_order_relaxed) ||
      rc.dtype_conversion != dtype_conversion_.load(std::memory_order_relaxed) ||
      (k != nullptr && k->plugin && !k->plugin->enabled.load(std::memory_order_relaxed))) {
    call(rc.handle, args, num_args, rets, num_rets, outputs);
    return;
  }
  if (num_rets != rc.num_rets || num_args > rc.num_args ||
      num_args + static_cast<int32_t>(rc.filled.size()) < rc.num_args)
    throw Error(ErrorCode::kInvalidArgument,
                "op '" + rc.handle.op->name() + "': a resolved call takes " + std::to_string(rc.num_args) +
                    " arguments and " + std::to_string(rc.num_rets) + " returns but found " +
                    std::to_string(num_args) + " and " + std::to_string(num_rets));
  const int64_t t0 = TickClock::now();
  reg::OpStats& stats = rc.handle.op->stats();
  stats.calls.fetch_add(1, std::memory_order_relaxed);
  CallState cs;
  cs.handle = &rc.handle;
  cs.op = rc.handle.op;
  cs.args = args;
  cs.num_args = num_args;
  if (num_args < rc.num_args) {  // the defaults resolve filled in
    NpubValue* full = cs.inline_args.data();
    if (static_cast<size_t>(rc.num_args) > cs.inline_args.size()) {
      cs.heap_args.resize(static_cast<size_t>(rc.num_args));
      full = cs.heap_args.data();
    }
    if (num_args > 0) std::memcpy(full, args, sizeof(NpubValue) * static_cast<size_t>(num_args));
    const size_t skip = rc.filled.size() - static_cast<size_t>(rc.num_args - num_args);
    std::copy(rc.filled.begin() + static_cast<std::ptrdiff_t>(skip), rc.filled.end(), full + num_args);
    cs.args = full;
    cs.num_args = rc.num_args;
  }
  const auto& alias = cs.op->return_alias();
  for (int32_t i = 0; i < num_rets; ++i)
    if (alias[static_cast<size_t>(i)] >= 0) rets[i] = cs.args[alias[static_cast<size_t>(i)]];
  cs.rets = rets;
  cs.num_rets = num_rets;
  NoOutputs no_outputs(cs.op->name());
  cs.outputs = outputs != nullptr ? outputs : &no_outputs;
  cs.device = rc.device;
  cs.has_device = true;
  cs.dtype = rc.dtype;
  cs.overlap = Overlap::kNone;
  try {
    if (k == nullptr) {
      run_fallback(cs, rc.fallback_reason.c_str());
    } else {
      run_selected(cs, *k, rc.convert_from);  // as call() does (no check inside a capture)
    }
  } catch (...) {
    stats.errors.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  stats.total_ticks.fetch_add(TickClock::now() - t0, std::memory_order_relaxed);
}

}  // namespace npub
