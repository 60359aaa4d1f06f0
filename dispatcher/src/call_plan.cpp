// A call plan made once and run many times (Note [One call plan per
// signature], dispatcher.h).
#include "call_state.h"
#include "host_api.h"
#include "overlap.h"

#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>
#include <npubridge/support/tick_clock.h>

#include <algorithm>
#include <cstring>

namespace npub {

// Note [What a plan decides and what each run does]
// A compiled graph makes the same calls on every run, and an eager program
// mostly repeats a few: the same ops on tensors of the same dtypes, shapes
// and strides, only their data moving. Validating the arguments and
// selecting the kernel are then the same work each time, so a plan does
// them once and each run only calls the kernel it found. What stays per
// run is what depends on the data or must stay observable: how written
// tensors share memory (a kCall plan), staging (a contiguous-only kernel, a
// half-type call on a float32 kernel), a kernel declining the call at run
// time (it then goes to the fallback, as on every path), the precision
// check and the statistics. A kernel's predicate (supports) is asked when
// the plan is made: it must decide from the metadata and the non-tensor
// arguments, never from tensor data.

// Note [A plan's returns are its kernel's]
// A graph compiler sizes every buffer before anything runs, from the
// graph's meta values; the kernel that serves a step may return otherwise
// (an ATen op's meta function says float32 for LayerNorm's mean where the
// plugin's kernel, as ATen's own CPU kernel, returns the input's bfloat16).
// So a kMetadata plan made with_returns (the lowering's question, through
// _C._plan_step; a program's own plans do not ask) asks the kernel what it
// returns: its own meta
// function (NpubKernelDesc.meta, ABI 1.6; the SDK's is the kernel body run
// on metadata), else the op's. A half-type call served by a float32 kernel
// shows the kernel float32 arguments, and float32 returns come back in the
// call's dtype, as the staging does (conversion.cpp). A return the kernel's
// meta function leaves unsaid (it fails, or reaches data first) is the
// op's meta function's to say; where neither says, it stays unset (the
// lowering keeps the graph's meta value, and a kernel that returns
// otherwise fails at run time, naming the node).
namespace {

// One meta function's answer into `out` (false, and nothing set, when it
// fails).
bool ask_meta(const reg::OpEntry& op, NpubMetaFn fn, void* user_data, std::vector<NpubValue>& args,
              std::vector<OutputMeta>& out) {
  NpubMetaContext ctx{context_head(op.name(), user_data), &op, &out};
  if (NpubError* e = fn(&ctx, args.data(), static_cast<int32_t>(args.size()))) {
    consume_error(e);
    for (OutputMeta& o : out) o.set = false;
    return false;
  }
  return true;
}

std::vector<OutputMeta> kernel_returns(const Dispatcher::CallState& cs, const reg::Kernel& k,
                                       DType convert_from) {
  const reg::OpEntry& op = *cs.op;
  const size_t nret = op.schema().returns.size();
  std::vector<OutputMeta> out(nret);
  for (size_t i = 0; i < nret; ++i) out[i].alias = op.return_alias()[i];
  if (k.meta == nullptr && op.meta() == nullptr) return out;
  // The arguments as the kernel sees them (a converted call's in float32).
  const bool converting = convert_from != DType::kUnknown;
  std::vector<NpubValue> args(cs.args, cs.args + cs.num_args);
  size_t count = 0;
  for (const NpubValue& v : args)
    count += v.tag == NPUB_VALUE_TENSOR        ? 1
             : v.tag == NPUB_VALUE_TENSOR_LIST ? static_cast<size_t>(v.count)
                                               : 0;
  std::vector<DLTensor> tensors;  // never reallocated: the arguments point into it
  tensors.reserve(count);
  std::vector<std::vector<DLTensor*>> lists;
  lists.reserve(args.size());
  auto as_kernel_sees = [&](DLTensor* t) -> DLTensor* {
    if (!converting || t == nullptr || dtype_of(t->dtype) != convert_from) return t;
    tensors.push_back(*t);
    tensors.back().dtype = to_dl(DType::kFloat32);
    return &tensors.back();
  };
  for (NpubValue& v : args) {
    if (v.tag == NPUB_VALUE_TENSOR) {
      v.u.tensor = as_kernel_sees(v.u.tensor);
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST && converting) {
      lists.emplace_back(v.u.tensors, v.u.tensors + v.count);
      for (DLTensor*& t : lists.back()) t = as_kernel_sees(t);
      v.u.tensors = lists.back().data();
    }
  }
  if (k.meta != nullptr) ask_meta(op, k.meta, k.user_data, args, out);
  // What the kernel's own meta function left unsaid (it reached data
  // first, or the kernel has none), the op's says.
  const bool unsaid =
      std::any_of(out.begin(), out.end(), [](const OutputMeta& o) { return o.alias < 0 && !o.set; });
  if (unsaid && op.meta() != nullptr) {
    std::vector<OutputMeta> op_out(nret);
    for (size_t i = 0; i < nret; ++i) op_out[i].alias = out[i].alias;
    if (ask_meta(op, op.meta()->fn, op.meta()->user_data, args, op_out))
      for (size_t i = 0; i < nret; ++i)
        if (!out[i].set && op_out[i].set) out[i] = op_out[i];
  }
  if (converting)
    for (OutputMeta& o : out)
      if (o.set && o.dtype == DType::kFloat32) o.dtype = convert_from;
  return out;
}

}  // namespace

const std::string& CallPlan::plugin() const {
  static const std::string none;
  return kernel != nullptr && kernel->plugin ? kernel->plugin->name : none;
}

std::string CallPlan::conversion() const { return conversion_name(convert_from); }

CallPlan Dispatcher::plan(const OpHandle& handle, const NpubValue* args, int32_t num_args, PlanInputs inputs,
                          bool with_returns) const {
  if (!handle) throw Error(ErrorCode::kInvalidArgument, "Dispatcher::plan: empty op handle");
  CallPlan p;
  p.handle = handle;
  p.inputs = inputs;
  p.num_rets = static_cast<int32_t>(handle.op->schema().returns.size());
  std::vector<NpubValue> rets(static_cast<size_t>(p.num_rets), none_value());
  CallState cs;
  cs.handle = &p.handle;
  cs.op = handle.op;
  cs.args = args;
  cs.num_args = num_args;
  cs.rets = rets.data();
  cs.num_rets = p.num_rets;
  cs.meta = inputs == PlanInputs::kMetadata;  // data may be NULL: only the metadata decides
  validate(cs);
  p.num_args = cs.num_args;
  p.filled.assign(cs.args + num_args, cs.args + cs.num_args);
  cs.overlap = inputs == PlanInputs::kCall ? classify_overlap(cs, refuses_overlaps()) : Overlap::kNone;
  p.overlap = cs.overlap;
  if (!cs.has_device)
    cs.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), devices_.current_device()};
  p.device = cs.device;
  p.dtype = cs.dtype;
  p.kernels = &handle.op->kernels(cs.device.device_type);
  p.opt_level = opt_level();
  p.dtype_conversion = dtype_conversion();
  p.kernel = choose(cs, &p.convert_from);
  if (p.kernel == nullptr) p.fallback_reason = explain_no_kernel(*this, cs);
  if (inputs == PlanInputs::kMetadata && with_returns)
    p.returns = p.kernel != nullptr ? kernel_returns(cs, *p.kernel, p.convert_from)
                                    : std::vector<OutputMeta>(static_cast<size_t>(p.num_rets));
  return p;
}

