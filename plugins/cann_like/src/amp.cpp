// The gradient scaler's two ops, what torch.amp.GradScaler("npu") calls in
// unscale_() and update(): aten::_amp_foreach_non_finite_check_and_unscale_
// and aten::_amp_update_scale_, with the semantics of ATen's CPU kernels
// (AmpGradScalerKernels.cpp), checks included.
//
// Note [The scaler's ops compute as ATen's CPU kernels]
// Unscaling multiplies each gradient element by inv_scale in the gradient's
// compute type (float32 for float16/bfloat16, as ATen's opmath; float64 for
// float64), and leaves the tensor untouched when inv_scale is exactly 1, as
// ATen's `inv_scale == 1 ? val : val * inv_scale` does. found_inf is set to
// 1 when any element, read in the compute type, is not finite, and never
// written otherwise (zeroing it is the caller's job). The scale is updated
// in double and rounded once to float32 (ATen: float * double assigned to a
// float), and does not grow past float32's range.
#include <plugin_kernels/float_access.h>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "ops.h"

namespace cann_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

void check_one_element(const Call& call, const TensorRef& t, const char* name, DLDataType dtype,
                       const char* dtype_name) {
  if (t.numel() != 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) +
                                             ": expected a one-element tensor but found one of shape " +
                                             Call::shape_str(t.sizes()));
  if (!t.is(dtype))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected dtype " + dtype_name +
                                             " but found " + npub::sdk::dtype_name(t.dtype()));
}

bool is_floating(const TensorRef& t) {
  return t.is(npub::sdk::kFloat32) || t.is(npub::sdk::kFloat64) || t.is(npub::sdk::kFloat16) ||
         t.is(npub::sdk::kBFloat16);
}

// Elements [b, e) of one gradient: whether one is not finite; unscaled in
// place unless inv_scale is 1.
template <typename S>
bool unscale_elements(typename S::E* __restrict x, int64_t b, int64_t e, float inv_scale) {
  using T = typename S::T;
  bool non_finite = false;
  if (inv_scale == 1.f) {
    for (int64_t i = b; i < e; ++i) non_finite |= !std::isfinite(S::load(x[i]));
    return non_finite;
  }
  const T inv = static_cast<T>(inv_scale);
  for (int64_t i = b; i < e; ++i) {
    const T v = S::load(x[i]);
    non_finite |= !std::isfinite(v);
    x[i] = S::store(v * inv);
  }
  return non_finite;
}

void check_unscale_args(Call& call) {
  const std::vector<TensorRef> grads = call.tensor_list(0);
  const TensorRef found_inf = call.tensor(1), inv_scale = call.tensor(2);
  if (grads.empty()) return;  // ATen returns before its checks
  check_one_element(call, inv_scale, "inv_scale", npub::sdk::kFloat32, "float32");
  check_one_element(call, found_inf, "found_inf", npub::sdk::kFloat32, "float32");
  for (size_t i = 0; i < grads.size(); ++i)
    if (!is_floating(grads[i]))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "self[" + std::to_string(i) +
                    "]: expected a float32, float16, bfloat16 or float64 tensor but found " +
                    npub::sdk::dtype_name(grads[i].dtype()));
}

// aten::_amp_foreach_non_finite_check_and_unscale_(Tensor(a!)[] self, Tensor(b!) found_inf,
//   Tensor inv_scale) -> ()
void non_finite_check_and_unscale(Call& call) {
  check_unscale_args(call);
  const std::vector<TensorRef> grads = call.tensor_list(0);
  if (grads.empty()) return;
  const TensorRef found_inf = call.tensor(1);
  const float inv_scale = *call.tensor(2).data<float>();
  std::atomic<bool> non_finite{false};
  for (const TensorRef& g : grads) {
    const int64_t n = g.numel();
    if (n == 0) continue;
    plugin_kernels::with_float_types(call, g.dtype(), [&](auto elem) {
      using S = decltype(elem);
      typename S::E* x = plugin_kernels::elements<S>(g);
      call.parallel_for(0, n, 1 << 15, [&](int64_t b, int64_t e) {
        if (unscale_elements<S>(x, b, e, inv_scale)) non_finite.store(true, std::memory_order_relaxed);
      });
    });
  }
  if (non_finite.load()) *found_inf.data<float>() = 1.f;
}

void check_update_scale_args(Call& call) {
  check_one_element(call, call.tensor(0), "self", npub::sdk::kFloat32, "float32");
  check_one_element(call, call.tensor(1), "growth_tracker", npub::sdk::kInt32, "int32");
  check_one_element(call, call.tensor(2), "found_inf", npub::sdk::kFloat32, "float32");
}

// aten::_amp_update_scale_(Tensor(a!) self, Tensor(b!) growth_tracker, Tensor found_inf,
//   float scale_growth_factor, float scale_backoff_factor, int growth_interval) -> Tensor(a!)
void update_scale(Call& call) {
  check_update_scale_args(call);
  float* scale = call.tensor(0).data<float>();
  int32_t* tracker = call.tensor(1).data<int32_t>();
  const float found_inf = *call.tensor(2).data<float>();
  const double growth = call.double_arg(3), backoff = call.double_arg(4);
  const int64_t interval = call.int_arg(5);
  if (found_inf != 0.f) {
    *scale = static_cast<float>(*scale * backoff);
    *tracker = 0;
    return;
  }
  // A successful step: counted before it is compared with the interval.
  const int32_t successful = *tracker + 1;
  if (successful == interval) {
    const float grown = static_cast<float>(*scale * growth);
    if (std::isfinite(grown)) *scale = grown;  // never past float32's range to inf
    *tracker = 0;
  } else {
    *tracker = successful;
  }
}

}  // namespace

void register_amp(npub::sdk::Registrar& r) {
  // The first tensor's dtype picks the kernel (a gradient of another dtype
  // goes to ATen's CPU kernel, which refuses it); the bodies check the other
  // arguments' dtypes (ATen's rules, with the argument named).
  r.op("aten::_amp_foreach_non_finite_check_and_unscale_(Tensor(a!)[] self, Tensor(b!) found_inf, "
       "Tensor inv_scale) -> ()",
       &non_finite_check_and_unscale)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat64, npub::sdk::kFloat16, npub::sdk::kBFloat16})
      .mixed_dtypes()
      .contiguous_only();
  r.meta<&check_unscale_args>("aten::_amp_foreach_non_finite_check_and_unscale_");
  r.op("aten::_amp_update_scale_(Tensor(a!) self, Tensor(b!) growth_tracker, Tensor found_inf, "
       "float scale_growth_factor, float scale_backoff_factor, int growth_interval) -> Tensor(a!)",
       &update_scale)
      .dtypes({npub::sdk::kFloat32})
      .mixed_dtypes();
  r.meta<&check_update_scale_args>("aten::_amp_update_scale_");
}

}  // namespace cann_like
