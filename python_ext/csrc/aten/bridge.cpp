// The boxed bridge: a routed op's boxed call, run on the plugin kernel
// through npubridge's dispatcher (see bridge.h).
#include "aten/bridge.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <npubridge/device_sim/graph_capture.h>
#include <npubridge/dispatcher/kernel_error.h>
#include <npubridge/support/error.h>

#include "aten/aliased_fallback.h"
#include "aten/boxing.h"
#include "aten/fallback.h"
#include "aten/meta_cache.h"
#include "aten/minimal.h"
#include "runtime/generator.h"

#include <cstddef>
#include <optional>

namespace npub::torch_backend {

namespace {

// Set when the last call_dispatcher on this thread failed in a plugin
// kernel (KernelError), not in the dispatcher's own checks.
thread_local bool tls_kernel_failed = false;

}  // namespace

namespace {

// Runs `fn` (a dispatcher call), its errors as PyTorch's.
template <typename Fn>
void as_torch_call(Fn&& fn) {
  tls_kernel_failed = false;
  try {
    fn();
  } catch (const Error& e) {
    tls_kernel_failed = dynamic_cast<const KernelError*>(&e) != nullptr;
    // The error classes PyTorch code catches by type: torch.OutOfMemoryError
    // (the allocator's, or a kernel's allocation inside the call) and
    // IndexError.
    if (e.code() == ErrorCode::kOutOfMemory) TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    if (e.code() == ErrorCode::kIndex) TORCH_CHECK_INDEX(false, e.what());
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

void call_dispatcher(const OpHandle& target, const NpubValue* args, int32_t num_args, NpubValue* rets,
                     int32_t num_rets, OutputAllocator* outs, TorchCall& call) {
  as_torch_call([&] { rt().dispatcher().call(target, args, num_args, rets, num_rets, outs, &call); });
}

void call_planned(const std::string& key, const OpHandle& target, const NpubValue* args, int32_t num_args,
                  NpubValue* rets, int32_t num_rets, OutputAllocator* outs, TorchCall& call) {
  std::shared_ptr<const CallPlan> plan;
  if (const SignatureEntry* e = find_signature(key)) plan = e->plan;
  if (!plan || plan->handle.op != target.op || plan->handle.preferred_plugin != target.preferred_plugin) {
    try {
      plan =
          std::make_shared<const CallPlan>(rt().dispatcher().plan(target, args, num_args, PlanInputs::kCall));
    } catch (const Error&) {
      // Arguments the dispatcher refuses: the full call raises the same
      // error, counted in the op's statistics as any failed call is.
      call_dispatcher(target, args, num_args, rets, num_rets, outs, call);
      return;
    }
    signature_entry(key).plan = plan;
  }
  as_torch_call([&] { rt().dispatcher().run(*plan, args, num_args, rets, num_rets, outs, &call); });
}

namespace {

// Runs `target` (an op of the registry) on the given IValue arguments and
// leaves its results on `stack` (which must not hold the arguments; null:
// the caller needs no results).
//
// `preallocated`: tensors for the returns, made by the caller (Note [A
// capture allocates results up front]); undefined ones the kernel
// allocates.
//
// `plan_key`: the call's signature (call_signature), whose call plan runs
// it; null: Dispatcher::call decides it anew.
void run_on_dispatcher(const OpHandle& target, c10::ArrayRef<c10::IValue> args, torch::jit::Stack* stack,
                       TorchCall& call, const std::string* plan_key,
                       const std::vector<at::Tensor>* preallocated = nullptr) {
  const c10::DeviceIndex device = call_device(args);
  c10::OptionalDeviceGuard guard;
  if (device != current_index()) guard.reset_device(at::Device(c10::DeviceType::PrivateUse1, device));
  // Note [Work a capture cannot see]: before boxing, which copies a CPU
  // scalar to the device (a captured constant), so the error names the op.
  if (sim::capture_checks_needed())
    rethrow_as_torch([&] {
      sim::Device& dev = rt().devices().at(device);
      sim::capture_target(dev, dev.current_stream(), [&] { return "op '" + target.op->name() + "'"; });
    });
  Boxed b;
  b.values.reserve(args.size());
  b.views.reserve(count_tensors(args));
  sim::Generator* generator = nullptr;  // the call's explicit generator, if any
  for (const auto& a : args) {
    if (a.isGenerator()) generator = &call_generator(a, device, target.op->name().c_str())->philox();
    b.values.push_back(box(a, b, device));
  }
  ScopedCallGenerator bind(generator);
  const auto& returns = target.op->schema().returns;
  NpubValue rets_small[4];
  std::vector<NpubValue> rets_big;
  NpubValue* rets = rets_small;
  if (returns.size() > 4) {
    rets_big.resize(returns.size());
    rets = rets_big.data();
  }
  for (size_t i = 0; i < returns.size(); ++i) rets[i] = none_value();
  std::vector<DLView> ret_views;
  if (preallocated != nullptr) {
    ret_views.reserve(preallocated->size());
    for (size_t i = 0; i < preallocated->size() && i < returns.size(); ++i)
      if ((*preallocated)[i].defined() && target.op->return_alias()[i] < 0) {
        ret_views.emplace_back((*preallocated)[i]);
        rets[i] = tensor_value(&ret_views.back().dl);
      }
  }
  TorchOutputs outs;
  if (plan_key != nullptr)
    call_planned(*plan_key, target, b.values.data(), static_cast<int32_t>(b.values.size()), rets,
                 static_cast<int32_t>(returns.size()), &outs, call);
  else
    call_dispatcher(target, b.values.data(), static_cast<int32_t>(b.values.size()), rets,
                    static_cast<int32_t>(returns.size()), &outs, call);
  if (stack == nullptr) return;
  const auto& alias = target.op->return_alias();
  for (size_t i = 0; i < returns.size(); ++i) {
    if (alias[i] >= 0) {
      stack->push_back(args[static_cast<size_t>(alias[i])]);
    } else if (const at::Tensor* t = outs.find(static_cast<int32_t>(i))) {
      stack->push_back(*t);
    } else if (preallocated != nullptr && i < preallocated->size() && (*preallocated)[i].defined()) {
      stack->push_back((*preallocated)[i]);
    } else if (rets[i].tag == NPUB_VALUE_INT) {
      stack->push_back(rets[i].u.i);
    } else if (rets[i].tag == NPUB_VALUE_DOUBLE) {
      stack->push_back(rets[i].u.d);
    } else if (rets[i].tag == NPUB_VALUE_BOOL) {
      stack->push_back(rets[i].u.i != 0);
    } else {
      stack->push_back(at::Tensor());  // undefined (output_mask off)
    }
  }
}

// Note [Results keep their inputs' memory format]
// A kernel allocates its results contiguous (alloc_output), where ATen lays
// the result of a channels_last input out channels_last (a convolution's,
// say), and a model written for channels_last would lose the layout after
// the first such op. When an argument is channels_last, the op's meta
// kernel (cached) says ATen's layout, and a result laid out otherwise is
// copied into it on the device. Other calls pay one flag test per tensor.
void lay_out_as_aten(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args,
                     torch::jit::Stack& results) {
  bool channels_last = false;
  for (const auto& a : args)
    if (a.isTensor() && a.toTensor().defined() && !a.toTensor().is_contiguous() &&
        (a.toTensor().is_contiguous(at::MemoryFormat::ChannelsLast) ||
         a.toTensor().is_contiguous(at::MemoryFormat::ChannelsLast3d)))
      channels_last = true;
  if (!channels_last) return;
  // A convolution's layout is the backend's choice, which no meta kernel
  // knows: ATen's CPU convolution gives channels_last when the input or the
  // weight is (Note [The overrideable convolutions]).
  if (op.schema().operator_name().name == "aten::convolution_overrideable") {
    at::Tensor& r = results[0].toTensor();
    const auto format = r.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
    // Through copy_, not r.contiguous(format): that is aten::clone, which
    // plugins serve only into contiguous results, so it fell back to the
    // CPU for every channels_last convolution.
    if (r.dim() >= 4 && !r.is_contiguous(format)) {
      at::Tensor laid_out = at::empty(r.sizes(), r.options().memory_format(format));
      laid_out.copy_(r);
      results[0] = laid_out;
    }
    return;
  }
  const auto specs = output_specs(op, args);
  if (!specs || specs->size() != results.size()) return;
  for (size_t i = 0; i < results.size(); ++i) {
    const OutputSpec& spec = (*specs)[i];
    if (!results[i].isTensor() || spec.strides.empty()) continue;
    const at::Tensor& r = results[i].toTensor();
    if (!r.defined() || !r.sizes().equals(spec.sizes) || r.strides().equals(spec.strides)) continue;
    at::Tensor laid_out = empty_like_spec(spec, r.device().index());
    laid_out.copy_(r);
    results[i] = laid_out;
  }
}

}  // namespace

void Bridge::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  check_not_in_bad_fork(op.schema().operator_name().name.c_str());
  const size_t n = op.schema().arguments().size();
  // The call's arguments, then (for the .out routes) its outputs.
  c10::SmallVector<c10::IValue, 8> args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
  // copy_ between the host and the device is a transfer, not a kernel: the
  // device's copy engine does it (a plugin's copy_ is device to device).
  if (route_ == Route::kDirect && op.schema().operator_name().name == "aten::copy_" &&
      args[0].toTensor().device() != args[1].toTensor().device()) {
    copy_from(args[1].toTensor(), args[0].toTensor(), false);
    torch::jit::drop(*stack, n);
    stack->push_back(args[0]);
    return;
  }
  // Tensors of a dtype plugins cannot describe (complex, float8, ...) are
  // the host's to compute.
  if (!describable(args)) {
    cpu_fallback_counted(op, stack);
    return;
  }
  c10::SmallVector<at::Tensor, 2> outs;
  Sharing sharing = Sharing::kNone;
  if (route_ == Route::kDirect) {
    // Note [out= is checked as ATen checks it]
    // ATen's checks of out= arguments differ per op: what overlap with the
    // inputs it refuses (any for cat and index_select, partial for
    // elementwise ops, none for reductions), which dtypes it writes (casts
    // for sum, none for mm), and whether the checks run before the resize.
    // So an out= that shares memory with another argument, and one the op's
    // meta kernel refuses, are ATen's CPU kernel's to judge (on views that
    // share memory as the npu tensors do), before a resize could change an
    // input; it raises ATen's own error or computes what ATen computes. An
    // out= that is the very same view as an input and keeps its shape
    // (add(x, y, out=x), an optimizer's foreach step) goes on to the
    // dispatcher: alias-safe elementwise kernels serve it, as ATen's
    // TensorIterator allows, and any other op falls back to ATen's CPU.
    if (has_out_) {
      sharing = written_sharing(op, *stack);
      if (sharing == Sharing::kOther || !resize_outs(op, args, /*may_resize=*/sharing == Sharing::kNone)) {
        cpu_decides(op, stack);
        return;
      }
    }
  } else if (route_ == Route::kInplaceViaOut) {
    outs.push_back(args[0].toTensor());
  } else {
    const auto specs = output_specs(op, args);
    if (!specs) {
      // No meta kernel (or an input the meta kernel rejects): let the CPU
      // implementation decide, and raise its own error if it must.
      cpu_decides(op, stack);
      return;
    }
    const c10::DeviceIndex device = call_device(args);
    for (const OutputSpec& spec : *specs) outs.push_back(empty_like_spec(spec, device));
  }
  for (const auto& o : outs) args.push_back(o);
  const OpHandle target = resolve();
  TorchCall call{&op, stack};
  // The dispatcher's fallback (no kernel for these dtypes) runs ATen's CPU
  // fallback on the original stack; otherwise the results replace it (the
  // .out routes return their outputs).
  torch::jit::Stack results;
  // Only this call's kernel failure may send it to the CPU below (an error
  // raised before the dispatcher runs leaves the flag of an earlier call).
  tls_kernel_failed = false;
  // Note [A capture allocates results up front]: a direct route's kernel
  // allocates its results itself, which a capture cannot let it do (it
  // records the kernel, it does not run it): the results are made here from
  // ATen's meta kernel, in the graph's pool, and handed to the kernel as
  // its return tensors. Without a meta kernel the dispatcher refuses the
  // call as data-dependent.
  std::vector<at::Tensor> preallocated;
  if (route_ == Route::kDirect && !has_out_ && sim::thread_is_capturing()) {
    if (const auto specs = output_specs(op, c10::ArrayRef<c10::IValue>(args.data(), n))) {
      const c10::DeviceIndex device = call_device(args);
      for (const OutputSpec& spec : *specs) preallocated.push_back(empty_like_spec(spec, device));
    }
  }
  // The signature's call plan (Note [One call plan per signature]), as the
  // unboxed entry runs it; a capture's call is decided in full.
  thread_local std::string key;
  const bool planned = preallocated.empty() && !sim::thread_is_capturing() &&
                       call_signature(op, c10::ArrayRef<c10::IValue>(args.data(), n), &key);
  try {
    run_on_dispatcher(target, args, route_ == Route::kDirect ? &results : nullptr, call,
                      planned ? &key : nullptr, preallocated.empty() ? nullptr : &preallocated);
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (const c10::Error&) {
    // A kernel that refuses an out= call (an out dtype it cannot write)
    // words the refusal its own way: ATen's CPU kernel raises ATen's error,
    // or computes what the kernel would not (Note [out= is checked as ATen
    // checks it]). Kernels check their arguments before they write; where
    // out= is also an input, a kernel that failed after writing would have
    // changed what the CPU reads, so that error stands.
    if (!has_out_ || route_ != Route::kDirect || !tls_kernel_failed || call.fell_back ||
        sharing != Sharing::kNone)
      throw;
    cpu_decides(op, stack);
    return;
  }
  if (call.fell_back) return;
  torch::jit::drop(*stack, n);
  if (route_ == Route::kDirect) {
    lay_out_as_aten(op, c10::ArrayRef<c10::IValue>(args.data(), n), results);
    for (auto& r : results) stack->push_back(std::move(r));
  } else {
    for (const auto& o : outs) stack->push_back(o);
  }
}

}  // namespace npub::torch_backend
