// Reductions over dims (sum, mean, prod, amax/amin, max/min with indices,
// argmax/argmin, var/std, norms, all/any), cumsum and histc.
#include "sample_kit.h"

#include <limits>

namespace npub::conformance {
namespace {

struct DimCase {
  std::string name;
  IValue dim;  // as the schema takes it
  bool keepdim;
  std::vector<int64_t> shape;
  bool noncontig = false;
};

std::vector<DimCase> dim_cases(bool list_dims, bool allow_all, bool allow_empty_input) {
  std::vector<DimCase> c;
  auto d = [&](std::vector<int64_t> dims) -> IValue {
    if (list_dims) return IValue(dims);
    return IValue(dims.at(0));
  };
  c.push_back({"dim 1", d({1}), false, {4, 5, 6}});
  c.push_back({"dim -1 keepdim", d({-1}), true, {4, 5, 6}});
  c.push_back({"dim 0", d({0}), false, {4, 5, 6}});
  if (list_dims) {
    c.push_back({"dims [0, 2]", d({0, 2}), false, {4, 5, 6}});
    c.push_back({"dims [0, 2] keepdim", d({0, 2}), true, {4, 5, 6}});
  }
  if (allow_all)
    c.push_back({"all dims", list_dims ? IValue(std::vector<int64_t>{}) : IValue(), false, {4, 5, 6}});
  c.push_back({"0-d input", d({0}), false, {}});
  c.push_back({"transposed input", d({1}), false, {6, 5}, true});
  c.push_back({"large, last dim", d({-1}), false, {64, 4096}});
  c.push_back({"large, all", list_dims ? IValue(std::vector<int64_t>{0, 1}) : d({0}), false, {256, 1024}});
  if (allow_empty_input) c.push_back({"empty input", d({1}), false, {0, 3}});
  return c;
}

at::Tensor make_for(const DimCase& c, ScalarType dt, int kind = 0) {
  if (c.noncontig) return make_t(c.shape[0], c.shape[1], dt, kind);
  return make(c.shape, dt, kind);
}

// (self, dim, keepdim, [*, dtype=None], out)
SampleFn reduce_dims(bool list_dims, bool with_dtype, OutRule rule, bool allow_all, bool allow_empty) {
  return [=](ScalarType dt) {
    std::vector<Sample> out;
    for (const DimCase& c : dim_cases(list_dims, allow_all, allow_empty)) {
      std::vector<IValue> args{make_for(c, dt), c.dim, c.keepdim};
      if (with_dtype) args.push_back(IValue());
      args.push_back(empty_out(out_dtype(rule, dt)));
      out.push_back({c.name, args});
    }
    return out;
  };
}

// amax/amin: (self, int[1] dim, keepdim, out)
SampleFn reduce_extreme_list() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const DimCase& c : dim_cases(true, true, false))
      out.push_back({c.name, {make_for(c, dt, is_float(dt) ? 0 : 0), c.dim, c.keepdim, empty_out(dt)}});
    if (is_float(dt))
      out.push_back(
          {"nan propagates", {make({4, 4}, dt, 2), IValue(std::vector<int64_t>{1}), false, empty_out(dt)}});
    return out;
  };
}

// max.dim_max / min.dim_min: (self, int dim, keepdim, values, indices)
SampleFn reduce_with_indices() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const DimCase& c : dim_cases(false, false, false))
      out.push_back({c.name, {make_for(c, dt), c.dim, c.keepdim, empty_out(dt), empty_out(at::kLong)}});
    // Ties: the first index wins.
    at::Tensor ties = at::zeros({3, 4}, at::TensorOptions().dtype(dt));
    out.push_back({"ties", {ties, IValue(int64_t{1}), false, empty_out(dt), empty_out(at::kLong)}});
    return out;
  };
}

// argmax/argmin: (self, int? dim, keepdim, out)
SampleFn reduce_arg() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const DimCase& c : dim_cases(false, true, false))
      out.push_back({c.name, {make_for(c, dt), c.dim, c.keepdim, empty_out(at::kLong)}});
    return out;
  };
}

// var/std.correction_out: (self, dim?, *, correction?, keepdim, out)
SampleFn reduce_var() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const DimCase& c : dim_cases(true, true, false))
      out.push_back({c.name, {make_for(c, dt), c.dim, IValue(), c.keepdim, empty_out(dt)}});
    out.push_back({"correction 0",
                   {make({4, 6}, dt), IValue(std::vector<int64_t>{1}), IValue(c10::Scalar(int64_t{0})), false,
                    empty_out(dt)}});
    out.push_back(
        {"correction 2.5",
         {make({4, 6}, dt), IValue(std::vector<int64_t>{1}), IValue(c10::Scalar(2.5)), true, empty_out(dt)}});
    return out;
  };
}

