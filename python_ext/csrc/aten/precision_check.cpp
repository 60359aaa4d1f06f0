// The precision check: every plugin call against ATen's CPU kernel (see
// precision_check.h).
#include "aten/precision_check.h"

#include <ATen/core/Tensor.h>

#include <npubridge/torch/error_bound.h>

#include "aten/boxing.h"
#include "runtime/npu_runtime.h"

#include <exception>
#include <string>

namespace npub::torch_backend {

std::atomic<bool> g_precision_on{false};

namespace {

// Judges a tensor a plugin produced under the op's error model
// (npubridge/torch/error_bound.h: the same verdict as npub-conformance's) and reports
// a mismatch through the dispatcher. `host`: ATen's CPU result in the op's
// dtype; `wide`, `magnitude`: its float64 and |inputs| results (may be
// undefined).
void compare_with_cpu(const std::string& op, const reg::OpEntry* target, const std::string& plugin,
                      const std::string& label, const at::Tensor& got_npu, const at::Tensor& host,
                      const at::Tensor& wide, const at::Tensor& magnitude, const numerics::ErrorModel& model,
                      int64_t terms, const std::vector<c10::IValue>& inputs) {
  if (!got_npu.defined() || !host.defined()) return;
  PrecisionMismatch m;
  m.op = op;
  m.plugin = plugin;
  m.output = label;
  const at::Tensor got = got_npu.cpu();
  m.numel = host.numel();
  if (!got.sizes().equals(host.sizes()) || got.scalar_type() != host.scalar_type()) {
    m.num_mismatched = 1;
    rt().dispatcher().record_precision_mismatch(m, target);
    return;
  }
  if (host.numel() == 0 || npub_dtype(host.scalar_type()) == DType::kUnknown) return;
  const bool wide_ok = wide.defined() && wide.sizes().equals(host.sizes());
  const bool mag_ok = magnitude.defined() && magnitude.sizes().equals(host.sizes());
  const double scale =
      model.magnitude == numerics::Magnitude::kScale && wide_ok ? numerics::call_scale(inputs, wide) : 0;
  const numerics::Verdict v = numerics::judge(model, got, host, wide_ok ? wide : at::Tensor(),
                                              mag_ok ? magnitude : at::Tensor(), terms, scale);
  if (v.ok()) return;
  m.take(v);
  rt().dispatcher().record_precision_mismatch(m, target);
}

}  // namespace

std::vector<c10::IValue> cpu_copies(c10::ArrayRef<c10::IValue> args) {
  std::vector<c10::IValue> cpu;
  cpu.reserve(args.size());
  for (const auto& a : args)
    cpu.push_back(map_tensors(a, [](const at::Tensor& t) {
      if (!t.defined()) return t;
      return t.device().is_cpu() ? t.clone() : t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }));
  return cpu;
}

void check_against_cpu(const c10::OperatorHandle& op, const OpHandle& target,
                       std::vector<c10::IValue> cpu_args, c10::ArrayRef<c10::IValue> args,
                       const std::vector<c10::IValue>& results) {
  const auto& sargs = op.schema().arguments();
  const auto& sret = op.schema().returns();
  const std::string name = full_name(op.schema().operator_name());
  // The model is the plugin op's (a functional op routed through its .out
  // kernel is judged as that kernel).
  const std::string& model_name = target.op != nullptr ? target.op->name() : name;
  const numerics::ErrorModel& model = numerics::error_model(model_name);
  struct Run {
    std::vector<c10::IValue> args;
    torch::jit::Stack stack;
    bool ok = true;
  };
  auto run = [&](numerics::Precision p, at::ScalarType compute) {
    Run r;
    for (size_t i = 0; i < cpu_args.size(); ++i) {
      const bool scalar_type = i < sargs.size() && sargs[i].type()->kind() == c10::TypeKind::ScalarTypeType;
      const bool scalar = i < sargs.size() && sargs[i].type()->kind() == c10::TypeKind::NumberType;
      r.args.push_back(numerics::reference_input(cpu_args[i], scalar_type, scalar, p, compute));
    }
    r.stack.assign(r.args.begin(), r.args.end());
    try {
      at::AutoDispatchBelowADInplaceOrView below;
      op.callBoxed(&r.stack);
    } catch (const std::exception&) {
      if (p == numerics::Precision::kSame) throw;
      r.ok = false;  // no float64 kernel: judged against the op's dtype alone
    }
    return r;
  };
  const Run same = run(numerics::Precision::kSame, at::ScalarType::Undefined);
  at::ScalarType compute = at::ScalarType::Undefined;
  for (const auto& v : same.stack)
    if (v.isTensor() && v.toTensor().defined() && at::isFloatingType(v.toTensor().scalar_type())) {
      compute = v.toTensor().scalar_type();
      break;
    }
  Run wide, magnitude;
  wide.ok = magnitude.ok = false;
  if (compute != at::ScalarType::Undefined && numerics::needs_float64(model)) {
    wide = run(numerics::Precision::kFloat64, compute);
    if (wide.ok && numerics::needs_magnitude(model))
      magnitude = run(numerics::Precision::kMagnitude, compute);
  }
  const DType dt = [&] {
    for (const auto& a : args)
      if (a.isTensor() && a.toTensor().defined()) return npub_dtype(a.toTensor().scalar_type());
    return DType::kUnknown;
  }();
  const reg::Kernel* k = rt().dispatcher().kernel_for(target, dt);
  const std::string plugin = k != nullptr ? k->plugin_name() : std::string("?");
  const int64_t terms = target.op != nullptr ? numerics::call_terms(model, target.op->schema(), cpu_args) : 0;
  std::vector<c10::IValue> inputs;  // read-only arguments, for Magnitude::kScale
  for (size_t i = 0; i < sargs.size() && i < cpu_args.size(); ++i)
    if (sargs[i].alias_info() == nullptr || !sargs[i].alias_info()->isWrite()) inputs.push_back(cpu_args[i]);
  auto tensor_at = [](const Run& r, bool from_args, size_t i) {
    if (!r.ok) return at::Tensor();
    const c10::IValue& v = from_args ? r.args[i] : r.stack[i];
    return v.isTensor() ? v.toTensor() : at::Tensor();
  };
  for (size_t i = 0; i < sargs.size() && i < args.size(); ++i)
    if (sargs[i].alias_info() != nullptr && sargs[i].alias_info()->isWrite() && args[i].isTensor())
      compare_with_cpu(name, target.op, plugin, "argument '" + sargs[i].name() + "'", args[i].toTensor(),
                       same.args[i].toTensor(), tensor_at(wide, true, i), tensor_at(magnitude, true, i),
                       model, terms, inputs);
  for (size_t i = 0; i < sret.size() && i < results.size() && i < same.stack.size(); ++i) {
    if (sret[i].alias_info() != nullptr && sret[i].alias_info()->isWrite())
      continue;  // compared as its argument
    if (results[i].isTensor() && same.stack[i].isTensor())
      compare_with_cpu(name, target.op, plugin, "return " + std::to_string(i), results[i].toTensor(),
                       same.stack[i].toTensor(), tensor_at(wide, false, i), tensor_at(magnitude, false, i),
                       model, terms, inputs);
  }
}

}  // namespace npub::torch_backend
