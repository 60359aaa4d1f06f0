// The dispatcher: for every call, validate, pick the best kernel, convert
// dtypes and layouts where needed, run it on the device's current stream, or
// fall back to the host framework's own implementation.
//
// The path of one call is drawn in docs/architecture.md.
//
// Configuration (environment, read by DispatcherOptions::from_env):
//   NPUB_FALLBACK=error      a call no kernel serves is an error, not a fallback
//   NPUB_OPT_LEVEL=0..3      optimisation level (default 2)
//   NPUB_DTYPE_CONVERSION=0  never run a half-precision call on an fp32 kernel
#pragma once

#include <npubridge/device_sim/device.h>
#include <npubridge/dispatcher/tensor.h>
#include <npubridge/plugin_api.h>
#include <npubridge/registry/op_registry.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace npub {

namespace numerics {
struct Verdict;  // error_bound.h
}

// A resolved op: keep it to skip the name lookup on every call.
struct OpHandle {
  reg::OpEntry* op = nullptr;
  // Set when the op-mapping table names a plugin for this framework op.
  const reg::PluginRecord* preferred_plugin = nullptr;
  explicit operator bool() const { return op != nullptr; }
};

// Produces the tensors a kernel (or the fallback) allocates for returns that
// the caller did not preallocate. The host decides what they are: npub
// tensors (TensorOutputs), torch tensors (python_ext), ...
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // Returns a contiguous tensor; the allocator keeps ownership.
  virtual DLTensor* allocate(int32_t ret_index, const DLDevice& device, int32_t ndim, const int64_t* shape,
                             DLDataType dtype) = 0;
};

// OutputAllocator that makes npub::Tensor outputs.
class TensorOutputs final : public OutputAllocator {
 public:
  explicit TensorOutputs(sim::DeviceSet& devices) : devices_(devices) {}
  DLTensor* allocate(int32_t ret_index, const DLDevice& device, int32_t ndim, const int64_t* shape,
                     DLDataType dtype) override;
  // The tensor made for return i (undefined if none was).
  Tensor& operator[](size_t i);

 private:
  sim::DeviceSet& devices_;
  std::vector<Tensor> tensors_;
};

// A call handed to the host framework's own implementation: what a kernel
// would receive, why no kernel serves it, and the host's own view of the
// call (what the host passed to Dispatcher::call or run as `host_call`:
// PyTorch's extension passes its boxed or unboxed ATen call, so that its
// fallback runs ATen's kernel on the caller's own tensors).
struct FallbackCall {
  const reg::OpEntry& op;
  const NpubValue* args;
  int32_t num_args;
  NpubValue* rets;
  int32_t num_rets;
  OutputAllocator& outputs;
  const std::string& reason;  // "no kernel accepts dtype int32 (...)", a kernel's decline, ...
  void* host_call;            // nullptr: the dispatcher's own call (a precision check's reference run)
};

// The framework's own implementation of an op, registered by the host. It
// must fill the returns as a kernel does.
using FallbackFn = std::function<void(const FallbackCall& call)>;

enum class FallbackMode { kAllow, kError };

// The dtype and shape of one return, as an op's meta function declared it.
struct OutputMeta {
  bool set = false;
  int32_t alias = -1;  // >= 0: the return is this argument (Tensor(a!))
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;
};

struct PrecisionCheckConfig {
  bool enabled = false;
  // What matches is the op's error model (error_bound.h), as in
  // npub-conformance: no per-dtype tolerance to tune.
  bool raise_on_mismatch = false;  // throw instead of only reporting
};

struct PrecisionMismatch {
  std::string op;
  std::string plugin;
  std::string output;  // "argument 'out'" or "return 0"
  int64_t worst_index = -1;
  double kernel_value = 0, reference_value = 0;
  double abs_error = 0, rel_error = 0;
  double bound = 0;        // the worst element's error bound
  std::string derivation;  // and how it was derived
  std::string note;        // set: the results cannot be compared element by element (shape or dtype differ)
  int64_t num_mismatched = 0, numel = 0;
  std::string message() const;
  // Fills the element fields from the error model's verdict on the output.
  void take(const numerics::Verdict& v);
};

struct KernelStats {
  std::string plugin;
  std::string dtypes;
  int32_t priority = 0;
  int64_t calls = 0;
};

