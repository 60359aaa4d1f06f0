// The CPU fallbacks of npu calls (see fallback.h), and PyTorch's boxed
// fallback for PrivateUse1, registered when the module loads.
#include "aten/fallback.h"

#include <npubridge/device_sim/graph_capture.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/native/CPUFallback.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "aten/aliased_fallback.h"
#include "aten/boxing.h"
#include "aten/register_plugin_ops.h"
#include "aten/rnn_cells.h"
#include "aten/sync_batch_norm.h"
#include "runtime/generator.h"
#include "runtime/npu_runtime.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/trace.h>
#include <npubridge/support/error.h>
#include <npubridge/torch/dtype.h>
#include <npubridge/philox.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace npub::torch_backend {

namespace {

// One switch for refusing fallbacks: the dispatcher's (NPUB_FALLBACK).
bool fallback_forbidden() { return rt().dispatcher().fallback_mode() == FallbackMode::kError; }

// Counts a fallback of `op`, warns on the first, and refuses under
// NPUB_FALLBACK=error.
void note_fallback(const c10::OperatorHandle& op) {
  const std::string name = full_name(op.schema().operator_name());
  const bool first = rt().dispatcher().record_host_fallback(name);
  TORCH_CHECK(
      !fallback_forbidden(), "npubridge: operator '", name,
      "' is not supported on the NPU backend and NPUB_FALLBACK=error forbids falling back to the CPU");
  if (first)
    TORCH_WARN("npubridge: operator '", name,
               "' is not supported on the NPU backend and will fall back to run on the CPU");
}

bool is_generator_argument(const c10::Argument& a) {
  c10::TypePtr t = a.type();
  if (auto optional = t->cast<c10::OptionalType>()) t = optional->getElementType();
  return t->kind() == c10::TypeKind::GeneratorType;
}

// Note [Random fallbacks draw from the npu generator]
// An op that falls back runs ATen's CPU kernel, which needs a CPU
// generator. So that npu randomness has one source whichever path serves
// it, the call's npu generator (the explicit one, else the device's
// default) gives up one Philox counter, and the CPU kernel runs on a fresh
// CPU generator seeded from that counter's numbers: the same npu seed gives
// the same results, successive calls differ, and torch.npu.manual_seed
// alone makes a run repeatable. A CPU generator passed to an npu op is
// refused, as CUDA refuses one.
void swap_in_cpu_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            c10::DeviceIndex device) {
  const auto& sargs = op.schema().arguments();
  const size_t first = stack->size() - sargs.size();
  for (size_t i = 0; i < sargs.size(); ++i) {
    if (!is_generator_argument(sargs[i])) continue;
    c10::IValue& v = (*stack)[first + i];
    const std::string name = full_name(op.schema().operator_name());
    const sim::Generator::State st = call_generator(v, device, name.c_str())->philox().reserve(1);
    const auto words = philox::block(st.seed, st.offset);
    const uint64_t seed = (static_cast<uint64_t>(words[0]) << 32) | words[1];
    v = at::detail::createCPUGenerator(seed);
  }
}

