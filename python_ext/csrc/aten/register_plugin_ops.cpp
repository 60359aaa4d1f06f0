// The plugin ops' kernels and schemas, registered with PyTorch at init (see
// register_plugin_ops.h).
#include "aten/register_plugin_ops.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten/boxing.h"
#include "aten/bridge.h"
#include "aten/meta_bridge.h"
#include "aten/routes.h"
#include "aten/unboxed_bridge.h"
#include "runtime/npu_runtime.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

namespace npub::torch_backend {

// "Type name" of an argument without alias annotation and default.
std::string plain_argument(std::string s) {
  for (size_t open; (open = s.find('(')) != std::string::npos;) {
    const size_t close = s.find(')', open);
    if (close == std::string::npos) break;
    s.erase(open, close - open + 1);
  }
  if (auto eq = s.find('='); eq != std::string::npos) s.resize(eq);
  return s;
}

namespace {

// Registrations made at init, kept alive for the process.
std::vector<std::unique_ptr<torch::Library>> g_libraries;

// The ADInplaceOrView kernel of a plugin op that writes arguments
// (Tensor(a!), Tensor(a!)[]): it bumps their version counters, as ATen's
// in-place ops do, so that autograd notices a saved tensor the op changed.
// (PyTorch's autogradNotImplementedInplaceOrViewFallback bumps written
// returns only, and such an op, `-> ()`, may return none.)
void bump_written_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t start = stack->size() - args.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() == nullptr || !args[i].alias_info()->isWrite()) continue;
    const c10::IValue& v = (*stack)[start + i];
    if (v.isTensor()) {
      written.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) written.push_back(t);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written)
    if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
}

// Whether functional/in-place `f` takes exactly the arguments of `out`
// minus its trailing out= tensors (same names and types, in order).
bool same_args(const c10::FunctionSchema& f, const reg::Schema& out) {
  size_t n = out.arguments.size();
  while (n > 0 && out.arguments[n - 1].is_write() && out.arguments[n - 1].kwarg_only) --n;
  if (n != f.arguments().size()) return false;
  for (size_t i = 0; i < n; ++i) {
    std::ostringstream theirs;
    theirs << f.arguments()[i];
    const reg::Argument& a = out.arguments[i];
    if (plain_argument(theirs.str()) != plain_argument(reg::type_to_string(a.type) + " " + a.name))
      return false;
  }
  return true;
}

// Edit distance, for the nearest ATen name to a misspelt one.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// A plugin's kernel for an aten:: op ATen does not have (a misspelt name or
// overload) can never be called: said when PyTorch loads the plugin, with
// the nearest name ATen has.
void warn_unknown_aten_op(const reg::OpEntry& e) {
  std::string nearest;
  size_t best = SIZE_MAX;
  for (const c10::OperatorName& n : c10::Dispatcher::singleton().getAllOpNames()) {
    if (n.name.rfind("aten::", 0) != 0) continue;
    const std::string full = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
    const size_t d = edit_distance(e.name(), full);
    if (d < best) {
      best = d;
      nearest = full;
    }
  }
  const auto& kernels = e.kernels(NPUB_DEVICE_NPU);
  const std::string plugin =
      kernels.empty() ? e.defined_by() : "plugin '" + kernels.front()->plugin_name() + "'";
  TORCH_WARN("npubridge: ", plugin, " registers a kernel for '", e.name(),
             "', which ATen does not have, so no PyTorch call can reach it",
             nearest.empty() ? std::string() : "; did you mean '" + nearest + "'?",
             " (ATen's exact schemas: torch._C._jit_get_schemas_for_operator(\"aten::<name>\"))");
}

}  // namespace

std::optional<c10::OperatorHandle> torch_op_of(const reg::OpEntry& e, std::string* differs) {
  auto h =
      c10::Dispatcher::singleton().findSchema({e.schema().ns + "::" + e.schema().name, e.schema().overload});
  if (!h) return std::nullopt;
  std::string theirs = c10::toString(h->schema());
  if (theirs == e.schema().to_string()) return h;
  if (differs != nullptr) *differs = std::move(theirs);
  return std::nullopt;
}