struct OpStatsSnapshot {
  std::string op;
  int64_t calls = 0, fallbacks = 0, conversions = 0, errors = 0, precision_mismatches = 0;
  double total_ms = 0;
  std::vector<KernelStats> kernels;  // npu kernels
};

// Binds `generator` to the dispatcher calls this thread makes while the
// scope lives: their kernels' philox_reserve draws from it instead of the
// device's default generator. How a host passes an explicit generator
// argument (torch.Generator(device="npu")): the Generator value itself
// crosses the ABI as none. Scopes nest; nullptr binds the default again.
class ScopedCallGenerator {
 public:
  explicit ScopedCallGenerator(sim::Generator* generator);
  ~ScopedCallGenerator();
  ScopedCallGenerator(const ScopedCallGenerator&) = delete;
  ScopedCallGenerator& operator=(const ScopedCallGenerator&) = delete;
  // The generator bound on this thread; nullptr: the device's default.
  static sim::Generator* current();

 private:
  sim::Generator* outer_;
};

// How a call's written tensors share memory with its other tensors
// (Note [Memory overlap], dispatcher/src/overlap.h).
enum class Overlap : uint8_t {
  kNone,    // no written tensor shares memory with another tensor
  kFull,    // only as the very same view: alias-safe kernels may serve it
  kUnsafe,  // no kernel may serve it: the fallback does
};

// What a plan was made from (Dispatcher::plan).
enum class PlanInputs : uint8_t {
  // Metadata only (tensors may have NULL data), written tensors taken not
  // to share memory with the call's others: the caller's guarantee (graph
  // mode's memory plan gives every output its own buffer).
  kMetadata,
  // A real call's tensors: the plan holds for calls whose written tensors
  // share memory as these did, which run() checks per call.
  kCall,
};

// Note [One call plan per signature]
// How the dispatcher serves a call, decided once for every call of the same
// signature (op; dtypes, shapes and strides of the tensors; values of the
// other arguments; the device): the kernel and its dtype conversion, or the
// fallback and why; the defaults filled in; how written tensors share
// memory. Dispatcher::call decides it on every call; a host that repeats
// calls keeps the plan (Dispatcher::plan) and runs it (Dispatcher::run),
// which skips validation and selection: PyTorch's eager bridge keeps one
// per call signature beside ATen's output shapes (python_ext
// aten/call_plans.h), graph mode one per kernel step. All three decide
// through the same functions (validate, choose, run_selected /
// run_fallback), so eager and compiled calls agree by construction. A plan
// holds under the kernels and settings it was made with: a plugin loaded
// or removed since, a changed optimisation level or dtype conversion
// switch, or a disabled plugin sends the call down the full path of
// Dispatcher::call, which decides again.
struct CallPlan {
  OpHandle handle;
  const reg::Kernel* kernel = nullptr;   // nullptr: the fallback serves the call
  DType dtype = DType::kUnknown;         // the dispatch dtype
  DType convert_from = DType::kUnknown;  // set: a half-type call run on a float32 kernel
  DLDevice device{};
  PlanInputs inputs = PlanInputs::kMetadata;
  Overlap overlap = Overlap::kNone;  // of the call the plan was made from
  int32_t num_args = 0;              // the schema's arguments, defaults included
  int32_t num_rets = 0;              // the schema's returns
  std::vector<NpubValue> filled;     // the defaults filled in for omitted trailing arguments
  std::string fallback_reason;       // why no kernel serves it (kernel == nullptr)
  // The returns as its kernel makes them, for a kMetadata plan made
  // with_returns (Note [A plan's returns are its kernel's]): one per schema
  // return; unset where nothing can say (the fallback serves the call, or
  // no meta function answers). Empty otherwise.
  std::vector<OutputMeta> returns;
  // What the plan was made under: the op's kernel list on the device (a
  // plugin loaded or removed since publishes another) and the settings.
  const reg::KernelList* kernels = nullptr;
  int opt_level = 0;
  bool dtype_conversion = true;
  const std::string& plugin() const;  // "" for the fallback
  bool serves() const { return kernel != nullptr; }
  std::string conversion() const;  // conversion_name(convert_from): "float16->float32", or ""
};

// The name of a half-type call's staging through a float32 kernel, one
// spelling for the profiler's slices, a compiled program's steps and
// _C._plan_step: "float16->float32" for the inputs, "float32->float16" for
// the copies back (`back`); "" when `from` is kUnknown (no conversion).
std::string conversion_name(DType from, bool back = false);