// Note [Ops the CPU lacks]
// ATen sends some calls on accelerator tensors to ops the CPU does not
// implement; what no plugin serves (or a plugin declines) still runs on the
// CPU, as ATen's CPU computes the same thing:
// - Note [The overrideable convolutions]: every convolution on a backend
//   without a native one goes to convolution_overrideable (its backward to
//   convolution_backward_overrideable); they run as aten::convolution, the
//   op they stand for. The backward's schema lacks convolution_backward's
//   bias_sizes, which only shapes grad_bias: the output channels,
//   grad_output's dim 1.
// - The fused LSTM/GRU cells (and backwards) that RNN.cpp calls for
//   accelerators run composed of CPU ops, as ATen's CPU cells compute
//   (rnn_cells.h).
// - SyncBatchNorm's ops (batch_norm_stats, batch_norm_gather_stats(_with_
//   counts), batch_norm_elemt, batch_norm_backward_reduce/_elemt) run
//   composed of CPU ops with CUDA's math (sync_batch_norm.h).
//
// Note [native_batch_norm writes what its schema hides]
// aten::native_batch_norm updates running_mean and running_var in place in
// training, but its schema marks neither as written, so ATen's CPU fallback,
// which copies back only the arguments a schema marks, updated CPU copies
// and dropped them: an npu BatchNorm's running statistics never moved, and
// eval() was silently wrong. The same call runs as
// _native_batch_norm_legit, the op ATen made for this with the same
// arguments and returns and the writes marked, whenever both statistics
// are given.
// batch_norm_update_stats and SyncBatchNorm's gather ops hide the same
// writes; they run in sync_batch_norm.cpp, which copies them back.
const c10::OperatorHandle& cpu_op_for(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.schema().operator_name().name;
  if (name == "aten::native_batch_norm" && op.schema().overload_name().empty()) {
    const size_t first = stack->size() - op.schema().arguments().size();
    const c10::IValue& running_mean = (*stack)[first + 3];
    const c10::IValue& running_var = (*stack)[first + 4];
    if (running_mean.isTensor() && running_mean.toTensor().defined() && running_var.isTensor() &&
        running_var.toTensor().defined()) {
      static const c10::OperatorHandle legit =
          c10::Dispatcher::singleton().findSchemaOrThrow("aten::_native_batch_norm_legit", "");
      return legit;
    }
    return op;
  }
  if (name == "aten::convolution_overrideable") {
    static const c10::OperatorHandle conv =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
    return conv;
  }
  if (name == "aten::convolution_backward_overrideable") {
    static const c10::OperatorHandle conv_backward =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
    const size_t first = stack->size() - op.schema().arguments().size();
    const at::Tensor& grad_output = (*stack)[first].toTensor();
    const std::vector<int64_t> bias_sizes{grad_output.size(1)};
    stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3), c10::IValue(bias_sizes));
    return conv_backward;
  }
  return op;
}

// Note [Quantized tensors stay on the CPU]
// npu tensors hold plain dtypes only: no plugin kernel takes a quantized
// tensor and the copy engine knows no quantizer. A quantized op that fell
// back would run on the CPU and then fail inside the copy of its result to
// the npu with an internal error. Such a call is refused before it runs,
// naming the op and the argument that made it quantized (a quantized dtype,
// as quantize_per_tensor's, or a quantized tensor), and so is a CPU kernel
// that returns a quantized tensor for an npu call.
[[noreturn]] void refuse_quantized(const c10::OperatorHandle& op, const std::string& what) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "npubridge: quantized tensors are not supported on npu: op '",
                              full_name(op.schema().operator_name()), "' ", what,
                              "; quantize on the CPU instead (move the tensor with .cpu())");
}

void refuse_quantized_arguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& sargs = op.schema().arguments();
  const size_t first = stack.size() - sargs.size();
  for (size_t i = 0; i < sargs.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    // real_type: type() says int for a ScalarType (the JIT's fake type).
    c10::TypePtr t = sargs[i].real_type();
    if (auto optional = t->cast<c10::OptionalType>()) t = optional->getElementType();
    if (t->kind() == c10::TypeKind::ScalarTypeType && v.isInt() && c10::isQIntType(v.toScalarType()))
      refuse_quantized(
          op, "was called with argument '" + sargs[i].name() + "' = " + c10::toString(v.toScalarType()));
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_quantized())
      refuse_quantized(op, "was called with argument '" + sargs[i].name() + "' a quantized tensor (" +
                               c10::toString(v.toTensor().scalar_type()) + ")");
  }
}

// Whether ATen can run the op on the CPU: a CPU kernel, or a composite one.
bool has_cpu_kernel(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

// ATen's CPU fallback for the call on `stack`.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (sim::capture_checks_needed()) {
    sim::Graph* g = nullptr;
    rethrow_as_torch([&] {  // Note [Work a capture cannot see]
      sim::Device& dev = rt().devices().at(rt().devices().current_device());
      g = sim::capture_target(dev, dev.current_stream(),
                              [&] { return "op '" + full_name(op.schema().operator_name()) + "'"; });
    });
    if (g != nullptr)
      rethrow_as_torch([&] {
        g->forbid("op '" + full_name(op.schema().operator_name()) + "'",
                  "no plugin kernel serves it and it would run on the CPU fallback, which a replay cannot "
                  "run; a capture runs plugin kernels only");
      });
  }
  refuse_quantized_arguments(op, *stack);
  // PyTorch's cpu_fallback returns outputs to the first tensor argument's
  // device; when that is a CPU scalar (1 - x is sub(1, x)), the outputs
  // belong on the npu tensor's device instead, as with any device op.
  std::optional<c10::Device> npu;
  const size_t nargs = op.schema().arguments().size();
  for (size_t i = stack->size() - nargs; i < stack->size() && !npu; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_privateuseone())
      npu = v.toTensor().device();
  }
  swap_in_cpu_generators(op, stack, npu ? npu->index() : current_index());
  if (is_fused_rnn_cell(op.schema().operator_name())) {
    run_fused_rnn_cell_on_cpu(op, stack);
  } else if (is_sync_batch_norm_op(op.schema().operator_name())) {
    run_sync_batch_norm_op_on_cpu(op, stack);
  } else {
    const c10::OperatorHandle& cpu_op = cpu_op_for(op, stack);
    if (npu && needs_aliased_cpu_run(cpu_op, *stack))
      run_aliased_on_cpu(cpu_op, stack, *npu);
    else
      at::native::cpu_fallback(cpu_op, stack);
  }
  if (!npu) return;
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_quantized())
      refuse_quantized(
          op, std::string("returns a quantized tensor (") + c10::toString(v.toTensor().scalar_type()) + ")");
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) v = v.toTensor().to(*npu);
  }
}

