// Elementwise ops of two or three operands: arithmetic, comparisons, logical
// and bitwise ops (self, other, [extra...], out), their Scalar forms, and
// where, masked_fill, clamp, addcmul/addcdiv and lerp.
#include "sample_kit.h"

#include <limits>

namespace npub::conformance {
namespace {

// The smallest value of an integer dtype, -1 and 7.
at::Tensor int_min_and_friends(ScalarType dt) {
  const int64_t lo =
      dt == at::kInt ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
  return at::tensor(std::vector<int64_t>{lo, -1, 7}, at::TensorOptions().dtype(at::kLong)).to(dt);
}

struct BinarySpec {
  std::vector<IValue> extra;  // arguments between `other` and `out`
  OutRule rule = OutRule::same;
  int other_kind = 0;    // value kind of `other` for integer dtypes
  bool specials = true;  // inf/nan samples for floating dtypes
  bool mixed = true;     // mixed-dtype (zero-dim) samples
};

std::vector<Sample> binary_samples(ScalarType dt, const BinarySpec& s) {
  std::vector<Sample> out;
  const int ok = at::isIntegralType(dt, true) ? s.other_kind : 0;
  auto add = [&](const std::string& name, at::Tensor a, at::Tensor b) {
    std::vector<IValue> args{a, b};
    for (const auto& e : s.extra) args.push_back(e);
    args.push_back(empty_out(out_dtype(s.rule, at::result_type(a, b))));
    out.push_back({name, args});
  };
  add("same shape", make({5, 7}, dt), make({5, 7}, dt, ok));
  add("broadcast [5,7] x [7]", make({5, 7}, dt), make({7}, dt, ok));
  add("broadcast [4,1,3] x [2,3]", make({4, 1, 3}, dt), make({2, 3}, dt, ok));
  add("0-d other", make({3, 4}, dt), make({}, dt, ok));
  add("both 0-d", make({}, dt), make({}, dt, ok));
  add("empty", make({0, 3}, dt), make({3}, dt, ok));
  add("transposed operands", make_t(6, 5, dt), make_t(6, 5, dt, ok));
  add("sliced operand", make_sliced(4, 6, dt), make({4, 6}, dt, ok));
  add("large", make({128, 1024}, dt), make({128, 1024}, dt, ok));
  if (is_float(dt) && s.specials) add("inf/nan/-0", make({4, 4}, dt, 2), make({4, 4}, dt, 2));
  if (s.mixed && dt != at::kBool && dt != at::kDouble) {
    add("mixed: 0-d float64 other", make({3, 4}, dt), make({}, at::kDouble, ok == 1 ? 1 : 0));
    if (is_float(dt)) add("mixed: int64 other", make({3, 4}, dt), make({3, 4}, at::kLong, 1));
  }
  return out;
}

SampleFn binary(BinarySpec s) {
  return [s](ScalarType dt) { return binary_samples(dt, s); };
}

// (self, Scalar other, out)
SampleFn binary_scalar(OutRule rule, std::vector<IValue> scalars) {
  return [rule, scalars](ScalarType dt) {
    std::vector<Sample> out;
    for (const IValue& sc : scalars) {
      for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{}, std::vector<int64_t>{0}}) {
        at::Tensor a = make(shape, dt);
        const ScalarType rt = at::result_type(a, sc.toScalar());
        out.push_back({"scalar " + std::to_string(sc.toScalar().toDouble()) + ", " +
                           std::to_string(shape.size()) + "-d self",
                       {a, sc, empty_out(out_dtype(rule, rt))}});
      }
      at::Tensor t = make_t(6, 5, dt);
      out.push_back({"scalar " + std::to_string(sc.toScalar().toDouble()) + ", transposed self",
                     {t, sc, empty_out(out_dtype(rule, at::result_type(t, sc.toScalar())))}});
    }
    return out;
  };
}

SampleFn where_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    // dt here is the condition's dtype (the dispatch dtype); values vary.
    for (ScalarType v : {at::kFloat, at::kLong, at::kBFloat16}) {
      out.push_back({std::string("values ") + c10::toString(v),
                     {make({5, 7}, dt), make({5, 7}, v), make({7}, v), empty_out(v)}});
      out.push_back({std::string("broadcast cond, ") + c10::toString(v),
                     {make({7}, dt), make({5, 7}, v), make({}, v), empty_out(v)}});
    }
    out.push_back(
        {"empty",
         {make({0, 3}, dt), make({0, 3}, at::kFloat), make({3}, at::kFloat), empty_out(at::kFloat)}});
    return out;
  };
}

