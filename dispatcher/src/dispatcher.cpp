// The dispatcher's call path: op lookup and settings, the call (a kernel's
// invocation and the checks of what it returned, a decline, the fallback)
// and the meta call. Validation is validation.cpp, kernel selection
// selection.cpp, plans call_plan.cpp, staging conversion.cpp.
#include "call_state.h"
#include "captured_kernel.h"
#include "host_api.h"
#include "overlap.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/kernel_error.h>
#include <npubridge/dispatcher/trace.h>
#include <npubridge/support/env.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>
#include <npubridge/support/tick_clock.h>
#include "logging.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_set>
#include <utility>

namespace npub {

std::string device_str(const DLDevice& d) {
  if (d.device_type == NPUB_DEVICE_NPU) return "npu:" + std::to_string(d.device_id);
  if (d.device_type == NPUB_DEVICE_CPU) return "cpu";
  return "device(type=" + std::to_string(d.device_type) + ", id=" + std::to_string(d.device_id) + ")";
}

DLTensor* NoOutputs::allocate(int32_t ret_index, const DLDevice&, int32_t, const int64_t*, DLDataType) {
  throw Error(ErrorCode::kInvalidArgument,
              "op '" + op_ + "': return " + std::to_string(ret_index) +
                  " must be allocated, but the caller passed no output allocator");
}

DispatcherOptions DispatcherOptions::from_env() {
  DispatcherOptions o;
  if (auto v = env::get("NPUB_FALLBACK")) {
    if (*v == "error")
      o.fallback_mode = FallbackMode::kError;
    else if (*v == "allow" || *v == "warn" || *v == "1")
      o.fallback_mode = FallbackMode::kAllow;
    else
      throw Error(ErrorCode::kInvalidArgument,
                  "NPUB_FALLBACK: expected 'allow' or 'error' but found " + env::quote(*v));
  }
  o.opt_level =
      static_cast<int>(env::get_int_in("NPUB_OPT_LEVEL", o.opt_level, 0, 3, "an optimisation level"));
  o.dtype_conversion = env::get_flag("NPUB_DTYPE_CONVERSION", o.dtype_conversion);
  // Read again by validate_every_call() at the first kernel call; read here
  // so that a bad value refuses the start, naming the variable, instead of
  // failing inside a call (Note [A setting is read strictly or refused]).
  o.validate_every_call = env::get_flag("NPUB_VALIDATE", false);
  return o;
}

Dispatcher::Dispatcher(reg::Registry& registry, reg::OpMappingTable& op_map, sim::DeviceSet& devices,
                       const DispatcherOptions& options)
    : registry_(registry),
      op_map_(op_map),
      devices_(devices),
      fallback_mode_(options.fallback_mode),
      opt_level_(options.opt_level),
      dtype_conversion_(options.dtype_conversion) {}

OpHandle Dispatcher::find(std::string_view name) const {
  OpHandle h;
  if (const reg::OpMapping* m = op_map_.find(name)) {
    h.op = registry_.find(m->target_op);
    if (h.op != nullptr && !m->plugin.empty()) {
      for (const reg::Kernel* k : h.op->kernels(NPUB_DEVICE_NPU))
        if (k->plugin && k->plugin->name == m->plugin) h.preferred_plugin = k->plugin.get();
    }
    if (h.op != nullptr) return h;
  }
  h.op = registry_.find(name);
  return h;
}

OpHandle Dispatcher::op(std::string_view name) const {
  OpHandle h = find(name);
  if (!h)
    throw Error(ErrorCode::kNotFound, "unknown op '" + std::string(name) +
                                          "': no plugin defines it and the op-mapping table does not map it");
  return h;
}

void Dispatcher::set_opt_level(int level) {
  if (level < 0 || level > 3)
    throw Error(ErrorCode::kInvalidArgument,
                "set_opt_level: expected 0 to 3 but found " + std::to_string(level));
  opt_level_.store(level);
}

void Dispatcher::set_fallback(FallbackFn fn, bool keeps_aliasing) {
  std::lock_guard<std::mutex> lock(config_mu_);
  fallback_ = std::move(fn);
  has_fallback_.store(static_cast<bool>(fallback_));
  fallback_keeps_aliasing_.store(keeps_aliasing && fallback_);
}

bool Dispatcher::has_fallback() const { return has_fallback_.load(); }

bool Dispatcher::refuses_overlaps() const {
  return !(fallback_keeps_aliasing_.load(std::memory_order_relaxed) &&
           fallback_mode_.load(std::memory_order_relaxed) == FallbackMode::kAllow);
}

// ----------------------------------------------------------------------------
// the call
// ----------------------------------------------------------------------------

namespace {
thread_local sim::Generator* tls_call_generator = nullptr;
}  // namespace

ScopedCallGenerator::ScopedCallGenerator(sim::Generator* generator) : outer_(tls_call_generator) {
  tls_call_generator = generator;
}

ScopedCallGenerator::~ScopedCallGenerator() { tls_call_generator = outer_; }

sim::Generator* ScopedCallGenerator::current() { return tls_call_generator; }

namespace {

// Bit i: return i arrived empty (NPUB_VALUE_NONE), for the kernel to fill.
// Returns past the 64th are not checked.
uint64_t empty_returns(const NpubValue* rets, int32_t n) {
  uint64_t bits = 0;
  for (int32_t i = 0; i < n && i < 64; ++i)
    if (rets[i].tag == NPUB_VALUE_NONE) bits |= uint64_t{1} << i;
  return bits;
}

// Whether return `i` of `op` may stay undefined in this call. An ATen op
// follows ATen's convention, where backward ops return undefined tensors
// for gradients not asked for or without an input (output_mask,
// grad_input_mask, has_bias, ...), and conformance compares each with ATen;
// a plugin's own op only when the caller switched it off with a bool[]
// argument named output_mask.
bool may_stay_undefined(const reg::OpEntry& op, const NpubValue* args, int32_t num_args, int32_t i) {
  if (op.schema().ns == "aten") return true;
  const auto& sargs = op.schema().arguments;
  for (int32_t a = 0; a < num_args && a < static_cast<int32_t>(sargs.size()); ++a) {
    const NpubValue& v = args[a];
    if (sargs[static_cast<size_t>(a)].name == "output_mask" && v.tag == NPUB_VALUE_INT_LIST && i < v.count &&
        v.u.ints[i] == 0)
      return true;
  }
  return false;
}

// Note [Kernel outputs are checked]
// What a kernel produced for the returns it had to fill (the ones that
// arrived empty) is checked before anyone reads it, so that a plugin's
// mistake surfaces as an error naming the op and the plugin instead of a
// None in Python or a size error in the next op:
//  - a `Tensor` return left unset is an error, unless the schema lets it be
//    undefined (may_stay_undefined);
//  - when the op has a meta function, the shape and dtype of every tensor
//    the kernel allocated must be what the meta function declares for the
//    same arguments. Running the meta function costs about as much as a
//    small kernel, so it runs at the first call of each signature on each
//    thread (kernel; dtype and rank of every tensor argument; the values of
//    int, bool and int[] arguments), and on every call with NPUB_VALIDATE=1
//    (the test suite's setting): a shape mistake that shows only at some
//    sizes of the same rank escapes the first-call check. Ops without a meta
//    function (ATen's, whose outputs the PyTorch extension preallocates
//    from ATen's own meta kernels) cost one pass over the returns.
bool validate_every_call() {
  static const bool on = env::get_flag("NPUB_VALIDATE", false);
  return on;
}

uint64_t signature_of(const reg::Kernel& k, const NpubValue* args, int32_t n) {
  uint64_t h = reinterpret_cast<uintptr_t>(&k) * 0x9E3779B97F4A7C15ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001B3ull; };
  for (int32_t i = 0; i < n; ++i) {
    const NpubValue& v = args[i];
    mix(static_cast<uint64_t>(v.tag));
    if (v.tag == NPUB_VALUE_TENSOR) {
      mix(static_cast<uint64_t>(v.u.tensor->ndim));
      mix(static_cast<uint64_t>(dtype_of(v.u.tensor->dtype)));
    } else if (v.tag == NPUB_VALUE_INT || v.tag == NPUB_VALUE_BOOL) {
      mix(static_cast<uint64_t>(v.u.i));
    } else if (v.tag == NPUB_VALUE_INT_LIST) {
      for (int32_t j = 0; j < v.count; ++j) mix(static_cast<uint64_t>(v.u.ints[j]));
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
      mix(static_cast<uint64_t>(v.count));
    }
  }
  return h;
}

// Whether this thread has checked this signature already; records it if
// not. Per thread: no lock on the call path (a signature is checked once
// on each thread that calls it).
bool seen_signature(uint64_t signature) {
  thread_local std::unordered_set<uint64_t> seen;
  return !seen.insert(signature).second;
}

// Out of line: called only for kernels that had returns to fill, and kept
// out of invoke_kernel's frame.
[[gnu::noinline]] void check_kernel_returns(const Dispatcher::CallState& cs, const reg::Kernel& k,
                                            const NpubValue* args, const NpubValue* rets,
                                            uint64_t empty_before) {
  const reg::OpEntry& op = *cs.op;
  const auto& returns = op.schema().returns;
  auto fail = [&](const std::string& what) {
    throw KernelError(ErrorCode::kInternal,
                      "op '" + op.name() + "': the kernel of plugin '" + k.plugin_name() + "' " + what);
  };
  bool allocated = false;
  for (int32_t i = 0; i < cs.num_rets && i < 64; ++i) {
    if (((empty_before >> i) & 1u) == 0) continue;
    const reg::Argument& r = returns[static_cast<size_t>(i)];
    if (r.type.base != reg::BaseType::kTensor || r.type.list || r.type.optional) continue;
    if (rets[i].tag == NPUB_VALUE_TENSOR && rets[i].u.tensor == nullptr) {
      fail("set return " + std::to_string(i) + " to a NULL tensor");
    } else if (rets[i].tag == NPUB_VALUE_TENSOR) {
      allocated = true;
    } else if (!may_stay_undefined(op, args, cs.num_args, i)) {
      fail("returned without setting return " + std::to_string(i) + " (" + reg::type_to_string(r.type) +
           (r.name.empty() ? "" : " " + r.name) +
           "): a kernel must allocate each tensor return that arrives empty (alloc_output, or "
           "Call::output in the SDK)");
    }
  }
  const reg::MetaFunction* meta = op.meta();
  if (!allocated || meta == nullptr) return;
  if (!validate_every_call() && seen_signature(signature_of(k, args, cs.num_args))) return;
  std::vector<OutputMeta> expected(returns.size());
  for (size_t i = 0; i < returns.size(); ++i) expected[i].alias = op.return_alias()[i];
  NpubMetaContext mctx{context_head(op.name(), meta->user_data), &op, &expected};
  if (NpubError* e = meta->fn(&mctx, args, cs.num_args)) {
    const std::string msg = consume_error(e);
    fail("produced outputs for arguments that the op's meta function rejects (" + msg + ")");
  }
  for (int32_t i = 0; i < cs.num_rets && i < 64; ++i) {
    if (((empty_before >> i) & 1u) == 0 || rets[i].tag != NPUB_VALUE_TENSOR) continue;
    const OutputMeta& m = expected[static_cast<size_t>(i)];
    if (!m.set) continue;
    const DLTensor* t = rets[i].u.tensor;
    const bool same_shape = static_cast<size_t>(t->ndim) == m.shape.size() &&
                            std::equal(m.shape.begin(), m.shape.end(), t->shape);
    const DType got = dtype_of(t->dtype);
    if (!same_shape || got != m.dtype)
      fail("allocated return " + std::to_string(i) + " as " + std::string(dtype_name(got)) + " " +
           shape_str(t->shape, t->ndim) + ", but the op's meta function declares " + dtype_name(m.dtype) +
           " " + shape_str(m.shape.data(), static_cast<int>(m.shape.size())) +
           " for these arguments (the next op would read a tensor of the wrong size)");
  }
}

// Note [Guard zones] (device_sim/caching_allocator.h): after a kernel ran,
// the guard zones of every npu tensor it was given or returned, and of its
// workspace, must be intact; an overwritten zone is the kernel's write out
// of bounds, reported naming the op and the plugin. Out of line: only with
// NPUB_VALIDATE=1.
[[gnu::noinline]] void check_guard_zones(sim::DeviceSet& devices, const Dispatcher::CallState& cs,
                                         const reg::Kernel& k, const NpubValue* args, const NpubValue* rets,
                                         const KernelLaunch& launch) {
  std::string found;
  auto check = [&](const DLTensor* t) {
    if (t == nullptr || t->data == nullptr || t->device.device_type != NPUB_DEVICE_NPU) return;
    if (t->device.device_id < 0 || t->device.device_id >= devices.count()) return;
    const std::string f = devices.at(t->device.device_id)
                              .allocator()
                              .check_guards(static_cast<const char*>(t->data) + t->byte_offset);
    if (!f.empty()) found += (found.empty() ? "" : "; ") + f;
  };
  auto each = [&](const NpubValue* vs, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      if (vs[i].tag == NPUB_VALUE_TENSOR) check(vs[i].u.tensor);
      if (vs[i].tag == NPUB_VALUE_TENSOR_LIST)
        for (int32_t j = 0; j < vs[i].count; ++j) check(vs[i].u.tensors[j]);
    }
  };
  each(args, cs.num_args);
  each(rets, cs.num_rets);
  if (launch.workspace != nullptr) {
    const std::string f = launch.device->allocator().check_guards(launch.workspace);
    if (!f.empty()) found += (found.empty() ? "workspace: " : "; workspace: ") + f;
  }
  if (!found.empty())
    throw KernelError(ErrorCode::kInternal,
                      "op '" + cs.op->name() + "': the kernel of plugin '" + k.plugin_name() +
                          "' wrote outside its buffers: " + found +
                          " (a guard zone of device memory was overwritten; NPUB_VALIDATE=1)");
}

}  // namespace