// Note [A reference call runs from its values]
// The dispatcher also asks its fallback for calls it makes itself: the
// precision check's references (dispatcher/src/precision_check.cpp), the
// call again on the dispatcher's private copies, in float64 and on
// magnitudes. Such a call carries no torch call (host_call is null), only
// the registry op and its NpubValues. It runs as ATen's op of the same name
// and schema (aten::neg.out) on the CPU, as the old torch-level check ran
// it: every tensor is copied to a CPU tensor through the copy engine (no
// PyTorch op on npu runs, so nothing is counted or traced as the model's),
// the CPU kernel runs below autograd, and the tensors it wrote (written
// arguments, then returns, into the given return tensors or ones of the
// call's OutputAllocator) are copied back. An op ATen does not have (a
// plugin's own namespace), another schema of the same name, or an argument
// it cannot pass is refused with kUnsupported naming it: the dispatcher
// then leaves the call unjudged.
[[noreturn]] void no_reference(const std::string& op, const std::string& why) {
  throw Error(ErrorCode::kUnsupported, "op '" + op + "': " + why);
}

// A DLTensor's values in a new contiguous CPU tensor.
at::Tensor cpu_copy(const DLTensor& dl, const std::string& op) {
  const DType dt = dtype_of(dl.dtype);
  if (dt == DType::kUnknown) no_reference(op, "a tensor of a dtype PyTorch does not have");
  at::Tensor t = at::empty(c10::IntArrayRef(dl.shape, static_cast<size_t>(dl.ndim)),
                           at::TensorOptions().dtype(torch_dtype(dt)));
  sim::copy_tensor(DLView(t).dl, dl);
  return t;
}

// The IValue of argument `a` from its NpubValue (the table of plugin_api.h
// read backwards, by the ATen schema's type); tensors as CPU copies.
c10::IValue ivalue_of(const NpubValue& v, const c10::Argument& a, const std::string& op) {
  c10::TypePtr t = a.real_type();
  if (auto optional = t->cast<c10::OptionalType>()) t = optional->getElementType();
  if (v.tag == NPUB_VALUE_NONE) return c10::IValue();
  auto refuse = [&]() -> c10::IValue {
    no_reference(op, "argument '" + a.name() + "' (" + t->str() + ") cannot be passed from a value of tag " +
                         std::to_string(v.tag));
  };
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      return v.tag == NPUB_VALUE_TENSOR ? c10::IValue(cpu_copy(*v.u.tensor, op)) : refuse();
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::LayoutType:
    case c10::TypeKind::MemoryFormatType:
      return v.tag == NPUB_VALUE_INT ? c10::IValue(v.u.i) : refuse();
    case c10::TypeKind::FloatType:
      return v.tag == NPUB_VALUE_DOUBLE ? c10::IValue(v.u.d)
             : v.tag == NPUB_VALUE_INT  ? c10::IValue(static_cast<double>(v.u.i))
                                        : refuse();
    case c10::TypeKind::BoolType:
      return v.tag == NPUB_VALUE_BOOL || v.tag == NPUB_VALUE_INT ? c10::IValue(v.u.i != 0) : refuse();
    case c10::TypeKind::NumberType:
      return v.tag == NPUB_VALUE_DOUBLE ? c10::IValue(v.u.d)
             : v.tag == NPUB_VALUE_BOOL ? c10::IValue(v.u.i != 0)
             : v.tag == NPUB_VALUE_INT  ? c10::IValue(v.u.i)
                                        : refuse();
    case c10::TypeKind::StringType:
      return v.tag == NPUB_VALUE_STRING ? c10::IValue(std::string(v.u.s, static_cast<size_t>(v.count)))
                                        : refuse();
    case c10::TypeKind::ListType: {
      c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
      const bool optional_elements = e->kind() == c10::TypeKind::OptionalType;
      if (optional_elements) e = e->castRaw<c10::OptionalType>()->getElementType();
      const auto n = static_cast<size_t>(v.count);
      if (e->kind() == c10::TypeKind::TensorType && v.tag == NPUB_VALUE_TENSOR_LIST) {
        if (optional_elements) {
          c10::List<std::optional<at::Tensor>> l;
          for (size_t i = 0; i < n; ++i)
            l.push_back(v.u.tensors[i] != nullptr ? std::optional<at::Tensor>(cpu_copy(*v.u.tensors[i], op))
                                                  : std::nullopt);
          return l;
        }
        c10::List<at::Tensor> l;
        for (size_t i = 0; i < n; ++i) l.push_back(cpu_copy(*v.u.tensors[i], op));
        return l;
      }
      if ((e->kind() == c10::TypeKind::IntType || e->kind() == c10::TypeKind::SymIntType) &&
          v.tag == NPUB_VALUE_INT_LIST)
        return std::vector<int64_t>(v.u.ints, v.u.ints + n);
      if (e->kind() == c10::TypeKind::BoolType && v.tag == NPUB_VALUE_INT_LIST) {
        c10::List<bool> l;
        for (size_t i = 0; i < n; ++i) l.push_back(v.u.ints[i] != 0);
        return l;
      }
      if (e->kind() == c10::TypeKind::FloatType && v.tag == NPUB_VALUE_DOUBLE_LIST)
        return std::vector<double>(v.u.doubles, v.u.doubles + n);
      return refuse();
    }
    default:
      return refuse();
  }
}

