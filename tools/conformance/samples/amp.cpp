// The gradient scaler of mixed precision: _amp_foreach_non_finite_check_and_unscale_
// and _amp_update_scale_ (cann_like serves them: plugins/cann_like/src/amp.cpp).
#include "sample_kit.h"

namespace npub::conformance {
namespace {

// _amp_foreach_non_finite_check_and_unscale_(self!, found_inf!, inv_scale):
// gradients of dtype dt (one with inf/nan) unscaled by a float32 scalar.
SampleFn amp_unscale_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    auto f32 = [](double v) { return at::full({1}, v, at::TensorOptions().dtype(at::kFloat)); };
    auto grads = [&](int kind) {
      return c10::List<at::Tensor>({make({5, 7}, dt, kind), make({33}, dt), make({}, dt), make({0, 3}, dt)});
    };
    out.push_back({"finite, inv_scale 1/1024", {grads(0), f32(0), f32(1.0 / 1024)}});
    out.push_back({"finite, inv_scale 1/3", {grads(0), f32(0), f32(1.0 / 3)}});
    out.push_back({"finite, inv_scale 1", {grads(0), f32(0), f32(1)}});
    out.push_back({"inf and nan found", {grads(2), f32(0), f32(0.5)}});
    out.push_back({"found_inf already set", {grads(0), f32(1), f32(0.5)}});
    out.push_back({"large", {c10::List<at::Tensor>({make({512, 300}, dt)}), f32(0), f32(0.125)}});
    out.push_back({"inv_scale float64 (error)",
                   {grads(0), f32(0), at::full({1}, 0.5, at::TensorOptions().dtype(at::kDouble))}});
    out.push_back({"found_inf of two elements (error)", {grads(0), at::zeros({2}), f32(0.5)}});
    return out;
  };
}

// _amp_update_scale_(self!, growth_tracker!, found_inf, growth, backoff,
// interval): float32 only (the scale's dtype).
SampleFn amp_update_scale_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (dt != at::kFloat) return out;
    auto f32 = [](double v) { return at::full({1}, v, at::TensorOptions().dtype(at::kFloat)); };
    auto i32 = [](int64_t v) { return at::full({1}, v, at::TensorOptions().dtype(at::kInt)); };
    out.push_back({"backoff", {f32(65536), i32(3), f32(1), 2.0, 0.5, int64_t{2000}}});
    out.push_back({"counted", {f32(65536), i32(3), f32(0), 2.0, 0.5, int64_t{2000}}});
    out.push_back({"grows at the interval", {f32(65536), i32(1999), f32(0), 2.0, 0.5, int64_t{2000}}});
    out.push_back({"kept below float32's range", {f32(3e38), i32(0), f32(0), 2.0, 0.5, int64_t{1}}});
    out.push_back({"rounded once", {f32(1.0 / 3), i32(0), f32(1), 1.1, 0.3, int64_t{1}}});
    out.push_back(
        {"an int64 growth_tracker (error)",
         {f32(1), at::zeros({1}, at::TensorOptions().dtype(at::kLong)), f32(0), 2.0, 0.5, int64_t{1}}});
    return out;
  };
}

}  // namespace

void add_amp_samples(SampleTable& t) {
  t.samples("aten::_amp_foreach_non_finite_check_and_unscale_", amp_unscale_spec());
  t.samples("aten::_amp_update_scale_", amp_update_scale_spec());
  // The scaler's ops take float32 scalars (found_inf, inv_scale, the
  // scale), which the float64 reference run widens: ATen's CPU kernels
  // refuse those, so the reference runs them in float32 on the (widened)
  // gradients. Outputs: the written arguments in schema order.
  t.reference("aten::_amp_foreach_non_finite_check_and_unscale_", [](const std::vector<IValue>& a) {
    std::vector<at::Tensor> grads = a[0].toTensorVector();
    at::Tensor found = a[1].toTensor(), inv = a[2].toTensor();
    // Widened (the float64 run) when found_inf is: a float64 inv_scale
    // with a float32 found_inf is the sample's own (an error case).
    const bool widened = found.scalar_type() == at::kDouble;
    at::Tensor found32 = widened ? found.to(at::kFloat) : found;
    at::Tensor inv32 = widened ? inv.to(at::kFloat) : inv;
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found32, inv32);
    std::vector<at::Tensor> out = grads;
    out.push_back(found32.to(found.scalar_type()));
    return out;
  });
  t.reference("aten::_amp_update_scale_", [](const std::vector<IValue>& a) {
    at::Tensor scale = a[0].toTensor(), tracker = a[1].toTensor(), found = a[2].toTensor();
    at::Tensor scale32 = scale.scalar_type() == at::kDouble ? scale.to(at::kFloat) : scale;
    at::Tensor found32 = found.scalar_type() == at::kDouble ? found.to(at::kFloat) : found;
    at::_amp_update_scale_(scale32, tracker, found32, a[3].toDouble(), a[4].toDouble(), a[5].toInt());
    // The return (self): with an aliased return the tool compares the
    // returns only; growth_tracker is checked in tests/python/test_fused_adam.py.
    return std::vector<at::Tensor>{scale32.to(scale.scalar_type())};
  });
}

}  // namespace npub::conformance