// Note [Kernels run inline, in stream order]
// A kernel runs on the calling host thread, using the device's compute
// threads through parallel_for; it is ordered with the other work of the
// device's current stream by waiting for that stream to drain first (only
// when it has pending work: a cheap atomic check on the fast path). This
// keeps the dispatch overhead at tens of nanoseconds and keeps borrowed
// arguments valid for the whole kernel; asynchronous copies and event
// records still overlap with host work.
void invoke_kernel(sim::DeviceSet& devices, const Dispatcher::CallState& cs, const reg::Kernel& k,
                   const NpubValue* args, NpubValue* rets, OutputAllocator* outputs) {
  const int index = cs.device.device_type == NPUB_DEVICE_NPU ? cs.device.device_id : devices.current_device();
  sim::Device& dev = devices.at(index);
  sim::Stream& stream = dev.current_stream();
  KernelLaunch launch;
  launch.kernel = &k;
  launch.op_name = &cs.op->name();
  launch.device = &dev;
  launch.stream = &stream;
  launch.generator = ScopedCallGenerator::current();
  launch.dl_device = cs.device;
  // Note [Capture records instead of running] (graph_capture.h).
  if (sim::Graph* graph = sim::capture_target(dev, stream, [&] { return "op '" + cs.op->name() + "'"; })) {
    capture_kernel(*graph, cs, launch, args, rets, outputs);
    return;
  }
  if (!stream.query()) stream.synchronize();
  struct Workspace {
    sim::Device& dev;
    void* ptr = nullptr;
    ~Workspace() {
      if (ptr != nullptr) dev.free(ptr);
    }
  } workspace{dev};
  if (const uint64_t bytes = query_workspace(launch, args, cs.num_args); bytes > 0) {
    workspace.ptr = launch.workspace = dev.allocate(bytes);
    launch.workspace_bytes = bytes;
  }
  const uint64_t empty_before = empty_returns(rets, cs.num_rets);
  const trace::Scope slice(trace::Kind::kKernel, [&] { return k.plugin_name() + ": " + cs.op->name(); });
  call_kernel_fn(launch, args, cs.num_args, rets, cs.num_rets, outputs);
  if (dev.allocator().guard_bytes() > 0) check_guard_zones(devices, cs, k, args, rets, launch);
  if (empty_before != 0) check_kernel_returns(cs, k, args, rets, empty_before);
  const_cast<reg::Kernel&>(k).calls.fetch_add(1, std::memory_order_relaxed);
}