// A reference call (host_call null): see Note [A reference call runs from
// its values].
void run_values_on_cpu(const FallbackCall& fc) {
  const std::string& name = fc.op.name();
  std::string differs;
  const std::optional<c10::OperatorHandle> found = torch_op_of(fc.op, &differs);
  if (!found)
    no_reference(name, differs.empty()
                           ? "PyTorch has no operator of that name"
                           : "PyTorch's operator of that name has another schema (" + differs + ")");
  const c10::OperatorHandle& op = *found;
  // A plugin's own op is registered with PyTorch too, for npu only.
  if (!has_cpu_kernel(op)) no_reference(name, "PyTorch has no CPU kernel of it");
  const auto& sargs = op.schema().arguments();
  const auto& sret = op.schema().returns();
  if (static_cast<size_t>(fc.num_args) > sargs.size() || static_cast<size_t>(fc.num_rets) != sret.size())
    no_reference(name, "the call has " + std::to_string(fc.num_args) + " arguments and " +
                           std::to_string(fc.num_rets) + " returns");
  std::vector<c10::IValue> args;
  args.reserve(sargs.size());
  for (size_t i = 0; i < sargs.size(); ++i) {
    if (i < static_cast<size_t>(fc.num_args))
      args.push_back(ivalue_of(fc.args[i], sargs[i], name));
    else if (sargs[i].default_value().has_value())
      args.push_back(*sargs[i].default_value());
    else
      no_reference(name, "argument '" + sargs[i].name() + "' has no value");
  }
  torch::jit::Stack stack(args.begin(), args.end());
  {
    at::AutoDispatchBelowADInplaceOrView below;
    cpu_op_for(op, &stack).callBoxed(&stack);
  }
  // The written arguments (out=, self of an in-place op), back into the
  // reference's own tensors.
  for (size_t i = 0; i < static_cast<size_t>(fc.num_args); ++i) {
    if (sargs[i].alias_info() == nullptr || !sargs[i].alias_info()->isWrite()) continue;
    const NpubValue& v = fc.args[i];
    if (v.tag == NPUB_VALUE_TENSOR) {
      sim::copy_tensor(*v.u.tensor, DLView(args[i].toTensor()).dl);
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
      const c10::List<at::Tensor> l = args[i].toTensorList();
      for (size_t j = 0; j < static_cast<size_t>(v.count); ++j)
        if (v.u.tensors[j] != nullptr) sim::copy_tensor(*v.u.tensors[j], DLView(l.get(j)).dl);
    }
  }
  const auto& alias = fc.op.return_alias();
  for (size_t i = 0; i < sret.size(); ++i) {
    NpubValue& r = fc.rets[i];
    const c10::IValue& got = stack[i];
    if (alias[i] >= 0) continue;  // written in place: the argument is the return
    if (got.isTensor()) {
      const at::Tensor& t = got.toTensor();
      if (!t.defined()) {
        r = none_value();
        continue;
      }
      const std::vector<int64_t> shape = t.sizes().vec();
      // Into the given return tensor; a new one where there is none, or
      // where the reference's shape is another (the check then reports it).
      if (r.tag != NPUB_VALUE_TENSOR || r.u.tensor == nullptr ||
          !std::equal(shape.begin(), shape.end(), r.u.tensor->shape, r.u.tensor->shape + r.u.tensor->ndim) ||
          static_cast<size_t>(r.u.tensor->ndim) != shape.size()) {
        DLDevice device{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), current_index()};
        for (size_t a = 0; a < static_cast<size_t>(fc.num_args); ++a)
          if (fc.args[a].tag == NPUB_VALUE_TENSOR && fc.args[a].u.tensor != nullptr) {
            device = fc.args[a].u.tensor->device;
            break;
          }
        r = tensor_value(fc.outputs.allocate(static_cast<int32_t>(i), device,
                                             static_cast<int32_t>(shape.size()), shape.data(),
                                             to_dl(npub_dtype(t.scalar_type()))));
      }
      sim::copy_tensor(*r.u.tensor, DLView(t).dl);
    } else if (got.isInt()) {
      r = int_value(got.toInt());
    } else if (got.isDouble()) {
      r = double_value(got.toDouble());
    } else if (got.isBool()) {
      r = bool_value(got.toBool());
    } else {
      r = none_value();
    }
  }
}

}  // namespace

