// What ops and kernels exist: the registry.
//
// Note [Why dispatch reads take no lock]
// Registration is rare (plugin load, register_op); dispatch is hot and runs
// on many threads. Every structure the dispatch path reads is an immutable
// snapshot published through an atomic pointer: the name -> op map and each
// op's kernel list. A writer (under the registry's mutex) builds a new
// snapshot, publishes it with a release store, and retires the old one to a
// list that is freed only when the registry is destroyed. Readers do one
// acquire load and never see a half-built structure or a freed one. The cost
// is memory for retired snapshots, bounded by the number of registrations.
#pragma once

#include <npubridge/plugin_api.h>
#include <npubridge/registry/derivative_formula.h>
#include <npubridge/registry/fusion_pattern.h>
#include <npubridge/registry/schema.h>
#include <npubridge/support/dtype.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace npub::reg {

class OpEntry;

// A loaded plugin, as the registry sees it. Shared by its kernels: the last
// kernel to go releases it, and with it the library (see PluginRecord::library).
struct PluginRecord {
  std::string name;
  std::string version;
  std::string path;
  uint32_t abi_minor = 0;
  std::atomic<bool> enabled{true};
  // Keeps the shared library mapped while anything it registered is alive.
  std::shared_ptr<void> library;
  void (*shutdown)(void) = nullptr;
  ~PluginRecord();
};

// The dtypes of a mask (bit per npub::DType), "float32, int64".
std::string dtypes_string(uint32_t mask);

// Note [Per-argument dtypes]
// A kernel accepts a call only when every tensor argument's dtype follows
// the kernel's rule for that argument (NpubKernelDesc.arg_dtypes, ABI 1.4):
// by default the dispatch dtype (the first tensor argument's), which is all
// a kernel built before 1.4 could have meant, so a call mixing dtypes no
// longer reaches a kernel that would read float64 data as float. Rules are
// resolved to schema argument indices at registration, so the check at
// dispatch is one pass over the arguments (Dispatcher's args_fit).
struct ArgDtypeRule {
  enum Kind : uint8_t { kDispatch, kAny, kListed } kind = kDispatch;
  uint32_t mask = 0;  // kListed: bit per npub::DType
};

class Kernel {
 public:
  // Declared first: destroyed last, after user_data_deleter ran (its code
  // lives in the library this keeps loaded).
  std::shared_ptr<PluginRecord> plugin;
  OpEntry* op = nullptr;
  int32_t device_type = NPUB_DEVICE_NPU;
  int32_t priority = 0;
  uint32_t dtype_mask = 0;  // bit per npub::DType; 0 = any dtype
  uint32_t flags = 0;
  int32_t min_opt_level = 1;
  // One per schema argument (Note [Per-argument dtypes]); empty: every
  // tensor argument has the dispatch dtype. All kAny when the kernel is
  // registered NPUB_KERNEL_MIXED_DTYPES.
  std::vector<ArgDtypeRule> arg_rules;
  bool any_arg_dtypes = false;         // every rule is kAny: nothing to check
  bool has_listed_arg_dtypes = false;  // some rule is kListed
  NpubKernelFn fn = nullptr;
  NpubSupportsFn supports = nullptr;
  NpubWorkspaceSizeFn workspace_size = nullptr;
  // What this kernel returns, where it may differ from the op's meta
  // function (NpubKernelDesc.meta, \since 1.6); nullptr: the op's answers.
  NpubMetaFn meta = nullptr;
  void* user_data = nullptr;
  void (*user_data_deleter)(void*) = nullptr;
  std::atomic<int64_t> calls{0};

  Kernel() = default;
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;
  ~Kernel();

  bool accepts(DType t) const {
    return dtype_mask == 0 || (t != DType::kUnknown && ((dtype_mask >> static_cast<int>(t)) & 1u));
  }
  std::string plugin_name() const { return plugin ? plugin->name : std::string("host"); }
  std::string dtypes_string() const;
};

