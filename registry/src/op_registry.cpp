#include <npubridge/registry/op_registry.h>
#include <npubridge/support/error.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace npub::reg {

PluginRecord::~PluginRecord() {
  if (shutdown != nullptr) shutdown();
}

Kernel::~Kernel() {
  if (user_data_deleter != nullptr) user_data_deleter(user_data);
}

std::string dtypes_string(uint32_t mask) {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i)
    if ((mask >> i) & 1u) s += (s.empty() ? "" : ", ") + std::string(dtype_name(static_cast<DType>(i)));
  return s;
}

std::string Kernel::dtypes_string() const { return dtype_mask == 0 ? "any" : reg::dtypes_string(dtype_mask); }

void OpStats::reset() {
  calls = 0;
  fallbacks = 0;
  conversions = 0;
  errors = 0;
  total_ticks = 0;
  precision_mismatches = 0;
}

void OpStats::set_fallback_reason(const std::string& why) {
  std::lock_guard<std::mutex> lock(reason_mu_);
  fallback_reason_ = why;
}

std::string OpStats::fallback_reason() const {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return fallback_reason_;
}

namespace {
const KernelList kEmptyList;
}

OpEntry::OpEntry(Schema schema, std::string defined_by)
    : schema_(std::move(schema)),
      name_(schema_.qualified_name()),
      defined_by_(std::move(defined_by)),
      npu_(&kEmptyList),
      cpu_(&kEmptyList) {
  const auto& args = schema_.arguments;
  // Trailing arguments with boxable defaults may be omitted by the caller.
  num_required_ = static_cast<int32_t>(args.size());
  while (num_required_ > 0) {
    const Argument& a = args[static_cast<size_t>(num_required_ - 1)];
    if (!a.default_value || !a.default_value->boxable) break;
    --num_required_;
  }
  for (const Argument& a : args) accepted_.push_back(accepted_tags(a.type));
  for (const Argument& r : schema_.returns) {
    int32_t alias = -1;
    if (r.alias && r.alias->is_write) {
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i].alias && args[i].alias->set == r.alias->set && args[i].alias->is_write)
          alias = static_cast<int32_t>(i);
    }
    return_alias_.push_back(alias);
  }
}

Registry::Registry() : map_(new OpMap()) {}

Registry::~Registry() {
  // Kernels first (they may call back into their plugin), then the ops.
  kernels_.clear();
  annotations_.clear();
  delete map_.load();
}

OpEntry* Registry::find_locked(const std::string& name) const {
  const OpMap* current = map_.load(std::memory_order_relaxed);
  auto it = current->find(name);
  return it == current->end() ? nullptr : it->second;
}

std::string Registry::schema_conflict(const OpEntry& existing, const Schema& schema) {
  const std::string a = existing.schema().to_string(), b = schema.to_string();
  if (a == b) return "";
  return "op '" + existing.name() + "' is already defined (by " + existing.defined_by() +
         ") with a different schema: existing \"" + a + "\", new \"" + b + "\"";
}

std::string Registry::kernel_conflict(const std::string& op_name, const KernelList& list,
                                      const Kernel& kernel) {
  for (const Kernel* k : list) {
    const bool overlap =
        k->dtype_mask == 0 || kernel.dtype_mask == 0 || (k->dtype_mask & kernel.dtype_mask) != 0;
    if (k->priority == kernel.priority && overlap)
      return "duplicate kernel for op '" + op_name + "' on " +
             (kernel.device_type == NPUB_DEVICE_CPU ? "cpu" : "npu") + " at priority " +
             std::to_string(kernel.priority) + ": plugin '" + k->plugin_name() +
             "' already registered one for dtypes {" + k->dtypes_string() +
             "}; use another priority or disjoint dtypes";
  }
  return "";
}

std::string Registry::meta_conflict(const OpEntry& op) {
  const OpAnnotations* current = op.annotations_.load(std::memory_order_relaxed);
  if (current == nullptr || current->meta.fn == nullptr) return "";
  return "op '" + op.name() + "' already has a meta function (from plugin '" +
         (current->meta.plugin ? current->meta.plugin->name : "host") + "')";
}