void Dispatcher::call(std::string_view op_name, const NpubValue* args, int32_t num_args, NpubValue* rets,
                      int32_t num_rets, OutputAllocator* outputs) {
  call(op(op_name), args, num_args, rets, num_rets, outputs);
}

void Dispatcher::call(const OpHandle& handle, const NpubValue* args, int32_t num_args, NpubValue* rets,
                      int32_t num_rets, OutputAllocator* outputs, void* host_call) {
  if (!handle) throw Error(ErrorCode::kInvalidArgument, "Dispatcher::call: empty op handle");
  const int64_t t0 = TickClock::now();
  reg::OpStats& stats = handle.op->stats();
  stats.calls.fetch_add(1, std::memory_order_relaxed);
  CallState cs;
  cs.handle = &handle;
  cs.op = handle.op;
  cs.args = args;
  cs.num_args = num_args;
  cs.rets = rets;
  cs.num_rets = num_rets;
  NoOutputs no_outputs(handle.op->name());
  cs.outputs = outputs != nullptr ? outputs : &no_outputs;
  cs.host_call = host_call;
  try {
    validate(cs);
    cs.overlap = classify_overlap(cs, refuses_overlaps());
    if (!cs.has_device)
      cs.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), devices_.current_device()};
    DType convert_from = DType::kUnknown;
    const reg::Kernel* k = choose(cs, &convert_from);
    if (k == nullptr) {
      run_fallback(cs, nullptr);
    } else {
      run_selected(cs, *k, convert_from);
    }
  } catch (...) {
    stats.errors.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  stats.total_ticks.fetch_add(TickClock::now() - t0, std::memory_order_relaxed);
}