// A plugin's meta (shape) function for an op (NpubHostApi.register_meta).
struct MetaFunction {
  NpubMetaFn fn = nullptr;
  std::shared_ptr<PluginRecord> plugin;  // keeps fn's code loaded
  void* user_data = nullptr;             // NpubHostApi.register_meta_with_data (\since 1.4)
};

// What an op has besides kernels; immutable once published.
struct OpAnnotations {
  MetaFunction meta;
  std::shared_ptr<const Derivative> derivative;
};

// Kernels of one op for one device type, best first (priority descending,
// then registration order).
using KernelList = std::vector<Kernel*>;

// Per-op statistics. Counters only; readers may see them mid-update.
struct OpStats {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> fallbacks{0};
  std::atomic<int64_t> conversions{0};  // calls that converted dtype or layout
  std::atomic<int64_t> errors{0};
  std::atomic<int64_t> total_ticks{0};  // TickClock ticks in Dispatcher::call
  std::atomic<int64_t> precision_mismatches{0};
  std::atomic<bool> fallback_warned{false};
  std::atomic<bool> unjudged_warned{false};  // the precision check found no reference for the op
  void reset();                              // the counters; the last fallback's reason stays
  // Why the dispatcher last fell back for the op: a kernel's decline
  // message, or why no kernel was eligible (Dispatcher::fallback_reasons).
  void set_fallback_reason(const std::string& why);
  std::string fallback_reason() const;

 private:
  mutable std::mutex reason_mu_;
  std::string fallback_reason_;  // guarded by reason_mu_
};

class OpEntry {
 public:
  OpEntry(Schema schema, std::string defined_by);
  const Schema& schema() const { return schema_; }
  const std::string& name() const { return name_; }
  const std::string& defined_by() const { return defined_by_; }
  // See Note [Why dispatch reads take no lock].
  const KernelList& kernels(int32_t device_type) const {
    return *slot(device_type).load(std::memory_order_acquire);
  }
  OpStats& stats() const { return stats_; }
  // Arguments without a default that the caller must pass.
  int32_t num_required_args() const { return num_required_; }
  // Index of the argument each return aliases (Tensor(a!) returns), or -1.
  const std::vector<int32_t>& return_alias() const { return return_alias_; }
  const std::vector<uint32_t>& accepted() const { return accepted_; }
  // The meta function and derivative a plugin registered, or null (lock-free,
  // like the kernel lists).
  const MetaFunction* meta() const {
    const OpAnnotations* a = annotations_.load(std::memory_order_acquire);
    return a != nullptr && a->meta.fn != nullptr ? &a->meta : nullptr;
  }
  const Derivative* derivative() const {
    const OpAnnotations* a = annotations_.load(std::memory_order_acquire);
    return a != nullptr ? a->derivative.get() : nullptr;
  }

 private:
  friend class Registry;
  std::atomic<const KernelList*>& slot(int32_t device_type) const {
    return device_type == NPUB_DEVICE_CPU ? cpu_ : npu_;
  }
  Schema schema_;
  std::string name_;
  std::string defined_by_;
  int32_t num_required_ = 0;
  std::vector<int32_t> return_alias_;
  std::vector<uint32_t> accepted_;
  mutable std::atomic<const KernelList*> npu_;
  mutable std::atomic<const KernelList*> cpu_;
  std::atomic<const OpAnnotations*> annotations_{nullptr};
  mutable OpStats stats_;
};

