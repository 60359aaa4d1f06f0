// The unboxed bridge: a routed op's common-case call served by reference,
// without the boxed stack (see Note [Unboxed entry for the common
// signatures]).
#include "aten/unboxed_bridge.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/util/Exception.h>

#include <npubridge/device_sim/graph_capture.h>

#include "aten/boxing.h"
#include "aten/fallback.h"
#include "aten/meta_cache.h"
#include "aten/minimal.h"
#include "runtime/npu_runtime.h"

#include <array>
#include <memory>
#include <optional>
#include <tuple>

namespace npub::torch_backend {

namespace {

// Note [Unboxed entry for the common signatures]
// A boxed kernel makes PyTorch build a stack for every call: the arguments
// are copied into IValues, and copying a tensor that Python owns takes the
// GIL (PyObject preservation), twice per call. Routed ops whose schema is
// made of tensors and scalars only and returns one new tensor (add.Tensor,
// mul.Tensor, relu, mul.Scalar, ...) or writes and returns its first
// argument (add_.Tensor, addcmul_, ...) get an unboxed entry instead. It serves
// the common case by reference: npu tensors of the current device, a call
// signature the meta cache already knows (for a functional op's outputs),
// no precision check; the dispatcher runs the signature's call plan (Note
// [One call plan per signature]). Anything else
// (CPU scalars, another device, a first call, complex values) goes to the
// boxed bridge unchanged, so both entries behave the same. When the
// dispatcher falls back, the stack is built then (TorchCall::push_args).
template <class... Args>
class UnboxedBridge {
 public:
  UnboxedBridge(std::shared_ptr<Bridge> boxed, c10::OperatorHandle op)
      : boxed_(std::move(boxed)), op_(std::move(op)) {}

  at::Tensor operator()(const Args&... args) const {
    at::Tensor result;
    if (!try_run(&result, args...)) return boxed(args...);
    return result;
  }

  // Serves the call by reference; false when it is the boxed bridge's. The
  // functional routes return their tensor in `result`; the in-place route
  // writes its first argument (and takes no `result`).
  bool try_run(at::Tensor* result, const Args&... args) const {
    constexpr size_t kArgs = sizeof...(Args);
    const c10::DeviceIndex device = current_index();
    // A forked child's call goes to the boxed bridge, which raises.
    // A capture's call goes to the boxed bridge, which allocates a direct
    // route's results before the call (Note [A capture allocates results
    // up front], bridge.cpp).
    if (rt().devices().in_forked_child() || sim::thread_is_capturing() || !(servable(args, device) && ...))
      return false;
    const Route route = boxed_->route();
    // A kernel's own results are contiguous: a strided input's call goes to
    // the boxed bridge, which lays them out as ATen would (Note [Results
    // keep their inputs' memory format]).
    if (route == Route::kDirect && !(contiguous(args) && ...)) return false;
    const OpHandle target = boxed_->resolve();
    if (!target || target.op->schema().returns.size() > 4) return false;
    // The call's signature: the same bytes the boxed bridge's meta cache
    // writes for it, which key the output shapes and the call plan.
    thread_local std::string key;
    key.clear();
    put(key, &op_.schema());
    (add_key(key, args), ...);
    at::Tensor out;
    if (route == Route::kViaOut) {
      const OutputSpecs* specs = cached_output_specs(key);
      if (specs == nullptr || specs->size() != 1) return false;
      out = empty_like_spec((*specs)[0], device);
    }
    std::array<DLTensor, kArgs + 1> dls{};
    std::array<NpubValue, kArgs + 1> values{};
    size_t i = 0;
    ((values[i] = box_arg(args, dls[i]), ++i), ...);
    if (route == Route::kViaOut) values[i++] = tensor_value(&(dls[kArgs] = DLView(out).dl));
    if (route == Route::kInplaceViaOut) values[i++] = tensor_value(&(dls[kArgs] = dls[0]));  // out= self
    std::array<NpubValue, 4> rets;
    rets.fill(none_value());
    TorchOutputs outs;
    TorchCall call{&op_, nullptr};
    const std::tuple<const Args&...> refs(args...);
    call.push_args = [](const void* ctx, torch::jit::Stack& stack) {
      std::apply([&](const Args&... a) { (stack.emplace_back(a), ...); },
                 *static_cast<const std::tuple<const Args&...>*>(ctx));
    };
    call.push_ctx = &refs;
    call_planned(key, target, values.data(), static_cast<int32_t>(i), rets.data(),
                 static_cast<int32_t>(target.op->schema().returns.size()), &outs, call);
    if (route == Route::kInplaceViaOut) return true;  // written in place (by the fallback too)
    if (call.fell_back) {
      *result = call.own.back().toTensor();
    } else if (route == Route::kViaOut) {
      *result = std::move(out);
    } else {
      const at::Tensor* r = outs.find(0);
      TORCH_INTERNAL_ASSERT(r != nullptr, "npubridge: '", full_name(op_.schema().operator_name()),
                            "' returned no tensor");
      *result = *r;
    }
    return true;
  }

  at::Tensor boxed(const Args&... args) const {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(args), ...);
    (*boxed_)(op_, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return stack.back().toTensor();
  }