struct DispatcherOptions {
  FallbackMode fallback_mode = FallbackMode::kAllow;
  int opt_level = 2;
  bool dtype_conversion = true;
  bool validate_every_call = false;  // NPUB_VALIDATE: check every call's outputs against the meta function
  static DispatcherOptions from_env();
};

class Dispatcher {
 public:
  Dispatcher(reg::Registry& registry, reg::OpMappingTable& op_map, sim::DeviceSet& devices,
             const DispatcherOptions& options);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Resolves a framework op name through the op-mapping table, then the
  // registry. An empty handle when the op is unknown.
  OpHandle find(std::string_view name) const;
  // As find(); throws npub::Error(kNotFound) naming the op when unknown.
  OpHandle op(std::string_view name) const;

  // The boxed call. `args` follows the schema (trailing arguments with
  // defaults may be omitted); `rets` has one slot per schema return: a
  // tensor the caller preallocated, or NPUB_VALUE_NONE for the kernel to
  // allocate through `outputs`. Throws npub::Error whose message names the op.
  // `host_call` reaches the fallback (FallbackCall::host_call), if one
  // serves the call.
  void call(const OpHandle& op, const NpubValue* args, int32_t num_args, NpubValue* rets, int32_t num_rets,
            OutputAllocator* outputs, void* host_call = nullptr);
  // By name (one lookup more).
  void call(std::string_view op_name, const NpubValue* args, int32_t num_args, NpubValue* rets,
            int32_t num_rets, OutputAllocator* outputs);

  // The call plan for these arguments (Note [One call plan per signature]):
  // validates them as call() does (with PlanInputs::kMetadata tensors may
  // have NULL data: only dtypes, shapes and strides matter), classifies
  // how written tensors share memory (kCall; kMetadata takes them not to),
  // selects the kernel and decides the dtype conversion. Throws npub::Error
  // naming the op on bad arguments. `with_returns` (kMetadata only) also
  // asks what the kernel returns (CallPlan::returns, Note [A plan's returns
  // are its kernel's]), which runs its meta function: a graph compiler's
  // question while it sizes buffers, not one a call or a program asks.
  CallPlan plan(const OpHandle& op, const NpubValue* args, int32_t num_args,
                PlanInputs inputs = PlanInputs::kMetadata, bool with_returns = false) const;
  // Runs a plan on arguments of its dtypes, shapes and strides (the
  // caller's guarantee: a host keys its plans by that signature): no
  // validation, no selection; staging, the dtype conversion, a kernel's
  // decline to the fallback (Note [A decline falls back on every path]),
  // the precision check and the statistics as call(). `num_args` may omit
  // the trailing arguments the plan filled in; return slots that alias an
  // argument (Tensor(a!)) are set here. A kCall plan whose call shared
  // memory otherwise than this one, or one whose settings changed, takes
  // the full path of call().
  void run(const CallPlan& plan, const NpubValue* args, int32_t num_args, NpubValue* rets, int32_t num_rets,
           OutputAllocator* outputs, void* host_call = nullptr);

  // The kernel that would serve these arguments (nullptr: fallback).
  const reg::Kernel* select(const OpHandle& op, const NpubValue* args, int32_t num_args) const;

  // The tools' view: the kernel that would serve `op` for dispatch dtype
  // `dtype` on `device_type` at the current level, predicates not consulted
  // (they need arguments). nullptr: no kernel (fallback or conversion).
  // The returns' dtypes and shapes of a call, without running it: the op's
  // meta function (NpubHostApi.register_meta) on the arguments, whose
  // tensors may have NULL data. Validates the arguments like call(); throws
  // npub::Error naming the op when it has no meta function, when the meta
  // function rejects the arguments, or when it leaves a return undeclared.
  std::vector<OutputMeta> infer_meta(const OpHandle& op, const NpubValue* args, int32_t num_args) const;

  const reg::Kernel* kernel_for(const OpHandle& op, DType dtype, int32_t device_type = NPUB_DEVICE_NPU) const;