SampleFn masked_fill_spec(bool inplace) {
  return [inplace](ScalarType dt) {
    std::vector<Sample> out;
    const IValue value = is_float(dt)      ? IValue(c10::Scalar(-2.5))
                         : dt == at::kBool ? IValue(c10::Scalar(true))
                                           : IValue(c10::Scalar(int64_t{7}));
    auto add = [&](const std::string& n, at::Tensor self, at::Tensor mask) {
      out.push_back({n, {self, mask, value}});
    };
    add("same shape", make({5, 7}, dt), make({5, 7}, at::kBool));
    add("broadcast mask", make({5, 7}, dt), make({7}, at::kBool));
    add("0-d", make({}, dt), make({}, at::kBool));
    add("empty", make({0, 4}, dt), make({4}, at::kBool));
    add("large", make({256, 256}, dt), make({256, 256}, at::kBool));
    if (!inplace) add("transposed self", make_t(6, 5, dt), make({6, 5}, at::kBool));
    if (!inplace) add("self broadcast to the mask", make({5}, dt), make({3, 5}, at::kBool));
    return out;
  };
}

SampleFn clamp_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    auto sc = [&](double v) {
      return fl ? IValue(c10::Scalar(v)) : IValue(c10::Scalar(static_cast<int64_t>(v)));
    };
    for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{}, std::vector<int64_t>{0}}) {
      out.push_back({"min and max", {make(shape, dt), sc(-1), sc(2), empty_out(dt)}});
      out.push_back({"min only", {make(shape, dt), sc(0), IValue(), empty_out(dt)}});
      out.push_back({"max only", {make(shape, dt), IValue(), sc(1), empty_out(dt)}});
    }
    out.push_back({"min > max", {make({4, 4}, dt), sc(2), sc(-1), empty_out(dt)}});
    out.push_back({"transposed", {make_t(6, 5, dt), sc(-1), sc(1), empty_out(dt)}});
    if (fl) out.push_back({"nan/inf", {make({4, 4}, dt, 2), sc(-1), sc(1), empty_out(dt)}});
    out.push_back({"no bounds (error)", {make({3}, dt), IValue(), IValue(), empty_out(dt)}});
    return out;
  };
}

SampleFn addc_spec(bool div) {
  return [div](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    const IValue v = fl ? IValue(c10::Scalar(0.5)) : IValue(c10::Scalar(int64_t{2}));
    auto add = [&](const std::string& n, at::Tensor s, at::Tensor a, at::Tensor b, IValue value) {
      out.push_back({n, {s, a, b, value, empty_out(dt)}});
    };
    add("same shape", make({5, 7}, dt), make({5, 7}, dt), make({5, 7}, dt, div ? 1 : 0), v);
    add("broadcast", make({7}, dt), make({5, 7}, dt), make({5, 1}, dt, div ? 1 : 0), v);
    add("0-d", make({}, dt), make({}, dt), make({}, dt, div ? 1 : 0), v);
    add("empty", make({0, 3}, dt), make({0, 3}, dt), make({3}, dt, div ? 1 : 0), v);
    add("value 1", make({4, 4}, dt), make({4, 4}, dt), make({4, 4}, dt, div ? 1 : 0),
        IValue(c10::Scalar(int64_t{1})));
    add("large", make({128, 512}, dt), make({128, 512}, dt), make({128, 512}, dt, div ? 1 : 0), v);
    return out;
  };
}

SampleFn lerp_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (double w : {0.25, 0.75, -0.5, 1.5}) {
      out.push_back({"weight " + std::to_string(w),
                     {make({5, 7}, dt), make({5, 7}, dt), IValue(c10::Scalar(w)), empty_out(dt)}});
    }
    out.push_back({"broadcast", {make({5, 7}, dt), make({7}, dt), IValue(c10::Scalar(0.3)), empty_out(dt)}});
    out.push_back({"0-d", {make({}, dt), make({}, dt), IValue(c10::Scalar(0.3)), empty_out(dt)}});
    return out;
  };
}

}  // namespace