std::vector<OutputMeta> Dispatcher::infer_meta(const OpHandle& handle, const NpubValue* args,
                                               int32_t num_args) const {
  if (!handle) throw Error(ErrorCode::kInvalidArgument, "Dispatcher::infer_meta: empty op handle");
  const reg::OpEntry& op = *handle.op;
  const size_t nret = op.schema().returns.size();
  std::vector<NpubValue> rets(nret, NpubValue{});
  for (auto& r : rets) r.tag = NPUB_VALUE_NONE;
  CallState cs;
  cs.handle = &handle;
  cs.op = handle.op;
  cs.args = args;
  cs.num_args = num_args;
  cs.rets = rets.data();
  cs.num_rets = static_cast<int32_t>(nret);
  cs.meta = true;
  validate(cs);
  std::vector<OutputMeta> out(nret);
  for (size_t i = 0; i < nret; ++i) out[i].alias = op.return_alias()[i];
  const reg::MetaFunction* meta = op.meta();
  bool needs_meta = false;
  for (size_t i = 0; i < nret; ++i) needs_meta = needs_meta || out[i].alias < 0;
  // An op that only writes its arguments needs no meta function (its
  // outputs are its arguments); one it has still checks them.
  if (meta == nullptr && !needs_meta) return out;
  if (meta == nullptr)
    throw Error(ErrorCode::kNotFound, "op '" + op.name() + "' has no meta function: " + op.defined_by() +
                                          " did not register one (register_meta), so its outputs' shapes "
                                          "cannot be known without running it");
  NpubMetaContext ctx{context_head(op.name(), meta->user_data), &op, &out};
  if (NpubError* e = meta->fn(&ctx, cs.args, cs.num_args)) {
    int32_t code = 0;
    const std::string msg = consume_error(e, &code);
    throw Error(code == 0 ? ErrorCode::kInternal : static_cast<ErrorCode>(code),
                "op '" + op.name() + "' (plugin '" + meta->plugin->name + "'): " + msg);
  }
  for (size_t i = 0; i < nret; ++i) {
    const reg::Argument& r = op.schema().returns[i];
    if (out[i].alias < 0 && !out[i].set && r.type.base == reg::BaseType::kTensor && !r.type.list)
      throw Error(ErrorCode::kInternal, "op '" + op.name() + "' (plugin '" + meta->plugin->name +
                                            "'): the meta function did not declare return " +
                                            std::to_string(i) +
                                            " (set_output_meta; a meta function sees no tensor data, so it "
                                            "must declare every output from shapes and dtypes alone)");
  }
  return out;
}