// norm.out: (self, Scalar? p, int[1] dim, keepdim, out)
SampleFn reduce_norm() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const std::vector<std::pair<std::string, IValue>> ps = {
        {"p=2", IValue(c10::Scalar(2.0))},
        {"p=1", IValue(c10::Scalar(int64_t{1}))},
        {"p=None", IValue()},
        {"p=inf", IValue(c10::Scalar(std::numeric_limits<double>::infinity()))},
        {"p=0", IValue(c10::Scalar(0.0))},
        {"p=3", IValue(c10::Scalar(3.0))}};
    for (const auto& [name, p] : ps)
      for (const DimCase& c : dim_cases(true, false, false)) {
        if (c.name.find("large") != std::string::npos && name != "p=2") continue;
        out.push_back({name + ", " + c.name, {make_for(c, dt), p, c.dim, c.keepdim, empty_out(dt)}});
      }
    return out;
  };
}

// cumsum.out: (self, dim, *, dtype?, out)
SampleFn cumsum_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const ScalarType od = at::isIntegralType(dt, true) ? at::kLong : dt;
    out.push_back({"dim 1", {make({4, 5, 6}, dt), int64_t{1}, IValue(), empty_out(od)}});
    out.push_back({"dim -1", {make({4, 5, 6}, dt), int64_t{-1}, IValue(), empty_out(od)}});
    out.push_back({"dim 0", {make({4, 5, 6}, dt), int64_t{0}, IValue(), empty_out(od)}});
    out.push_back({"0-d", {make({}, dt), int64_t{0}, IValue(), empty_out(od)}});
    out.push_back({"empty", {make({0, 3}, dt), int64_t{1}, IValue(), empty_out(od)}});
    out.push_back({"transposed", {make_t(6, 5, dt), int64_t{1}, IValue(), empty_out(od)}});
    out.push_back({"large", {make({64, 2048}, dt), int64_t{1}, IValue(), empty_out(od)}});
    return out;
  };
}

// linalg_vector_norm.out: (self, Scalar ord, int[1]? dim, keepdim, *, ScalarType? dtype, out)
SampleFn vector_norm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    const double inf = std::numeric_limits<double>::infinity();
    const std::vector<std::pair<std::string, c10::Scalar>> ords = {
        {"ord 2", c10::Scalar(int64_t{2})}, {"ord 1", c10::Scalar(1.0)},  {"ord inf", c10::Scalar(inf)},
        {"ord -inf", c10::Scalar(-inf)},    {"ord 0", c10::Scalar(0.0)},  {"ord 3", c10::Scalar(3.0)},
        {"ord 0.5", c10::Scalar(0.5)},      {"ord -1", c10::Scalar(-1.0)}};
    for (const auto& [name, ord] : ords)
      for (const DimCase& c : dim_cases(true, true, false)) {
        if (c.name.find("large") != std::string::npos && name != "ord 2") continue;
        out.push_back(
            {name + ", " + c.name, {make_for(c, dt), ord, c.dim, c.keepdim, IValue(), empty_out(dt)}});
      }
    out.push_back(
        {"dim None", {make({4, 5, 6}, dt), c10::Scalar(2.0), IValue(), false, IValue(), empty_out(dt)}});
    out.push_back({"dtype float64",
                   {make({4, 50}, dt), c10::Scalar(2.0), IValue(std::vector<int64_t>{1}), false,
                    IValue(static_cast<int64_t>(at::kDouble)), empty_out(at::kDouble)}});
    out.push_back({"inf/nan",
                   {make({4, 4}, dt, 2), c10::Scalar(2.0), IValue(std::vector<int64_t>{1}), false, IValue(),
                    empty_out(dt)}});
    out.push_back({"empty, ord inf over every dim (error)",
                   {make({0, 3}, dt), c10::Scalar(inf), IValue(), false, IValue(), empty_out(dt)}});
    return out;
  };
}

// all.all_out / any.all_out: (self, *, out)
SampleFn all_any_full_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const ScalarType od = dt == at::kByte ? at::kByte : at::kBool;
    auto add = [&](const std::string& n, at::Tensor t) { out.push_back({n, {t, empty_out(od)}}); };
    add("mixed", make({4, 5, 6}, dt));
    add("all non-zero", make({4, 5, 6}, dt, 1).to(dt));
    add("all zero", at::zeros({3, 4}, at::TensorOptions().dtype(dt)));
    add("0-d", make({}, dt));
    add("empty", make({0, 3}, dt));
    add("transposed", make_t(6, 5, dt, 1));
    add("large, one zero", at::ones({256, 1024}, at::TensorOptions().dtype(dt)).index_put_({5, 7}, 0));
    return out;
  };
}