void add_binary_samples(SampleTable& t) {
  using R = OutRule;
  t.samples("aten::add.out", binary({{IValue(c10::Scalar(int64_t{1}))}}));
  t.samples("aten::sub.out", error_cases_for(binary({{IValue(c10::Scalar(int64_t{2}))}}),
                                             [](ScalarType dt) { return dt == at::kBool; }));
  t.samples("aten::mul.out", binary({}));
  t.samples("aten::div.out", binary({{}, R::float_if_int, 1}));
  t.samples("aten::div.out_mode", [](ScalarType dt) {
    std::vector<Sample> out;
    for (const char* mode : {"trunc", "floor"}) {
      BinarySpec s{{IValue(std::string(mode))}, R::same, 1, true, false};
      for (auto& smp : binary_samples(dt, s)) {
        smp.name = std::string(mode) + ": " + smp.name;
        out.push_back(smp);
      }
    }
    BinarySpec none{{IValue()}, R::float_if_int, 1, false, false};
    for (auto& smp : binary_samples(dt, none)) {
      smp.name = "None: " + smp.name;
      out.push_back(smp);
    }
    if (at::isIntegralType(dt, false))
      out.push_back({"integer division by zero (error)",
                     {make({3}, dt), at::zeros({3}, at::TensorOptions().dtype(dt)),
                      IValue(std::string("trunc")), empty_out(dt)}});
    // The one quotient that overflows: INT_MIN // -1 wraps, no trap. (Not
    // "trunc": ATen's own CPU kernel raises SIGFPE there.)
    if (dt == at::kInt || dt == at::kLong)
      out.push_back({"floor: INT_MIN by -1",
                     {int_min_and_friends(dt), at::full({3}, -1, at::TensorOptions().dtype(dt)),
                      IValue(std::string("floor")), empty_out(dt)}});
    return out;
  });
  t.samples("aten::remainder.Tensor_out", [](ScalarType dt) {
    auto out = binary({{}, R::same, 1})(dt);
    if (dt == at::kInt || dt == at::kLong)
      out.push_back(
          {"INT_MIN by -1",
           {int_min_and_friends(dt), at::full({3}, -1, at::TensorOptions().dtype(dt)), empty_out(dt)}});
    return out;
  });
  t.samples("aten::pow.Tensor_Tensor_out", [](ScalarType dt) {
    BinarySpec s{{}, R::same, 1, true, false};
    auto out = binary_samples(dt, s);
    if (at::isIntegralType(dt, false))  // small bases keep integer powers in range
      for (auto& smp : out) smp.args[1] = smp.args[1].toTensor().clamp(0, 3);
    return out;
  });
  t.samples("aten::pow.Tensor_Scalar_out",
            binary_scalar(R::same, {IValue(c10::Scalar(int64_t{2})), IValue(c10::Scalar(int64_t{3})),
                                    IValue(c10::Scalar(0.5)), IValue(c10::Scalar(int64_t{0}))}));
  t.samples("aten::maximum.out", binary({{}, R::same, 0, true, false}));
  t.samples("aten::minimum.out", binary({{}, R::same, 0, true, false}));
  for (const char* c : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    t.samples(std::string("aten::") + c + ".Tensor_out", binary({{}, R::boolean}));
    t.samples(std::string("aten::") + c + ".Scalar_out",
              binary_scalar(R::boolean, {IValue(c10::Scalar(int64_t{0})), IValue(c10::Scalar(1.5)),
                                         IValue(c10::Scalar(true))}));
  }
  t.samples("aten::logical_and.out", binary({{}, R::boolean}));
  t.samples("aten::logical_or.out", binary({{}, R::boolean}));
  // bitwise: integer and bool dtypes only (no inf/nan; a float64 `other` is an error in ATen)
  for (const char* b : {"bitwise_and", "bitwise_or", "bitwise_xor"}) {
    t.samples(std::string("aten::") + b + ".Tensor_out", binary({{}, R::same, 0, false, false}));
    t.samples(std::string("aten::") + b + ".Scalar_out",
              binary_scalar(R::same, {IValue(c10::Scalar(int64_t{5})), IValue(c10::Scalar(true))}));
  }
  t.samples("aten::where.self_out", where_spec());
  t.samples("aten::masked_fill.Scalar", masked_fill_spec(false));
  t.samples("aten::masked_fill_.Scalar", masked_fill_spec(true));
  t.samples("aten::clamp.out", clamp_spec());
  t.samples("aten::addcmul.out", addc_spec(false));
  t.samples("aten::addcdiv.out", addc_spec(true));
  t.samples("aten::lerp.Scalar_out", lerp_spec());
  t.samples("aten::floor_divide.out", [](ScalarType dt) {
    auto out = binary_samples(dt, BinarySpec{{}, R::same, 1, true, false});
    if (at::isIntegralType(dt, false))
      out.push_back({"integer division by zero (error)",
                     {make({3}, dt), at::zeros({3}, at::TensorOptions().dtype(dt)), empty_out(dt)}});
    return out;
  });
}

}  // namespace npub::conformance