void register_plugin_ops() {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                              __FILE__, __LINE__);
  std::set<std::string> registered;
  const auto ops = rt().registry().ops();
  for (const reg::OpEntry* e : ops) {
    if (e->schema().ns != "aten" || e->kernels(NPUB_DEVICE_NPU).empty()) continue;
    const std::string unqualified =
        e->schema().overload.empty() ? e->schema().name : e->schema().name + "." + e->schema().overload;
    std::string theirs;
    auto h = torch_op_of(*e, &theirs);
    if (!h && theirs.empty()) {
      warn_unknown_aten_op(*e);
      continue;
    }
    // The plugin's schema must be ATen's (names and types); otherwise the
    // boxed arguments would not line up.
    if (!h) {
      TORCH_WARN("npubridge: not routing '", e->name(),
                 "': its schema differs from ATen's (plugin: ", e->schema().to_string(), ", ATen: ", theirs,
                 ")");
      continue;
    }
    bool has_out = false;
    for (const auto& a : h->schema().arguments())
      has_out = has_out || (a.is_out() && a.type()->kind() == c10::TypeKind::TensorType);
    lib->impl(unqualified.c_str(), bridge_kernel(Route::kDirect, e->name(), *h, has_out));
    registered.insert(e->name());
    add_route({e->name(), Route::kDirect, e->name(), RouteOrigin::kAten});
  }
  // Functional and in-place overloads of ops whose .out variant a plugin serves.
  for (const reg::OpEntry* e : ops) {
    if (e->schema().ns != "aten" || !registered.count(e->name())) continue;
    bool is_out = false;
    for (const auto& a : e->schema().arguments) is_out = is_out || (a.is_write() && a.kwarg_only);
    if (!is_out) continue;
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name != "aten::" + e->schema().name && name.name != "aten::" + e->schema().name + "_")
        continue;
      const std::string full = full_name(name);
      if (registered.count(full)) continue;
      auto h = c10::Dispatcher::singleton().findSchema(name);
      if (!h) continue;
      const auto& f = h->schema();
      const bool inplace = name.name.back() == '_';
      if (f.is_mutable() != inplace) continue;
      if (!same_args(f, e->schema())) continue;
      if (!inplace &&
          (f.returns().size() == 0 ||
           f.returns().size() != static_cast<size_t>(std::count_if(
                                     e->schema().arguments.begin(), e->schema().arguments.end(),
                                     [](const reg::Argument& a) { return a.is_write() && a.kwarg_only; }))))
        continue;
      if (inplace && std::count_if(e->schema().arguments.begin(), e->schema().arguments.end(),
                                   [](const reg::Argument& a) { return a.is_write() && a.kwarg_only; }) != 1)
        continue;
      const std::string unq = full.substr(std::string("aten::").size());
      lib->impl(unq.c_str(), bridge_kernel(inplace ? Route::kInplaceViaOut : Route::kViaOut, e->name(), *h));
      registered.insert(full);
      add_route({full, inplace ? Route::kInplaceViaOut : Route::kViaOut, e->name(), RouteOrigin::kAten});
    }
  }
  g_libraries.push_back(std::move(lib));

  // Plugin ops outside aten: defined under torch.ops.<namespace> from the
  // schema the plugin registered, served by the same boxed bridge.
  std::map<std::string, std::vector<const reg::OpEntry*>> by_ns;
  for (const reg::OpEntry* e : ops)
    if (e->schema().ns != "aten" && !e->kernels(NPUB_DEVICE_NPU).empty()) by_ns[e->schema().ns].push_back(e);
  for (const auto& [ns, entries] : by_ns) {
    auto def =
        std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt, __FILE__, __LINE__);
    auto impl = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                                 __FILE__, __LINE__);
    auto meta = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::Meta, __FILE__,
                                                 __LINE__);
    auto inplace = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                                    c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    for (const reg::OpEntry* e : entries) {
      if (c10::Dispatcher::singleton().findSchema({ns + "::" + e->schema().name, e->schema().overload}))
        continue;
      // Each op in its own error boundary: a schema npubridge accepts but
      // PyTorch refuses (defaults and argument order are refused at load,
      // Note [Defaults PyTorch takes] in registry/src/schema.cpp; a type
      // PyTorch does not know outside ATen, such as Dimname, still gets
      // here) disables that op under PyTorch, with a warning, and never the
      // import of torch.
      try {
        def->def(e->schema().to_string().c_str());
      } catch (const std::exception& err) {
        const reg::Kernel* k = e->kernels(NPUB_DEVICE_NPU).front();
        // PyTorch's reason is its first non-empty line (some messages,
        // "unknown type specifier" among them, start with a blank one).
        std::string why = err.what();
        why.erase(0, why.find_first_not_of(" \n"));
        TORCH_WARN("npubridge: op '", e->name(), "' of plugin '", k->plugin_name(),
                   "' is not available under PyTorch: PyTorch refuses its schema \"", e->schema().to_string(),
                   "\": ", why.substr(0, why.find('\n')));
        continue;
      }
      const std::string unq =
          e->schema().overload.empty() ? e->schema().name : e->schema().name + "." + e->schema().overload;
      impl->impl(unq.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                  std::make_unique<Bridge>(Route::kDirect, e->name())));
      // Shapes without running: from the plugin's meta function, or, for ops
      // that only write their arguments, from the arguments themselves.
      bool writes_only = true;
      for (size_t i = 0; i < e->schema().returns.size(); ++i)
        writes_only = writes_only && e->return_alias()[i] >= 0;
      if (e->meta() != nullptr || writes_only)
        meta->impl(unq.c_str(),
                   torch::CppFunction::makeFromBoxedFunctor(std::make_unique<MetaBridge>(e->name())));
      if (std::any_of(e->schema().arguments.begin(), e->schema().arguments.end(),
                      [](const reg::Argument& a) { return a.is_write(); }))
        inplace->impl(unq.c_str(), torch::CppFunction::makeFromBoxedFunction<&bump_written_versions>());
      add_route({e->name(), Route::kDirect, e->name(), RouteOrigin::kCustom});
    }
    g_libraries.push_back(std::move(def));
    g_libraries.push_back(std::move(impl));
    g_libraries.push_back(std::move(meta));
    g_libraries.push_back(std::move(inplace));
  }
}

}  // namespace npub::torch_backend