void Dispatcher::run_fallback(CallState& cs, const char* reason) {
  const std::string why = reason != nullptr ? std::string(reason) : explain_no_kernel(*this, cs);
  if (sim::capture_checks_needed() && cs.device.device_type == NPUB_DEVICE_NPU)
    if (sim::Graph* graph = sim::capture_target(devices_.at(cs.device.device_id),
                                                devices_.at(cs.device.device_id).current_stream(),
                                                [&] { return "op '" + cs.op->name() + "'"; }))
      graph->forbid("op '" + cs.op->name() + "'",
                    "it would fall back to the host framework (" + why +
                        "), which a replay cannot run; a capture runs plugin kernels only");
  if (fallback_mode_.load(std::memory_order_relaxed) == FallbackMode::kError)
    throw Error(ErrorCode::kUnsupported,
                "op '" + cs.op->name() + "' is not supported on " + device_str(cs.device) + ": " + why +
                    "; falling back to the host framework is disabled (NPUB_FALLBACK=error)");
  FallbackFn fn;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    fn = fallback_;
  }
  if (!fn)
    throw Error(ErrorCode::kUnsupported, "op '" + cs.op->name() + "' is not supported on " +
                                             device_str(cs.device) + ": " + why +
                                             ", and the host registered no fallback");
  {
    const trace::Scope slice(trace::Kind::kFallback, [&] { return "fallback: " + cs.op->name(); });
    fn(FallbackCall{*cs.op, cs.args, cs.num_args, cs.rets, cs.num_rets, *cs.outputs, why, cs.host_call});
  }
  // Counted and reported once the host served it: a host with no
  // implementation of the op (a plugin's own op) raises its own error
  // instead, and nothing fell back.
  reg::OpStats& stats = cs.op->stats();
  stats.fallbacks.fetch_add(1, std::memory_order_relaxed);
  stats.set_fallback_reason(why);
  if (!stats.fallback_warned.exchange(true))
    log().warn(
        "operator '{}' is not supported on the NPU backend ({}) and fell back to the host "
        "framework's implementation; logged once per op",
        cs.op->name(), why);
}

