// The error model (error_bound.h) for hosts built against LibTorch: the
// references' inputs made from a call's CPU arguments (float64, |.|) and the
// verdict on one output tensor. Used by npub-conformance, the PyTorch
// extension's precision check and its OpInfo runner, so the three agree on
// what "matches" means. Header-only, like boxing.h; the core
// libraries never include it.
#pragma once

#include <ATen/ATen.h>

#include <npubridge/dispatcher/error_bound.h>
#include <npubridge/registry/schema.h>
#include <npubridge/torch/boxing.h>
#include <npubridge/torch/dtype.h>

#include <cmath>
#include <memory>
#include <vector>

namespace npub::numerics {

// How a reference's inputs are made from the call's.
enum class Precision {
  kSame,       // copies, as given: the op in its own dtype
  kFloat64,    // floating tensors (and floating ScalarType arguments) in float64
  kMagnitude,  // float64, every floating tensor and Scalar argument by its absolute value
};

inline at::Tensor reference_tensor(const at::Tensor& t, Precision p, at::ScalarType compute) {
  if (!t.defined()) return t;
  if (p == Precision::kSame || !at::isFloatingType(t.scalar_type())) {
    at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
    return c.copy_(t);
  }
  // A 0-d operand of a wider dtype takes part as ATen's type promotion
  // casts it (x + torch.tensor(0.1, dtype=torch.float64) adds float32's
  // 0.1 to a float32 x).
  at::Tensor r = t;
  const int compute_bits = precision_bits(npub_dtype(compute));
  if (t.dim() == 0 && compute_bits > 0 && precision_bits(npub_dtype(t.scalar_type())) > compute_bits)
    r = t.to(compute);
  r = r.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  return p == Precision::kMagnitude ? r.abs() : r;
}

// One argument of the reference call. `scalar_type_arg`/`scalar_arg`: the
// schema declares it ScalarType / Scalar. `compute`: the op's floating
// result dtype (Undefined when unknown).
inline c10::IValue reference_input(const c10::IValue& v, bool scalar_type_arg, bool scalar_arg, Precision p,
                                   at::ScalarType compute) {
  if (v.isTensor()) return reference_tensor(v.toTensor(), p, compute);
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorVector()) l.push_back(reference_tensor(t, p, compute));
    return l;
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {  // Tensor?[]
    c10::List<std::optional<at::Tensor>> l;
    for (const c10::IValue& e : v.toListRef())
      l.push_back(e.isTensor() ? std::optional<at::Tensor>(reference_tensor(e.toTensor(), p, compute))
                               : std::nullopt);
    return l;
  }
  if (p == Precision::kSame) return v;
  if (scalar_type_arg && v.isInt() && at::isFloatingType(static_cast<at::ScalarType>(v.toInt())))
    return static_cast<int64_t>(at::kDouble);
  if (p == Precision::kMagnitude && scalar_arg) {
    if (v.isDouble()) return std::fabs(v.toDouble());
    if (v.isInt()) return std::abs(v.toInt());
  }
  return v;
}

inline std::vector<double> tensor_doubles(const at::Tensor& t) {
  if (t._is_zerotensor())
    return std::vector<double>(static_cast<size_t>(t.numel()), 0.0);  // autograd's lazy zeros
  at::Tensor d = t.to(at::kCPU).to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

// K for a call whose arguments are IValues, boxed against `schema` with
// metadata-only tensors (K depends on shapes and scalars only).
inline int64_t call_terms(const ErrorModel& model, const reg::Schema& schema,
                          const std::vector<c10::IValue>& args) {
  if (model.kind != ErrorKind::kAccumulated) return 0;
  struct Meta {
    DLTensor dl{};
    std::vector<int64_t> shape;
  };
  std::vector<std::unique_ptr<Meta>> metas;
  BoxedStorage storage;
  std::vector<NpubValue> boxed;
  for (const c10::IValue& v : args)
    boxed.push_back(box_ivalue(v, storage, [&](const at::Tensor& t) {
      metas.push_back(std::make_unique<Meta>());
      Meta& m = *metas.back();
      m.shape = t.sizes().vec();
      m.dl.ndim = static_cast<int32_t>(t.dim());
      m.dl.shape = m.shape.data();
      return &m.dl;
    }));
  return terms(model, schema, boxed.data(), static_cast<int32_t>(boxed.size()));
}

// The largest finite |value| among the floating input tensors and the
// reference (Magnitude::kScale). `inputs`: the call's arguments, written
// ones (out=) left out by the caller.
inline double call_scale(const std::vector<c10::IValue>& inputs, const at::Tensor& reference) {
  double scale = 0;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type())) return;
    at::Tensor a = t.to(at::kCPU).to(at::kDouble).abs();
    a = at::where(a.isfinite(), a, at::zeros_like(a));
    scale = std::max(scale, a.max().item<double>());
  };
  for (const c10::IValue& v : inputs) {
    if (v.isTensor())
      visit(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) visit(t);
  }
  visit(reference);
  return scale;
}

// The verdict on one output. `host`: the reference in the op's dtype (its
// dtype and shape are what `got` must have); `wide`: the float64 reference
// (undefined: none, host values are the reference); `magnitude`: the op on
// |inputs| (undefined: none); `terms` and `scale` as Comparison's.
inline Verdict judge(const ErrorModel& model, const at::Tensor& got, const at::Tensor& host,
                     const at::Tensor& wide, const at::Tensor& magnitude, int64_t terms, double scale) {
  const std::vector<double> g = tensor_doubles(got), h = tensor_doubles(host);
  const bool floating = at::isFloatingType(host.scalar_type());
  const bool alternative = floating && wide.defined() && model.kind == ErrorKind::kSameDtype;
  const bool use_wide = floating && wide.defined() && !alternative;
  const std::vector<double> ref = use_wide || alternative ? tensor_doubles(wide) : h;
  const std::vector<double> mag = magnitude.defined() ? tensor_doubles(magnitude) : std::vector<double>();
  Comparison c;
  c.got = g.data();
  c.reference = alternative ? h.data() : ref.data();
  c.alternative = alternative ? ref.data() : nullptr;
  c.host = use_wide ? h.data() : nullptr;
  c.magnitude = mag.empty() ? nullptr : mag.data();
  c.numel = static_cast<int64_t>(g.size());
  c.dtype = npub_dtype(host.scalar_type());
  c.terms = terms;
  c.scale = scale;
  return compare(model, c);
}

}  // namespace npub::numerics