  // `keeps_aliasing`: the fallback runs a call with its arguments' memory
  // sharing intact, so its framework's own overlap checks apply (ATen's,
  // which differ per op): the overlaps the dispatcher would refuse with its
  // copy of ATen's messages (Note [Memory overlap]) go to the fallback
  // instead, unless NPUB_FALLBACK=error forbids it.
  void set_fallback(FallbackFn fn, bool keeps_aliasing = false);
  bool has_fallback() const;
  void set_fallback_mode(FallbackMode m) { fallback_mode_.store(m); }
  FallbackMode fallback_mode() const { return fallback_mode_.load(); }
  void set_opt_level(int level);
  int opt_level() const { return opt_level_.load(std::memory_order_relaxed); }
  void set_dtype_conversion(bool on) { dtype_conversion_.store(on); }
  bool dtype_conversion() const { return dtype_conversion_.load(); }
  void set_precision_check(const PrecisionCheckConfig& cfg);
  PrecisionCheckConfig precision_check() const;
  std::vector<PrecisionMismatch> precision_mismatches() const;
  void clear_precision_mismatches();

  std::vector<OpStatsSnapshot> stats() const;  // ops with at least one call
  // Per registry op the host served through the fallback, why the latest
  // such call fell back (a kernel's decline message, or why no kernel was
  // eligible): what `npub-conformance` reports for a sample a plugin's
  // kernel did not serve. Kept across reset_stats().
  std::map<std::string, std::string> fallback_reasons() const;
  void reset_stats();
  int64_t total_fallbacks() const;
  // Counts a call the host framework computed without asking the dispatcher
  // (no plugin serves the op, or its dtype has no DLPack code) as a call
  // and a fallback of `op` in stats(), beside the dispatcher's own
  // fallbacks: one account per op name whichever path fell back. True for
  // the op's first host fallback in the process (the host warns once; reset_stats
  // does not warn again).
  bool record_host_fallback(std::string_view op);

  reg::Registry& registry() { return registry_; }
  reg::OpMappingTable& op_map() { return op_map_; }
  sim::DeviceSet& devices() { return devices_; }

  // Internal: the state of one call (dispatcher/src/call_state.h).
  struct CallState;

 private:
  void validate(CallState& cs) const;
  const reg::Kernel* select_kernel(CallState& cs, DType dtype) const;
  void run_kernel(CallState& cs, const reg::Kernel& k, DType convert_from);
  void run_staged(CallState& cs, const reg::Kernel& k, DType convert_from);
  void run_fallback(CallState& cs, const char* reason);
  // Whether classify_overlap raises ATen's overlap errors itself (see
  // set_fallback's keeps_aliasing).
  bool refuses_overlaps() const;
  void check_precision(CallState& cs, const reg::Kernel& k, DType convert_from);
  static bool checking_reference();  // this thread runs a check's references (precision_check.cpp)
  // A mismatch check_precision found: logged, listed, counted on `counted_on`
  // (else on the op named m.op); throws when raise_on_mismatch is set.
  void record_precision_mismatch(const PrecisionMismatch& m, const reg::OpEntry* counted_on = nullptr);
  // The kernel for a validated call (nullptr: the fallback), with the
  // dtype conversion it needs in *convert_from: the one selection that
  // call(), select() and plan() make.
  const reg::Kernel* choose(CallState& cs, DType* convert_from) const;
  // Runs the selected kernel: through check_precision when the check is on
  // and may run here, else run_kernel. Both call() and run() go through
  // it, so that the two paths decide alike.
  void run_selected(CallState& cs, const reg::Kernel& k, DType convert_from);
  [[noreturn]] void no_kernel(CallState& cs, const char* why) const;

  reg::Registry& registry_;
  reg::OpMappingTable& op_map_;
  sim::DeviceSet& devices_;
  std::atomic<FallbackMode> fallback_mode_;
  std::atomic<int> opt_level_;
  std::atomic<bool> dtype_conversion_;
  std::atomic<bool> precision_enabled_{false};
  mutable std::mutex config_mu_;  // fallback_, precision config and report
  FallbackFn fallback_;
  std::atomic<bool> has_fallback_{false};
  std::atomic<bool> fallback_keeps_aliasing_{false};
  PrecisionCheckConfig precision_;
  std::vector<PrecisionMismatch> mismatches_;
  mutable std::mutex host_fallback_mu_;
  std::map<std::string, int64_t, std::less<>> host_fallbacks_;  // record_host_fallback
};

}  // namespace npub