std::string Registry::derivative_conflict(const OpEntry& op) {
  const OpAnnotations* current = op.annotations_.load(std::memory_order_relaxed);
  if (current == nullptr || !current->derivative) return "";
  return "op '" + op.name() + "' already has a derivative (from plugin '" + current->derivative->plugin +
         "')";
}

OpEntry* Registry::add_op_locked(const Schema& schema, const std::string& defined_by) {
  ops_.push_back(std::make_unique<OpEntry>(schema, defined_by));
  OpEntry* op = ops_.back().get();
  const OpMap* current = map_.load(std::memory_order_relaxed);
  auto next = std::make_unique<OpMap>(*current);
  next->emplace(op->name(), op);
  map_.store(next.release(), std::memory_order_release);
  retired_maps_.emplace_back(current);
  return op;
}

void Registry::annotate_locked(OpEntry* op, MetaFunction* meta, Derivative* derivative) {
  const OpAnnotations* current = op->annotations_.load(std::memory_order_relaxed);
  auto next = std::make_unique<OpAnnotations>(current != nullptr ? *current : OpAnnotations{});
  if (meta != nullptr) next->meta = std::move(*meta);
  if (derivative != nullptr) next->derivative = std::make_shared<const Derivative>(std::move(*derivative));
  annotations_.push_back(std::move(next));
  op->annotations_.store(annotations_.back().get(), std::memory_order_release);
}

OpEntry* Registry::define(const Schema& schema, const std::string& defined_by) {
  std::lock_guard<std::mutex> lock(mu_);
  if (OpEntry* existing = find_locked(schema.qualified_name())) {
    if (const std::string c = schema_conflict(*existing, schema); !c.empty())
      throw Error(ErrorCode::kInvalidArgument, c);
    return existing;
  }
  return add_op_locked(schema, defined_by);
}

void Registry::publish_list(OpEntry* op, int32_t device_type, KernelList list) {
  std::stable_sort(list.begin(), list.end(),
                   [](const Kernel* a, const Kernel* b) { return a->priority > b->priority; });
  lists_.push_back(std::make_unique<const KernelList>(std::move(list)));
  op->slot(device_type).store(lists_.back().get(), std::memory_order_release);
}

void Registry::set_meta(OpEntry* op, MetaFunction meta) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const std::string c = meta_conflict(*op); !c.empty()) throw Error(ErrorCode::kInvalidArgument, c);
  annotate_locked(op, &meta, nullptr);
}

void Registry::set_derivative(OpEntry* op, Derivative derivative) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const std::string c = derivative_conflict(*op); !c.empty()) throw Error(ErrorCode::kInvalidArgument, c);
  annotate_locked(op, nullptr, &derivative);
}

void Registry::add_kernel(std::unique_ptr<Kernel> kernel) {
  std::lock_guard<std::mutex> lock(mu_);
  OpEntry* op = kernel->op;
  const KernelList& current = *op->slot(kernel->device_type).load(std::memory_order_relaxed);
  if (const std::string c = kernel_conflict(op->name(), current, *kernel); !c.empty())
    throw Error(ErrorCode::kInvalidArgument, c);
  KernelList next = current;
  next.push_back(kernel.get());
  kernels_.push_back(std::move(kernel));
  publish_list(op, kernels_.back()->device_type, std::move(next));
}