// Everything one plugin registers, applied by Registry::commit as one.
struct Registrations {
  std::string defined_by;  // who defines the new ops, e.g. "plugin 'cann_like'"
  std::vector<Schema> schemas;
  std::vector<std::pair<std::string, std::unique_ptr<Kernel>>> kernels;  // op name, kernel
  std::vector<std::pair<std::string, MetaFunction>> metas;
  std::vector<std::pair<std::string, Derivative>> derivatives;
  std::vector<FusionPattern> fusion_patterns;  // \since ABI 1.5
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Defines an op; returns the existing entry when the same schema is
  // defined again. Throws npub::Error when the name exists with another
  // schema.
  OpEntry* define(const Schema& schema, const std::string& defined_by);
  // Adds a kernel. Throws npub::Error for a kernel that would be ambiguous
  // (same op, device type and priority, overlapping dtypes).
  void add_kernel(std::unique_ptr<Kernel> kernel);
  // Sets an op's meta function or derivative (the other one is kept).
  // Throws npub::Error when the op already has one.
  void set_meta(OpEntry* op, MetaFunction meta);
  void set_derivative(OpEntry* op, Derivative derivative);
  // Applies a whole batch or nothing (Note [A plugin's registrations commit
  // as one]): every check runs first, under the writers' lock; on a
  // conflict throws npub::Error naming it and leaves the registry as it was.
  void commit(Registrations batch);
  // Adds the host's own fusion patterns (already checked); throws
  // npub::Error when a name is taken.
  void add_fusion_patterns(std::vector<FusionPattern> patterns);
  // Every fusion pattern, in registration order.
  std::vector<FusionPattern> fusion_patterns() const { return fusion_patterns_.entries(); }
  // Drops every kernel of a plugin.
  void remove_plugin_kernels(const PluginRecord* plugin);

  // Lock-free lookup (Note [Why dispatch reads take no lock]).
  OpEntry* find(std::string_view name) const;
  std::vector<OpEntry*> ops() const;  // sorted by name
  // Which ops each plugin serves (plugin name -> sorted op names, "host"
  // for kernels registered by the host itself).
  std::vector<std::pair<std::string, std::vector<std::string>>> coverage_by_plugin() const;

 private:
  using OpMap = std::unordered_map<std::string_view, OpEntry*>;
  void publish_list(OpEntry* op, int32_t device_type, KernelList list);
  // Checks and updates for the public writers; the caller holds mu_.
  OpEntry* find_locked(const std::string& name) const;
  static std::string schema_conflict(const OpEntry& existing, const Schema& schema);
  static std::string kernel_conflict(const std::string& op_name, const KernelList& list,
                                     const Kernel& kernel);
  static std::string meta_conflict(const OpEntry& op);
  static std::string derivative_conflict(const OpEntry& op);
  OpEntry* add_op_locked(const Schema& schema, const std::string& defined_by);
  void annotate_locked(OpEntry* op, MetaFunction* meta, Derivative* derivative);

  mutable std::mutex mu_;  // writers only
  std::vector<std::unique_ptr<OpEntry>> ops_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::atomic<const OpMap*> map_;
  std::vector<std::unique_ptr<const OpMap>> retired_maps_;
  std::vector<std::unique_ptr<const KernelList>> lists_;           // current and retired
  std::vector<std::unique_ptr<const OpAnnotations>> annotations_;  // current and retired
  FusionPatternTable fusion_patterns_;
};

// The op-mapping table: framework op name -> the op (and optionally the
// plugin) that serves it, in the spirit of torch_npu's op-plugin yaml. Read
// from a text file shipped with npubridge and extended at run time.
struct OpMapping {
  std::string framework_op;
  std::string target_op;
  std::string plugin;  // empty: any plugin
};

class OpMappingTable {
 public:
  OpMappingTable();
  ~OpMappingTable();
  // Lines: `framework_op target_op [plugin]`, '#' starts a comment. Throws
  // npub::Error naming the file and line on a malformed line.
  void load_file(const std::string& path);
  void load_text(const std::string& text, const std::string& origin);
  // Adds or replaces one mapping.
  void set(const OpMapping& m);
  // Removes the mapping of `framework_op`; returns whether there was one
  // (the version moves only then). Calls then take the op's own route.
  bool remove(std::string_view framework_op);
  // Lock-free, like the registry.
  const OpMapping* find(std::string_view framework_op) const;
  std::vector<OpMapping> entries() const;
  // Bumped by every change: a host that caches resolved ops re-resolves
  // when it moves.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  using Map = std::unordered_map<std::string, OpMapping>;
  std::atomic<uint64_t> version_{0};
  mutable std::mutex mu_;
  std::atomic<const Map*> map_;
  std::vector<std::unique_ptr<const Map>> snapshots_;
};

}  // namespace npub::reg
