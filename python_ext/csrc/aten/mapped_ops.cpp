// ATen ops routed by the op-mapping table (see mapped_ops.h).
#include "aten/mapped_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <npubridge/support/error.h>

#include "aten/bridge.h"
#include "aten/register_plugin_ops.h"
#include "aten/unboxed_bridge.h"
#include "runtime/npu_runtime.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>

namespace npub::torch_backend {

namespace {

// Held while a mapping, its kernel and its route change together.
std::mutex g_mapped_mu;
// One library per op the table gave a kernel: destroying it deregisters
// that kernel, and PyTorch's dispatcher falls back to the op's previous
// kernel for PrivateUse1, or to the boxed CPU fallback when there was none.
std::map<std::string, std::unique_ptr<torch::Library>> g_mapped_libraries;

std::optional<c10::OperatorHandle> torch_op(const std::string& qualified) {
  const size_t sep = qualified.find("::");
  if (sep == std::string::npos) return std::nullopt;
  const size_t dot = qualified.find('.', sep);
  if (dot == std::string::npos) return c10::Dispatcher::singleton().findSchema({qualified, ""});
  return c10::Dispatcher::singleton().findSchema({qualified.substr(0, dot), qualified.substr(dot + 1)});
}

// A type as a boxed call sees it: SymInt is an int, and a list's fixed size
// (int[2]) is not checked.
std::string boxed_type(std::string t) {
  for (size_t at; (at = t.find("SymInt")) != std::string::npos;) t.replace(at, 6, "int");
  for (size_t open = t.find('['); open != std::string::npos; open = t.find('[', open + 1)) {
    size_t close = open + 1;
    while (close < t.size() && std::isdigit(static_cast<unsigned char>(t[close]))) ++close;
    t.erase(open + 1, close - open - 1);
  }
  return t;
}

std::string type_of(const c10::Argument& a) {
  std::ostringstream printed;
  printed << a;
  std::string t = plain_argument(printed.str());
  if (!a.name().empty() && t.size() > a.name().size()) t.resize(t.size() - a.name().size() - 1);
  return boxed_type(t);
}

std::string type_of(const reg::Argument& a) { return boxed_type(reg::type_to_string(a.type)); }

bool writes(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

// out= tensors at the end of the target's arguments (written, keyword-only).
size_t trailing_outs(const reg::Schema& s) {
  size_t n = 0;
  while (n < s.arguments.size() && s.arguments[s.arguments.size() - 1 - n].is_write() &&
         s.arguments[s.arguments.size() - 1 - n].kwarg_only)
    ++n;
  return n;
}

// Why the first `count` arguments of `target` do not take `f`'s, or "".
std::string argument_mismatch(const std::string& fname, const c10::FunctionSchema& f,
                              const std::string& tname, const reg::Schema& target, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const c10::Argument& fa = f.arguments()[i];
    const reg::Argument& ta = target.arguments[i];
    // A value of type T is also one of T? (hardtanh's Scalar for clamp's Scalar?).
    if (type_of(fa) != type_of(ta) && type_of(fa) + "?" != type_of(ta))
      return "argument " + std::to_string(i) + " is '" + type_of(fa) + " " + fa.name() + "' in " + fname +
             " but '" + type_of(ta) + " " + ta.name + "' in " + tname;
    if (writes(fa) != ta.is_write())
      return "argument " + std::to_string(i) + " ('" + fa.name() + "') is written by " +
             (writes(fa) ? fname : tname) + " but not by " + (writes(fa) ? tname : fname);
  }
  return "";
}

// Why `target` cannot serve `f`'s calls as they are (same arguments, then
// only defaulted ones; the same returns), or "".
std::string direct_mismatch(const std::string& fname, const c10::FunctionSchema& f,
                            const reg::OpEntry& target) {
  const std::string& tname = target.name();
  const reg::Schema& t = target.schema();
  const size_t nf = f.arguments().size();
  if (t.arguments.size() < nf)
    return fname + " passes " + std::to_string(nf) + " argument(s) and " + tname + " takes " +
           std::to_string(t.arguments.size());
  if (std::string why = argument_mismatch(fname, f, tname, t, nf); !why.empty()) return why;
  for (size_t i = nf; i < t.arguments.size(); ++i)
    if (!t.arguments[i].default_value)
      return "argument " + std::to_string(i) + " ('" + type_of(t.arguments[i]) + " " + t.arguments[i].name +
             "') of " + tname + " has no default and " + fname + " does not pass it";
  if (f.returns().size() != t.returns.size())
    return fname + " returns " + std::to_string(f.returns().size()) + " value(s) and " + tname + " returns " +
           std::to_string(t.returns.size());
  for (size_t i = 0; i < t.returns.size(); ++i) {
    if (type_of(f.returns()[i]) != type_of(t.returns[i]))
      return "return " + std::to_string(i) + " is '" + type_of(f.returns()[i]) + "' in " + fname + " but '" +
             type_of(t.returns[i]) + "' in " + tname;
    if (writes(f.returns()[i]) != (target.return_alias()[i] >= 0))
      return "return " + std::to_string(i) + " is " +
             (writes(f.returns()[i]) ? "an argument" : "a new value") + " in " + fname + " but " +
             (writes(f.returns()[i]) ? "a new value" : "an argument") + " in " + tname;
  }
  return "";
}

// Why functional `f` cannot be served through `target`'s out= tensors
// (f's arguments, then one out= tensor per return), or "".
std::string via_out_mismatch(const std::string& fname, const c10::FunctionSchema& f,
                             const reg::OpEntry& target) {
  const std::string& tname = target.name();
  const reg::Schema& t = target.schema();
  const size_t nout = trailing_outs(t);
  const size_t nf = f.arguments().size();
  if (t.arguments.size() - nout != nf)
    return fname + " passes " + std::to_string(nf) + " argument(s) and " + tname + " takes " +
           std::to_string(t.arguments.size() - nout) + " before its out= tensor(s)";
  if (std::string why = argument_mismatch(fname, f, tname, t, nf); !why.empty()) return why;
  if (f.returns().size() != nout)
    return fname + " returns " + std::to_string(f.returns().size()) + " value(s) and " + tname + " writes " +
           std::to_string(nout) + " out= tensor(s)";
  for (size_t i = 0; i < nout; ++i)
    if (type_of(f.returns()[i]) != "Tensor")
      return "return " + std::to_string(i) + " of " + fname + " is '" + type_of(f.returns()[i]) +
             "', not a tensor an out= argument of " + tname + " can hold";
  return "";
}

// How `f`'s calls reach `target`: as they are, or (a functional op served by
// an .out op) through the target's out= tensors, allocated from f's meta
// kernel. Throws when neither fits.
Route route_for(const reg::OpMapping& m, const c10::FunctionSchema& f, const reg::OpEntry& target) {
  const bool functional = !f.is_mutable();
  const bool via_out = functional && trailing_outs(target.schema()) > 0;
  const std::string why =
      via_out ? via_out_mismatch(m.framework_op, f, target) : direct_mismatch(m.framework_op, f, target);
  if (!why.empty())
    throw Error(ErrorCode::kInvalidArgument, "cannot map '" + m.framework_op + "' to '" + m.target_op +
                                                 "': the schemas differ: " + why + " (" + c10::toString(f) +
                                                 " vs " + target.schema().to_string() + ")");
  return via_out ? Route::kViaOut : Route::kDirect;
}

}  // namespace

void map_op(const reg::OpMapping& m) {
  const std::string prefix = "cannot map '" + m.framework_op + "' to '" + m.target_op + "': ";
  const reg::OpEntry* target = rt().registry().find(m.target_op);
  if (target == nullptr)
    throw Error(ErrorCode::kNotFound, prefix + "unknown op '" + m.target_op + "': no plugin defines it");
  if (!m.plugin.empty()) {
    const auto& kernels = target->kernels(NPUB_DEVICE_NPU);
    if (std::none_of(kernels.begin(), kernels.end(),
                     [&](const reg::Kernel* k) { return k->plugin_name() == m.plugin; }))
      throw Error(ErrorCode::kNotFound,
                  prefix + "plugin '" + m.plugin + "' has no kernel for '" + m.target_op + "'");
  }
  const auto op = torch_op(m.framework_op);
  if (!op)
    throw Error(ErrorCode::kNotFound,
                prefix + "unknown op '" + m.framework_op + "': PyTorch has no op of that name");
  const Route route = route_for(m, op->schema(), *target);
  bool has_out = false;
  for (const auto& a : op->schema().arguments())
    has_out = has_out || (a.is_out() && a.type()->kind() == c10::TypeKind::TensorType);

  std::lock_guard<std::mutex> lock(g_mapped_mu);
  g_mapped_libraries.erase(m.framework_op);
  rt().op_map().set(m);
  set_mapped_route(m.framework_op, route, m.target_op);
  if (route == Route::kDirect && bridged_by_name(m.framework_op)) return;
  const std::string& qualified = m.framework_op;
  const std::string ns = qualified.substr(0, qualified.find("::"));
  const std::string unqualified = qualified.substr(ns.size() + 2);
  try {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                                __FILE__, __LINE__);
    lib->impl(unqualified.c_str(), bridge_kernel(route, m.framework_op, *op, has_out));
    g_mapped_libraries[m.framework_op] = std::move(lib);
  } catch (const std::exception& e) {
    // No kernel, no mapping: the table never names an op its calls cannot reach.
    rt().op_map().remove(m.framework_op);
    remove_mapped_route(m.framework_op);
    const std::string why = e.what();
    throw Error(ErrorCode::kInvalidArgument,
                prefix + "PyTorch refuses a kernel for it: " + why.substr(0, why.find('\n')));
  }
}

bool unmap_op(const std::string& framework_op) {
  std::lock_guard<std::mutex> lock(g_mapped_mu);
  // The kernel goes first: a call meanwhile takes the previous route, never
  // a Bridge whose mapping is gone.
  g_mapped_libraries.erase(framework_op);
  remove_mapped_route(framework_op);
  return rt().op_map().remove(framework_op);
}

void route_mapped_ops() {
  for (const reg::OpMapping& m : rt().op_map().entries()) {
    if (!torch_op(m.framework_op) && m.framework_op.rfind("aten::", 0) != 0) continue;
    try {
      map_op(m);
    } catch (const Error& e) {
      TORCH_WARN("npubridge: op-mapping table: ", e.what(), "; the mapping is dropped");
      rt().op_map().remove(m.framework_op);
    }
  }
}

}  // namespace npub::torch_backend