// Note [One way to the CPU]: the dispatcher's fallback (a plugin op with no
// eligible kernel) and PyTorch's boxed fallback (an op no plugin serves)
// both run ATen's CPU kernel through run_on_cpu, so the outputs land on the
// npu in both (torch.mul(torch.tensor(3.), x_npu) came back on the CPU when
// the dispatcher fell back).
void torch_fallback(const FallbackCall& fc) {
  auto* call = static_cast<TorchCall*>(fc.host_call);
  if (call == nullptr) {
    run_values_on_cpu(fc);
    return;
  }
  const c10::OperatorHandle& op = *call->op;
  TORCH_CHECK(has_cpu_kernel(op) || is_fused_rnn_cell(op.schema().operator_name()) ||
                  is_sync_batch_norm_op(op.schema().operator_name()),
              "npubridge: op '", full_name(op.schema().operator_name()),
              "' cannot run on the npu: ", fc.reason,
              "; and PyTorch has no CPU implementation of it to fall back to");
  call->fell_back = true;
  if (call->stack == nullptr) {
    TORCH_INTERNAL_ASSERT(call->push_args != nullptr, "npubridge: an unboxed call without its arguments");
    call->push_args(call->push_ctx, call->own);
    call->stack = &call->own;
  }
  run_on_cpu(op, call->stack);
}

// An op no plugin serves reaches these without the dispatcher: the profiler
// slice the dispatcher's run_fallback makes for the others (trace.h).
trace::Scope fallback_slice(const c10::OperatorHandle& op) {
  return trace::Scope(trace::Kind::kFallback,
                      [&] { return "fallback: " + full_name(op.schema().operator_name()); });
}

void cpu_fallback_counted(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  refuse_quantized_arguments(op, *stack);  // before the fallback's warning: none happens
  note_fallback(op);
  const trace::Scope slice = fallback_slice(op);
  run_on_cpu(op, stack);
}

void cpu_decides(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (fallback_forbidden()) {
    cpu_fallback_counted(op, stack);
    return;
  }
  {
    const trace::Scope slice = fallback_slice(op);
    run_on_cpu(op, stack);
  }
  note_fallback(op);
}

namespace {

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_counted>());
}

// Note [Quantized tensors stay on the CPU]: what would make a quantized
// tensor on npu (q.to("npu") asks empty_quantized for one) reaches this key.
void refuse_quantized_call(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse_quantized(op, "would make a quantized tensor on npu");
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized_call>());
}

// Ops whose CompositeExplicitAutograd kernel calls a CPU/CUDA DispatchStub
// directly ("DispatchStub: missing kernel for npu"): the fallback's instead.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("conj_physical_", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback_counted>());
}

}  // namespace

}  // namespace npub::torch_backend