// Note [A plugin's registrations commit as one]
// A plugin's ops, kernels, meta functions and derivatives are staged while
// its initialize runs and reach the registry here, all or nothing: first
// every check against what the registry holds and against the rest of the
// batch, then the updates, with the writers' lock held throughout, so no
// other writer can slip a conflict in between. A failed commit leaves no
// op, kernel, meta function or derivative of the batch behind. (Readers
// take no lock and may see the batch's ops a moment before their kernels:
// such a call falls back, as for any op no kernel serves.)
void Registry::commit(Registrations batch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto fail = [](const std::string& why) { throw Error(ErrorCode::kInvalidArgument, why); };
  // 1. Check. Ops the batch defines are looked up in the batch as well.
  std::unordered_map<std::string, const Schema*> new_ops;
  for (const Schema& s : batch.schemas) {
    const std::string name = s.qualified_name();
    if (const OpEntry* existing = find_locked(name)) {
      if (const std::string c = schema_conflict(*existing, s); !c.empty()) fail(c);
    } else if (auto it = new_ops.find(name); it != new_ops.end()) {
      if (it->second->to_string() != s.to_string())
        fail("op '" + name + "' is defined twice with different schemas: \"" + it->second->to_string() +
             "\", \"" + s.to_string() + "\"");
    } else {
      new_ops.emplace(name, &s);
    }
  }
  auto known = [&](const std::string& name) {
    if (find_locked(name) == nullptr && new_ops.count(name) == 0) fail("op '" + name + "' is not defined");
  };
  for (const auto& [name, k] : batch.kernels) known(name);
  for (const auto& [name, m] : batch.metas) known(name);
  for (const auto& [name, d] : batch.derivatives) known(name);
  // Kernels against the op's current list and the batch's earlier kernels.
  std::unordered_map<std::string, KernelList> staged_lists;  // key: op name + device type
  for (auto& [name, k] : batch.kernels) {
    OpEntry* existing = find_locked(name);
    const std::string key = name + "#" + std::to_string(k->device_type);
    KernelList& list = staged_lists[key];
    if (list.empty() && existing != nullptr)
      list = *existing->slot(k->device_type).load(std::memory_order_relaxed);
    if (const std::string c = kernel_conflict(name, list, *k); !c.empty()) fail(c);
    list.push_back(k.get());
  }
  std::unordered_map<std::string, int> metas_per_op, derivatives_per_op;
  for (const auto& [name, m] : batch.metas) {
    if (const OpEntry* op = find_locked(name)) {
      if (const std::string c = meta_conflict(*op); !c.empty()) fail(c);
    }
    if (++metas_per_op[name] > 1) fail("op '" + name + "' is given two meta functions");
  }
  for (const auto& [name, d] : batch.derivatives) {
    if (const OpEntry* op = find_locked(name)) {
      if (const std::string c = derivative_conflict(*op); !c.empty()) fail(c);
    }
    if (++derivatives_per_op[name] > 1) fail("op '" + name + "' is given two derivatives");
  }
  if (const std::string c = fusion_patterns_.conflict(batch.fusion_patterns); !c.empty()) fail(c);
  // A replacement's own ops must exist (checked while staging too); aten
  // ops the registry lacks are PyTorch's (check_fusion_pattern).
  std::function<void(const PatternArg&)> replacement_ops = [&](const PatternArg& a) {
    if (a.kind == PatternArg::kCall && a.op.rfind("aten::", 0) != 0) known(a.op);
    for (const auto& x : a.items) replacement_ops(x);
  };
  for (const auto& p : batch.fusion_patterns) replacement_ops(p.replacement);

  // 2. Apply; nothing below throws a conflict.
  for (const Schema& s : batch.schemas)
    if (find_locked(s.qualified_name()) == nullptr) add_op_locked(s, batch.defined_by);
  std::unordered_map<std::string, KernelList> lists;  // same keys as above
  std::vector<std::pair<OpEntry*, int32_t>> touched;
  for (auto& [name, k] : batch.kernels) {
    OpEntry* op = find_locked(name);
    k->op = op;
    const std::string key = name + "#" + std::to_string(k->device_type);
    auto [it, fresh] = lists.try_emplace(key);
    if (fresh) {
      it->second = *op->slot(k->device_type).load(std::memory_order_relaxed);
      touched.emplace_back(op, k->device_type);
    }
    it->second.push_back(k.get());
    kernels_.push_back(std::move(k));
  }
  for (auto& [op, dev] : touched)
    publish_list(op, dev, std::move(lists[op->name() + "#" + std::to_string(dev)]));
  for (auto& [name, m] : batch.metas) annotate_locked(find_locked(name), &m, nullptr);
  for (auto& [name, d] : batch.derivatives) annotate_locked(find_locked(name), nullptr, &d);
  fusion_patterns_.add(std::move(batch.fusion_patterns));  // checked above
}

void Registry::add_fusion_patterns(std::vector<FusionPattern> patterns) {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    fusion_patterns_.add(std::move(patterns));
  } catch (const FusionPatternError& e) {
    throw Error(ErrorCode::kInvalidArgument, e.what());
  }
}