void Dispatcher::run(const CallPlan& p, const NpubValue* args, int32_t num_args, NpubValue* rets,
                     int32_t num_rets, OutputAllocator* outputs, void* host_call) {
  const reg::Kernel* k = p.kernel;
  if (&p.handle.op->kernels(p.device.device_type) != p.kernels ||
      p.opt_level != opt_level_.load(std::memory_order_relaxed) ||
      p.dtype_conversion != dtype_conversion_.load(std::memory_order_relaxed) ||
      (k != nullptr && k->plugin && !k->plugin->enabled.load(std::memory_order_relaxed))) {
    call(p.handle, args, num_args, rets, num_rets, outputs, host_call);
    return;
  }
  if (num_rets != p.num_rets || num_args > p.num_args ||
      num_args + static_cast<int32_t>(p.filled.size()) < p.num_args)
    throw Error(ErrorCode::kInvalidArgument,
                "op '" + p.handle.op->name() + "': a call plan takes " + std::to_string(p.num_args) +
                    " arguments and " + std::to_string(p.num_rets) + " returns but found " +
                    std::to_string(num_args) + " and " + std::to_string(num_rets));
  const int64_t t0 = TickClock::now();
  CallState cs;
  cs.handle = &p.handle;
  cs.op = p.handle.op;
  cs.args = args;
  cs.num_args = num_args;
  if (num_args < p.num_args) {  // the defaults the plan filled in
    NpubValue* full = cs.inline_args.data();
    if (static_cast<size_t>(p.num_args) > cs.inline_args.size()) {
      cs.heap_args.resize(static_cast<size_t>(p.num_args));
      full = cs.heap_args.data();
    }
    if (num_args > 0) std::memcpy(full, args, sizeof(NpubValue) * static_cast<size_t>(num_args));
    const size_t skip = p.filled.size() - static_cast<size_t>(p.num_args - num_args);
    std::copy(p.filled.begin() + static_cast<std::ptrdiff_t>(skip), p.filled.end(), full + num_args);
    cs.args = full;
    cs.num_args = p.num_args;
  }
  const auto& alias = cs.op->return_alias();
  for (int32_t i = 0; i < num_rets; ++i)
    if (alias[static_cast<size_t>(i)] >= 0) rets[i] = cs.args[alias[static_cast<size_t>(i)]];
  cs.rets = rets;
  cs.num_rets = num_rets;
  cs.device = p.device;
  cs.has_device = true;
  cs.dtype = p.dtype;
  cs.overlap = p.overlap;
  reg::OpStats& stats = p.handle.op->stats();
  if (p.inputs == PlanInputs::kCall) {
    Overlap now = Overlap::kNone;
    try {
      now = classify_overlap(cs, refuses_overlaps());
    } catch (...) {  // ATen's overlap errors (Note [Memory overlap])
      stats.calls.fetch_add(1, std::memory_order_relaxed);
      stats.errors.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
    if (now != p.overlap) {
      // The same signature, other sharing (x.add_(x) after x.add_(y)):
      // decided anew.
      call(p.handle, args, num_args, rets, num_rets, outputs, host_call);
      return;
    }
  }
  stats.calls.fetch_add(1, std::memory_order_relaxed);
  NoOutputs no_outputs(cs.op->name());
  cs.outputs = outputs != nullptr ? outputs : &no_outputs;
  cs.host_call = host_call;
  try {
    if (k == nullptr) {
      run_fallback(cs, p.fallback_reason.c_str());
    } else {
      run_selected(cs, *k, p.convert_from);  // as call() does (no check inside a capture)
    }
  } catch (...) {
    stats.errors.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  stats.total_ticks.fetch_add(TickClock::now() - t0, std::memory_order_relaxed);
}

}  // namespace npub