 private:
  static bool servable(const at::Tensor& t, c10::DeviceIndex device) {
    return t.defined() && t.is_privateuseone() && t.device().index() == device &&
           npub_dtype(t.scalar_type()) != DType::kUnknown && !t.is_neg();  // as describable()
  }
  static bool servable(const c10::Scalar& s, c10::DeviceIndex) { return !s.isComplex() && !s.isSymbolic(); }
  static bool contiguous(const at::Tensor& t) { return t.is_contiguous(); }
  static bool contiguous(const c10::Scalar&) { return true; }
  // The same bytes signature() writes for the boxed form of the argument.
  static void add_key(std::string& k, const at::Tensor& t) { tensor_key(k, t); }
  static void add_key(std::string& k, const c10::Scalar& s) {
    if (s.isBoolean())
      bool_key(k, s.toBool());
    else if (s.isIntegral(false))
      int_key(k, s.toLong());
    else
      double_key(k, s.toDouble());
  }
  static NpubValue box_arg(const at::Tensor& t, DLTensor& dl) { return tensor_value(&(dl = DLView(t).dl)); }
  static NpubValue box_arg(const c10::Scalar& s, DLTensor&) {
    if (s.isBoolean()) return bool_value(s.toBool());
    if (s.isIntegral(false)) return int_value(s.toLong());
    return double_value(s.toDouble());
  }
  std::shared_ptr<Bridge> boxed_;
  c10::OperatorHandle op_;
};

// The in-place form (add_.Tensor, mul_.Scalar, addcmul_, ...): self is
// written through the op's .out kernel and returned as it came.
template <class... Rest>
class UnboxedInplaceBridge {
 public:
  UnboxedInplaceBridge(std::shared_ptr<Bridge> boxed, c10::OperatorHandle op)
      : impl_(std::move(boxed), std::move(op)) {}
  at::Tensor& operator()(at::Tensor& self, const Rest&... rest) const {
    if (!impl_.try_run(nullptr, self, rest...)) impl_.boxed(self, rest...);
    return self;
  }

 private:
  UnboxedBridge<at::Tensor, Rest...> impl_;
};

}  // namespace

torch::CppFunction bridge_kernel(Route route, const std::string& target, const c10::OperatorHandle& op,
                                 bool has_out) {
  auto bridge = std::make_shared<Bridge>(route, target);
  bridge->set_has_out(has_out);
  const c10::FunctionSchema& f = op.schema();
  std::string shape;
  const bool inplace = route == Route::kInplaceViaOut;
  // Functional: one new tensor, no aliasing. In place: self (and only self)
  // written and returned.
  bool plain = f.returns().size() == 1 && f.returns()[0].type()->kind() == c10::TypeKind::TensorType &&
               (f.returns()[0].alias_info() == nullptr) != inplace;
  for (size_t i = 0; i < f.arguments().size(); ++i) {
    const auto& a = f.arguments()[i];
    plain = plain && (a.alias_info() == nullptr || (inplace && i == 0 && a.alias_info()->isWrite()));
    const c10::TypeKind k = a.type()->kind();
    shape += k == c10::TypeKind::TensorType ? 'T' : k == c10::TypeKind::NumberType ? 'S' : '?';
  }
  using T = at::Tensor;
  using S = c10::Scalar;
  if (plain && !inplace) {
    if (shape == "T") return torch::CppFunction(UnboxedBridge<T>(bridge, op));
    if (shape == "TT") return torch::CppFunction(UnboxedBridge<T, T>(bridge, op));
    if (shape == "TS") return torch::CppFunction(UnboxedBridge<T, S>(bridge, op));
    if (shape == "TTS") return torch::CppFunction(UnboxedBridge<T, T, S>(bridge, op));
    if (shape == "TSS") return torch::CppFunction(UnboxedBridge<T, S, S>(bridge, op));
    if (shape == "TTTS") return torch::CppFunction(UnboxedBridge<T, T, T, S>(bridge, op));
  }
  if (plain && inplace) {
    if (shape == "T") return torch::CppFunction(UnboxedInplaceBridge<>(bridge, op));
    if (shape == "TT") return torch::CppFunction(UnboxedInplaceBridge<T>(bridge, op));
    if (shape == "TS") return torch::CppFunction(UnboxedInplaceBridge<S>(bridge, op));
    if (shape == "TTS") return torch::CppFunction(UnboxedInplaceBridge<T, S>(bridge, op));
    if (shape == "TSS") return torch::CppFunction(UnboxedInplaceBridge<S, S>(bridge, op));
    if (shape == "TTTS") return torch::CppFunction(UnboxedInplaceBridge<T, T, S>(bridge, op));
  }
  struct BoxedEntry final : c10::OperatorKernel {
    std::shared_ptr<Bridge> bridge;
    void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
      (*bridge)(op, ks, stack);
    }
  };
  auto k = std::make_unique<BoxedEntry>();
  k->bridge = std::move(bridge);
  return torch::CppFunction::makeFromBoxedFunctor(std::move(k));
}

}  // namespace npub::torch_backend