void Registry::remove_plugin_kernels(const PluginRecord* plugin) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& op : ops_) {
    for (int32_t dev : {NPUB_DEVICE_NPU, NPUB_DEVICE_CPU}) {
      const KernelList& current = *op->slot(dev).load(std::memory_order_relaxed);
      KernelList next;
      for (Kernel* k : current)
        if (k->plugin.get() != plugin) next.push_back(k);
      if (next.size() != current.size()) publish_list(op.get(), dev, std::move(next));
    }
  }
  // The kernel objects stay alive (a concurrent reader may hold one) and are
  // freed with the registry; their plugin record stays referenced until then.
}

OpEntry* Registry::find(std::string_view name) const {
  const OpMap* m = map_.load(std::memory_order_acquire);
  auto it = m->find(name);
  return it == m->end() ? nullptr : it->second;
}

std::vector<OpEntry*> Registry::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpEntry*> out;
  for (auto& op : ops_) out.push_back(op.get());
  std::sort(out.begin(), out.end(), [](const OpEntry* a, const OpEntry* b) { return a->name() < b->name(); });
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> Registry::coverage_by_plugin() const {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const OpEntry* op : ops()) {
    for (int32_t dev : {NPUB_DEVICE_NPU, NPUB_DEVICE_CPU}) {
      for (const Kernel* k : op->kernels(dev)) {
        const std::string plugin = k->plugin_name();
        auto it = std::find_if(out.begin(), out.end(), [&](auto& e) { return e.first == plugin; });
        if (it == out.end()) it = out.insert(out.end(), {plugin, {}});
        if (it->second.empty() || it->second.back() != op->name()) it->second.push_back(op->name());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ----------------------------------------------------------------------------
// OpMappingTable
// ----------------------------------------------------------------------------

OpMappingTable::OpMappingTable() : map_(new Map()) {}
OpMappingTable::~OpMappingTable() { delete map_.load(); }

void OpMappingTable::set(const OpMapping& m) {
  std::lock_guard<std::mutex> lock(mu_);
  const Map* current = map_.load(std::memory_order_relaxed);
  auto next = std::make_unique<Map>(*current);
  (*next)[m.framework_op] = m;
  map_.store(next.release(), std::memory_order_release);
  snapshots_.emplace_back(current);
  version_.fetch_add(1, std::memory_order_acq_rel);
}

bool OpMappingTable::remove(std::string_view framework_op) {
  std::lock_guard<std::mutex> lock(mu_);
  const Map* current = map_.load(std::memory_order_relaxed);
  if (current->find(std::string(framework_op)) == current->end()) return false;
  auto next = std::make_unique<Map>(*current);
  next->erase(std::string(framework_op));
  map_.store(next.release(), std::memory_order_release);
  snapshots_.emplace_back(current);
  version_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

const OpMapping* OpMappingTable::find(std::string_view framework_op) const {
  const Map* m = map_.load(std::memory_order_acquire);
  if (m->empty()) return nullptr;
  auto it = m->find(std::string(framework_op));
  return it == m->end() ? nullptr : &it->second;
}

std::vector<OpMapping> OpMappingTable::entries() const {
  const Map* m = map_.load(std::memory_order_acquire);
  std::vector<OpMapping> out;
  for (auto& [k, v] : *m) out.push_back(v);
  std::sort(out.begin(), out.end(),
            [](const OpMapping& a, const OpMapping& b) { return a.framework_op < b.framework_op; });
  return out;
}

void OpMappingTable::load_text(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  std::vector<OpMapping> parsed;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.empty()) continue;
    if (f.size() < 2 || f.size() > 3)
      throw Error(ErrorCode::kInvalidArgument, origin + ":" + std::to_string(lineno) +
                                                   ": expected 'framework_op target_op [plugin]' but found " +
                                                   std::to_string(f.size()) + " field(s)");
    for (const std::string* op : {&f[0], &f[1]})
      if (op->find("::") == std::string::npos)
        throw Error(ErrorCode::kInvalidArgument, origin + ":" + std::to_string(lineno) +
                                                     ": expected a qualified op name "
                                                     "(ns::name[.overload]) but found '" +
                                                     *op + "'");
    parsed.push_back({f[0], f[1], f.size() == 3 ? f[2] : ""});
  }
  for (const auto& m : parsed) set(m);
}

void OpMappingTable::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, "op mapping table '" + path + "' cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  load_text(ss.str(), path);
}

}  // namespace npub::reg