// Note [A decline falls back on every path]
// A kernel may decline a call it cannot serve (NPUB_ERR_UNSUPPORTED): the
// call then goes to the host framework's fallback as if no kernel had been
// eligible, however the kernel ran (on the caller's tensors, on staged
// contiguous copies, or converted from a half type to float32) and however
// many returns the op has. The caller's return slots are put back first, so
// the fallback sees the call as it came (a staged run never touches them;
// outputs the kernel allocated before declining stay with the allocator,
// which the fallback's allocation for the same return replaces).
namespace {

// The caller's return slots, kept to be put back; inline for up to 8 (no
// allocation on the common path).
class SavedReturns {
 public:
  SavedReturns(const NpubValue* rets, int32_t n) : n_(static_cast<size_t>(n)) {
    if (n_ > inline_.size())
      heap_.assign(rets, rets + n_);
    else
      std::copy(rets, rets + n_, inline_.begin());
  }
  void restore(NpubValue* rets) const {
    const NpubValue* from = n_ > inline_.size() ? heap_.data() : inline_.data();
    std::copy(from, from + n_, rets);
  }

 private:
  size_t n_;
  std::array<NpubValue, 8> inline_{};
  std::vector<NpubValue> heap_;
};
}  // namespace

void Dispatcher::run_selected(CallState& cs, const reg::Kernel& k, DType convert_from) {
  if (precision_enabled_.load(std::memory_order_relaxed) && has_fallback() &&
      cs.overlap != Overlap::kUnsafe &&  // (no kernel serves it); the reference reads its own copies
      !sim::thread_is_capturing() &&     // a capture records: there is nothing to compare
      !checking_reference())             // a call the host makes inside a check's reference
    check_precision(cs, k, convert_from);
  else
    run_kernel(cs, k, convert_from);
}

void Dispatcher::run_kernel(CallState& cs, const reg::Kernel& k, DType convert_from) {
  const SavedReturns saved(cs.rets, cs.num_rets);
  try {
    if (StagingRule(k, convert_from).applies_to(cs))
      run_staged(cs, k, convert_from);
    else
      invoke_kernel(devices_, cs, k, cs.args, cs.rets, cs.outputs);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnsupported || !has_fallback() || dynamic_cast<const sim::CaptureError*>(&e))
      throw;
    saved.restore(cs.rets);
    run_fallback(cs, e.what());
  }
}

}  // namespace npub