// histc.out: (self, int bins, Scalar min, Scalar max, *, out); bounds that
// every dtype holds exactly.
SampleFn histc_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor t, int64_t bins, double lo, double hi) {
      out.push_back({n, {t, bins, c10::Scalar(lo), c10::Scalar(hi), empty_out(dt)}});
    };
    add("bins 10 over [-3, 3]", make({1000}, dt), 10, -3, 3);
    // Integer inputs take the bounds truncated (as CUDA), which a float64
    // reference does not know: integer bounds for them.
    add("values outside the bounds", make({4, 50}, dt), 7, -1, is_float(dt) ? 1.5 : 2);
    add("min == max: the data's range", make({300}, dt), 6, 0, 0);
    add("integer ids, max in the last bin", make({64}, dt, 1), 9, 1, 9);
    add("0-d", make({}, dt), 4, -3, 3);
    add("empty", make({0}, dt), 5, 0, 0);
    add("transposed", make_t(20, 30, dt), 8, -2, 2);
    add("large", make({256, 1024}, dt), 100, -3, 3);
    add("bins 0 (error)", make({10}, dt), 0, 0, 1);
    add("min > max (error)", make({10}, dt), 4, 2, 1);
    return out;
  };
}

}  // namespace

void add_reduction_samples(SampleTable& t) {
  using R = OutRule;
  t.samples("aten::sum.IntList_out", reduce_dims(true, true, R::int64_if_int, true, true));
  t.samples("aten::mean.out", error_cases_for(reduce_dims(true, true, R::same, true, false),
                                              [](ScalarType dt) { return at::isIntegralType(dt, true); }));
  // Products of many values overflow or lose all precision: prod's
  // samples stay near 1 (floats in [0.5, 1.5], integers in {-1, 0, 1}).
  t.samples("aten::prod.int_out", [](ScalarType dt) {
    auto out = reduce_dims(false, true, R::int64_if_int, false, true)(dt);
    for (auto& smp : out) {
      at::Tensor t = smp.args[0].toTensor();
      smp.args[0] = at::isFloatingType(dt) ? (t / 6 + 1) : t.remainder(3) - 1;
      // Half types: ATen accumulates long products in reduced precision
      // (a few ulps from the exact product); keep reductions short there.
      const int64_t keep = (dt == at::kHalf || dt == at::kBFloat16) ? 32 : 256;
      if (at::isFloatingType(dt) && t.dim() == 2 && t.size(1) > 1000) {
        at::Tensor n = smp.args[0].toTensor().narrow(1, 0, keep);
        if (t.size(0) > 64 && keep == 32) n = n.narrow(0, 0, 32);
        smp.args[0] = n;
      }
    }
    return out;
  });
  t.samples("aten::amax.out", reduce_extreme_list());
  t.samples("aten::amin.out", reduce_extreme_list());
  t.samples("aten::max.dim_max", reduce_with_indices());
  t.samples("aten::min.dim_min", reduce_with_indices());
  t.samples("aten::argmax.out", reduce_arg());
  t.samples("aten::argmin.out", reduce_arg());
  t.samples("aten::var.correction_out", reduce_var());
  t.samples("aten::std.correction_out", reduce_var());
  t.samples("aten::norm.out", reduce_norm());
  t.samples("aten::all.dims_out", reduce_dims(true, false, R::boolean, true, true));
  t.samples("aten::any.dims_out", reduce_dims(true, false, R::boolean, true, true));
  t.samples("aten::all.out", reduce_dims(false, false, R::boolean, false, true));
  t.samples("aten::any.out", reduce_dims(false, false, R::boolean, false, true));
  t.samples("aten::linalg_vector_norm.out", vector_norm_spec());
  t.samples("aten::all.all_out", all_any_full_spec());
  t.samples("aten::any.all_out", all_any_full_spec());
  t.samples("aten::histc.out", histc_spec());
  t.samples("aten::cumsum.out", cumsum_spec());
  // CUDA's histc, which the CPU's has no integer kernel for: ATen's
  // float64 histc of the converted values (exact for the samples'
  // integers), its counts in the input's dtype.
  t.reference("aten::histc.out", [](const std::vector<IValue>& a) {
    const at::Tensor x = a[0].toTensor();
    return std::vector<at::Tensor>{
        at::histc(x.to(at::kDouble), a[1].toInt(), a[2].toScalar(), a[3].toScalar()).to(x.scalar_type())};
  });
}

}  // namespace npub::conformance
