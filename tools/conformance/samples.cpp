// Per-op sample specifications and the ATen reference library.
//
// Every op gets shapes that exercise the corners: 0-d, empty, broadcast,
// non-contiguous (transposed and strided slices) and large (the parallel
// path); values include negatives and zeros, and inf/nan for floating types
// where meaningful. Integer divisors avoid zero (a ZeroDivisionError sample
// checks that path separately) and integer exponents are non-negative.
#include "conformance.h"

#include <torch/csrc/autograd/autograd.h>

#include <array>
#include <cmath>

namespace npub::conformance {

namespace {

using at::ScalarType;
using c10::IValue;

bool is_float(ScalarType t) { return at::isFloatingType(t); }

// The seed stream of the samples being generated: seed_samples() restarts
// it for each (op, dtype), so a sample's data does not depend on what was
// generated before it (`--op NAME` tests the data of a full run).
uint64_t g_seed = 0;
uint64_t next_seed() { return g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL; }
at::Generator sample_generator() { return at::detail::createCPUGenerator(next_seed()); }

// Deterministic values for a dtype. `kind`: 0 general, 1 positive (non-zero
// divisors, exponents), 2 general with inf/nan/-0 sprinkled in.
at::Tensor make(at::IntArrayRef shape, ScalarType dt, int kind = 0) {
  at::Generator gen = at::detail::createCPUGenerator(next_seed());
  at::Tensor t;
  if (dt == at::kBool) {
    t = at::randint(0, 2, shape, gen, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
  } else if (is_float(dt)) {
    t = (at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble)) * 6 - 3);
    if (kind == 1) t = t.abs() + 0.25;
    t = t.to(dt);
    if (kind == 2 && t.numel() >= 8) {
      auto flat = t.view({-1});
      flat[0] = std::numeric_limits<double>::quiet_NaN();
      flat[1] = std::numeric_limits<double>::infinity();
      flat[2] = -std::numeric_limits<double>::infinity();
      flat[3] = 0.0;
      flat[4] = -0.0;
    }
  } else {
    const bool unsigned_t = dt == at::kByte;
    const int64_t lo = kind == 1 ? 1 : (unsigned_t ? 0 : -9);
    t = at::randint(lo, 10, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dt);
  }
  return t;
}

// A transposed (non-contiguous) tensor of logical shape [a, b].
at::Tensor make_t(int64_t a, int64_t b, ScalarType dt, int kind = 0) { return make({b, a}, dt, kind).t(); }
// A strided slice (every other column) of logical shape [a, b].
at::Tensor make_sliced(int64_t a, int64_t b, ScalarType dt, int kind = 0) {
  return make({a, 2 * b}, dt, kind).slice(1, 0, 2 * b, 2);
}

// The smallest value of an integer dtype, -1 and 7.
at::Tensor int_min_and_friends(ScalarType dt) {
  const int64_t lo =
      dt == at::kInt ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int64_t>::min();
  return at::tensor(std::vector<int64_t>{lo, -1, 7}, at::TensorOptions().dtype(at::kLong)).to(dt);
}

at::Tensor empty_out(ScalarType dt) { return at::empty({0}, at::TensorOptions().dtype(dt)); }

enum class OutRule { same, boolean, float_if_int, int64_if_int };
ScalarType out_dtype(OutRule rule, ScalarType result) {
  switch (rule) {
    case OutRule::boolean:
      return at::kBool;
    case OutRule::float_if_int:
      return at::isIntegralType(result, true) ? at::kFloat : result;
    case OutRule::int64_if_int:
      return at::isIntegralType(result, true) ? at::kLong : result;
    default:
      return result;
  }
}

// ---------------------------------------------------------------------------
// elementwise binary: (self, other, [extra...], out)
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// unary: (self, [extra...], out) and functional forms
// ---------------------------------------------------------------------------

std::vector<at::Tensor> unary_inputs(ScalarType dt) {
  std::vector<at::Tensor> v{make({5, 7}, dt), make({}, dt),          make({0}, dt),
                            make_t(6, 5, dt), make_sliced(4, 6, dt), make({256, 512}, dt)};
  if (is_float(dt)) v.push_back(make({4, 4}, dt, 2));
  return v;
}
const char* kUnaryNames[] = {"[5,7]", "0-d", "empty", "transposed", "sliced", "large", "inf/nan/-0"};

SampleFn unary(OutRule rule, std::vector<IValue> extra = {}, bool specials = true) {
  return [rule, extra, specials](ScalarType dt) {
    std::vector<Sample> out;
    auto ins = unary_inputs(dt);
    if (!specials && is_float(dt)) ins.pop_back();
    for (size_t i = 0; i < ins.size(); ++i) {
      std::vector<IValue> args{ins[i]};
      for (const auto& e : extra) args.push_back(e);
      args.push_back(empty_out(out_dtype(rule, dt)));
      out.push_back({kUnaryNames[i], args});
    }
    return out;
  };
}
SampleFn unary_functional() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto ins = unary_inputs(dt);
    for (size_t i = 0; i < ins.size(); ++i) out.push_back({kUnaryNames[i], {ins[i]}});
    return out;
  };
}

// The samples of `fn`, written as error cases ("(error)" in the name) for
// the dtypes ATen refuses the op for: the npu must reject them as invalid
// too, and only error cases may pass by both sides raising.
SampleFn error_cases_for(SampleFn fn, std::function<bool(ScalarType)> refused) {
  return [fn = std::move(fn), refused = std::move(refused)](ScalarType dt) {
    std::vector<Sample> out = fn(dt);
    if (refused(dt))
      for (Sample& sm : out) sm.name += " (error)";
    return out;
  };
}

// ---------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------

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

// _softmax.out / _log_softmax.out: (self, dim, half_to_float, out)
SampleFn softmax_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
        {{4, 7}, 1}, {{4, 7}, 0}, {{2, 3, 5}, 1}, {{2, 3, 5}, -1}, {{}, 0}, {{0, 5}, 1}, {{64, 1000}, 1}};
    for (const auto& [shape, dim] : cases)
      out.push_back({"shape " + std::to_string(shape.size()) + "-d dim " + std::to_string(dim),
                     {make(shape, dt), dim, false, empty_out(dt)}});
    out.push_back({"transposed", {make_t(6, 5, dt), int64_t{1}, false, empty_out(dt)}});
    if (dt == at::kFloat) {
      // Probabilities below the smallest normal float: ATen gives the subnormals.
      at::Tensor wide = at::tensor({0.0, -80.0, -88.0, -92.5, -100.0, -103.9, -104.5, -200.0}).to(dt);
      out.push_back({"subnormal results", {wide.repeat({3, 2}), int64_t{1}, false, empty_out(dt)}});
    }
    // No half_to_float sample: ATen's CPU kernels refuse it ("not supported on
    // CPU"), so there is no reference to judge the npu's result by.
    return out;
  };
}

// _softmax_backward_data.out / _log_softmax_backward_data.out:
// (grad_output, output, dim, input_dtype, out)
SampleFn softmax_backward_spec(bool log) {
  return [log](ScalarType dt) {
    std::vector<Sample> out;
    const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
        {{4, 7}, 1}, {{4, 7}, 0}, {{2, 3, 5}, 1}, {{64, 1000}, -1}};
    for (const auto& [shape, dim] : cases) {
      at::Tensor x = make(shape, dt);
      at::Tensor y = log ? at::_log_softmax(x, dim, false) : at::_softmax(x, dim, false);
      out.push_back({"dim " + std::to_string(dim) + " of " + std::to_string(shape.size()) + "-d",
                     {make(shape, dt), y, dim, static_cast<int64_t>(dt), empty_out(dt)}});
    }
    return out;
  };
}

// ---------------------------------------------------------------------------
// matrix products
// ---------------------------------------------------------------------------

SampleFn mm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor a, at::Tensor b) {
      out.push_back({n, {a, b, empty_out(dt)}});
    };
    add("[5,7] x [7,3]", make({5, 7}, dt), make({7, 3}, dt));
    add("empty m", make({0, 3}, dt), make({3, 4}, dt));
    add("empty k", make({3, 0}, dt), make({0, 4}, dt));
    add("transposed operands", make_t(9, 6, dt), make_t(6, 4, dt));
    add("large", make({130, 257}, dt), make({257, 65}, dt));
    add("shape mismatch (error)", make({3, 4}, dt), make({5, 6}, dt));
    return out;
  };
}
SampleFn bmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"[3,5,7] x [3,7,2]", {make({3, 5, 7}, dt), make({3, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"empty batch", {make({0, 5, 7}, dt), make({0, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"batch mismatch (error)", {make({2, 5, 7}, dt), make({3, 7, 2}, dt), empty_out(dt)}});
    out.push_back({"large", {make({4, 64, 96}, dt), make({4, 96, 33}, dt), empty_out(dt)}});
    out.push_back({"transposed batch2 (k^T)",
                   {make({3, 5, 7}, dt), make({3, 2, 7}, dt).transpose(1, 2), empty_out(dt)}});
    out.push_back(
        {"transposed batch1", {make({3, 7, 5}, dt).transpose(1, 2), make({3, 7, 2}, dt), empty_out(dt)}});
    return out;
  };
}
SampleFn addmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    auto sc = [&](double v) {
      return fl ? IValue(c10::Scalar(v)) : IValue(c10::Scalar(static_cast<int64_t>(v)));
    };
    out.push_back({"self [3] broadcast",
                   {make({3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back(
        {"beta 0.5 alpha 2",
         {make({4, 3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(fl ? 0.5 : 3), sc(2), empty_out(dt)}});
    out.push_back(
        {"beta 0", {make({4, 3}, dt), make({4, 5}, dt), make({5, 3}, dt), sc(0), sc(1), empty_out(dt)}});
    out.push_back(
        {"large", {make({96}, dt), make({64, 128}, dt), make({128, 96}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"linear: mat2 transposed",
                   {make({6}, dt), make({4, 5}, dt), make({6, 5}, dt).t(), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"both transposed",
                   {make({4, 6}, dt), make({5, 4}, dt).t(), make({6, 5}, dt).t(), sc(fl ? 0.5 : 2), sc(2),
                    empty_out(dt)}});
    return out;
  };
}
SampleFn baddbmm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool fl = is_float(dt);
    auto sc = [&](double v) {
      return fl ? IValue(c10::Scalar(v)) : IValue(c10::Scalar(static_cast<int64_t>(v)));
    };
    out.push_back(
        {"self broadcast",
         {make({1, 3}, dt), make({2, 4, 5}, dt), make({2, 5, 3}, dt), sc(1), sc(1), empty_out(dt)}});
    out.push_back({"beta 0.5 alpha 2",
                   {make({2, 4, 3}, dt), make({2, 4, 5}, dt), make({2, 5, 3}, dt), sc(fl ? 0.5 : 2), sc(2),
                    empty_out(dt)}});
    return out;
  };
}

// ---------------------------------------------------------------------------
// other elementwise
// ---------------------------------------------------------------------------

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

// copy_(self!, src, non_blocking): dst of dtype dt from sources of several dtypes.
SampleFn copy_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (ScalarType src :
         {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kByte, at::kBool}) {
      out.push_back(
          {std::string("from ") + c10::toString(src), {make({5, 7}, dt), make({5, 7}, src), false}});
    }
    out.push_back({"broadcast src", {make({5, 7}, dt), make({7}, dt), false}});
    out.push_back({"transposed dst", {make_t(6, 5, dt), make({6, 5}, dt), false}});
    out.push_back({"transposed src", {make({6, 5}, dt), make_t(6, 5, dt), false}});
    out.push_back({"0-d", {make({}, dt), make({}, dt), false}});
    out.push_back({"empty", {make({0, 3}, dt), make({0, 3}, dt), false}});
    out.push_back({"large", {make({512, 512}, dt), make({512, 512}, dt), false}});
    out.push_back({"not broadcastable (error)", {make({3}, dt), make({4}, dt), false}});
    return out;
  };
}
SampleFn arange_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const auto empty = [dt] { return at::empty({0}, at::TensorOptions().dtype(dt)); };
    auto add = [&](const std::string& n, c10::Scalar a, c10::Scalar b, c10::Scalar s) {
      out.push_back({n, {IValue(a), IValue(b), IValue(s), empty()}});
    };
    add("0..12", int64_t{0}, int64_t{12}, int64_t{1});
    add("-3..17 step 4", int64_t{-3}, int64_t{17}, int64_t{4});
    add("10..-5 step -3", int64_t{10}, int64_t{-5}, int64_t{-3});
    add("empty 5..5", int64_t{5}, int64_t{5}, int64_t{1});
    if (at::isFloatingType(dt)) {
      add("0..1 step 0.1", 0.0, 1.0, 0.1);
      add("-2.5..3.25 step 0.75", -2.5, 3.25, 0.75);
    }
    if (dt == at::kFloat || dt == at::kDouble || dt == at::kInt || dt == at::kLong)
      add("large 0..70000", int64_t{0}, int64_t{70000}, int64_t{1});
    else
      add("0..100", int64_t{0}, int64_t{100}, int64_t{1});
    add("step 0 (error)", int64_t{0}, int64_t{5}, int64_t{0});
    add("wrong sign (error)", int64_t{0}, int64_t{5}, int64_t{-1});
    return out;
  };
}
SampleFn fill_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (IValue v : {IValue(c10::Scalar(3)), IValue(c10::Scalar(-1.75)), IValue(c10::Scalar(true))}) {
      // A negative value does not fit uint8: ATen refuses it.
      const std::string error = dt == at::kByte && v.toScalar().toDouble() < 0 ? " (error)" : "";
      out.push_back({"[5,7]" + error, {make({5, 7}, dt), v}});
      out.push_back({"transposed" + error, {make_t(6, 5, dt), v}});
      out.push_back({"0-d" + error, {make({}, dt), v}});
    }
    return out;
  };
}
SampleFn zero_spec() {
  return [](ScalarType dt) {
    return std::vector<Sample>{{"[5,7]", {make({5, 7}, dt)}},
                               {"transposed", {make_t(6, 5, dt)}},
                               {"0-d", {make({}, dt)}},
                               {"empty", {make({0}, dt)}}};
  };
}
SampleFn clone_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto ins = unary_inputs(dt);
    for (size_t i = 0; i < ins.size(); ++i) out.push_back({kUnaryNames[i], {ins[i], IValue()}});
    return out;
  };
}

// ---------------------------------------------------------------------------
// plugin ops without an ATen counterpart
// ---------------------------------------------------------------------------

SampleFn rms_norm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"[2,3,16] gamma [16]", {make({2, 3, 16}, dt), make({16}, dt), IValue(1e-6)}});
    out.push_back({"[4,8] gamma [4,8]", {make({4, 8}, dt), make({4, 8}, dt), IValue(1e-5)}});
    out.push_back({"large [256,1024]", {make({256, 1024}, dt), make({1024}, dt), IValue(1e-6)}});
    out.push_back({"gamma mismatch (error)", {make({4, 8}, dt), make({7}, dt), IValue(1e-6)}});
    return out;
  };
}
// dy, self, gamma and a consistent rstd (float32, float64 for float64; ones in the normalised dims).
SampleFn rms_norm_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> gshape) {
      at::Tensor x = make(shape, dt);
      std::vector<int64_t> dims, rshape = shape;
      for (size_t d = shape.size() - gshape.size(); d < shape.size(); ++d) {
        dims.push_back(static_cast<int64_t>(d));
        rshape[d] = 1;
      }
      at::Tensor rstd = at::rsqrt(x.to(at::kDouble).pow(2).mean(dims, true) + 1e-6)
                            .to(dt == at::kDouble ? at::kDouble : at::kFloat);
      out.push_back({n, {make(shape, dt), x, make(gshape, dt), rstd}});
    };
    add("[2,3,16] gamma [16]", {2, 3, 16}, {16});
    add("[4,8] gamma [4,8]", {4, 8}, {4, 8});
    add("large [256,1024]", {256, 1024}, {1024});
    out.push_back({"rstd shape mismatch (error)",
                   {make({4, 8}, dt), make({4, 8}, dt), make({8}, dt),
                    at::ones({4}, at::TensorOptions().dtype(at::kFloat))}});
    return out;
  };
}
SampleFn silu_and_mul_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"[4,32]", {at::empty({4, 16}, at::TensorOptions().dtype(dt)), make({4, 32}, dt)}});
    out.push_back({"[2,3,64]", {at::empty({2, 3, 32}, at::TensorOptions().dtype(dt)), make({2, 3, 64}, dt)}});
    out.push_back(
        {"odd last dim (error)", {at::empty({4, 2}, at::TensorOptions().dtype(dt)), make({4, 5}, dt)}});
    return out;
  };
}

// ---------------------------------------------------------------------------
// NN ops
// ---------------------------------------------------------------------------

SampleFn layer_norm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> norm, bool w,
                   bool b) {
      std::vector<int64_t> ps(norm);
      out.push_back({n,
                     {make(shape, dt), IValue(norm), w ? IValue(make(ps, dt)) : IValue(),
                      b ? IValue(make(ps, dt)) : IValue(), IValue(1e-5)}});
    };
    add("[4,16] affine", {4, 16}, {16}, true, true);
    add("[2,3,8] over [3,8]", {2, 3, 8}, {3, 8}, true, true);
    add("no weight, no bias", {5, 7}, {7}, false, false);
    add("weight only", {5, 7}, {7}, true, false);
    add("large [512,1024]", {512, 1024}, {1024}, true, true);
    add("empty rows", {0, 8}, {8}, true, true);
    out.push_back({"shape mismatch (error)",
                   {make({4, 6}, dt), IValue(std::vector<int64_t>{5}), IValue(), IValue(), IValue(1e-5)}});
    return out;
  };
}

SampleFn layer_norm_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> norm, bool affine,
                   std::array<bool, 3> mask) {
      at::Tensor x = make(shape, dt);
      at::Tensor w = affine ? make(norm, dt) : at::Tensor(), b = affine ? make(norm, dt) : at::Tensor();
      auto fwd = at::native_layer_norm(x, norm, w, b, 1e-5);
      out.push_back({n,
                     {make(shape, dt), x, IValue(norm), std::get<1>(fwd), std::get<2>(fwd),
                      affine ? IValue(w) : IValue(), affine ? IValue(b) : IValue(),
                      IValue(c10::List<bool>({mask[0], mask[1], mask[2]}))}});
    };
    add("affine, all grads", {4, 16}, {16}, true, {true, true, true});
    add("no affine", {2, 3, 8}, {3, 8}, false, {true, false, false});
    add("only weight/bias grads", {6, 10}, {10}, true, {false, true, true});
    add("large", {256, 512}, {512}, true, {true, true, true});
    return out;
  };
}

// BatchNorm over (N, C, *): ranks 2 to 5, channels_last, training and
// eval, with and without affine parameters and running statistics, the
// half types also with float32 parameters (ATen's mixed-dtype rule).
struct BatchNormCase {
  std::string name;
  std::vector<int64_t> shape;
  bool affine, stats, training, channels_last, mixed;
};
std::vector<BatchNormCase> batch_norm_cases(ScalarType dt) {
  std::vector<BatchNormCase> c = {
      {"[16,6] train", {16, 6}, true, true, true, false, false},
      {"[4,3,5] eval", {4, 3, 5}, true, true, false, false, false},
      {"[4,3,5] train, no affine, no stats", {4, 3, 5}, false, false, true, false, false},
      {"[2,4,3,3] channels_last train", {2, 4, 3, 3}, true, true, true, true, false},
      {"[2,4,3,3] channels_last eval", {2, 4, 3, 3}, true, true, false, true, false},
      {"[2,3,2,3,2] train", {2, 3, 2, 3, 2}, true, true, true, false, false},
      {"large [16,8,24,24] train", {16, 8, 24, 24}, true, true, true, false, false}};
  if (dt == at::kHalf || dt == at::kBFloat16) {
    c.push_back({"float32 parameters, train", {4, 3, 5}, true, true, true, false, true});
    c.push_back({"float32 parameters, channels_last eval", {2, 4, 3, 3}, true, true, false, true, true});
  }
  return c;
}
struct BatchNormArgs {
  at::Tensor x, w, b, rm, rv;
};
BatchNormArgs batch_norm_args(const BatchNormCase& k, ScalarType dt) {
  const ScalarType pt = k.mixed ? at::kFloat : dt;
  BatchNormArgs a;
  a.x = make(k.shape, dt);
  if (k.channels_last)
    a.x = a.x.contiguous(k.shape.size() == 5 ? at::MemoryFormat::ChannelsLast3d
                                             : at::MemoryFormat::ChannelsLast);
  const int64_t ch = k.shape[1];
  if (k.affine) a.w = make({ch}, pt), a.b = make({ch}, pt);
  if (k.stats) a.rm = make({ch}, pt), a.rv = make({ch}, pt, 1);
  return a;
}
IValue opt(const at::Tensor& t) { return t.defined() ? IValue(t) : IValue(); }

// 0: native_batch_norm, 1: _native_batch_norm_legit (statistics given),
// 2: its .no_stats, 3: _native_batch_norm_legit_no_training.
SampleFn batch_norm_spec(int form) {
  return [form](ScalarType dt) {
    std::vector<Sample> out;
    for (const BatchNormCase& k : batch_norm_cases(dt)) {
      if ((form == 1 || form == 3) && !k.stats) continue;
      if ((form == 2 && k.stats) || (form == 3 && k.training)) continue;
      const BatchNormArgs a = batch_norm_args(k, dt);
      if (form == 2)
        out.push_back({k.name, {a.x, opt(a.w), opt(a.b), IValue(k.training), IValue(0.1), IValue(1e-5)}});
      else if (form == 3)
        out.push_back({k.name, {a.x, opt(a.w), opt(a.b), a.rm, a.rv, IValue(0.1), IValue(1e-5)}});
      else
        out.push_back(
            {k.name,
             {a.x, opt(a.w), opt(a.b), opt(a.rm), opt(a.rv), IValue(k.training), IValue(0.1), IValue(1e-5)}});
    }
    if (form == 0) {
      out.push_back(
          {"1-d input (error)",
           {make({5}, dt), IValue(), IValue(), IValue(), IValue(), IValue(true), IValue(0.1), IValue(1e-5)}});
      if (dt == at::kFloat)
        out.push_back({"float64 weight (error)",
                       {make({4, 3}, dt), make({3}, at::kDouble), IValue(), IValue(), IValue(), IValue(true),
                        IValue(0.1), IValue(1e-5)}});
    }
    return out;
  };
}

SampleFn batch_norm_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const BatchNormCase& k : batch_norm_cases(dt)) {
      if (!k.training && !k.stats) continue;
      const BatchNormArgs a = batch_norm_args(k, dt);
      auto fwd = at::native_batch_norm(a.x, a.w, a.b, a.rm.defined() ? a.rm.clone() : a.rm,
                                       a.rv.defined() ? a.rv.clone() : a.rv, k.training, 0.1, 1e-5);
      at::Tensor go = make(k.shape, dt);
      if (k.channels_last) go = go.contiguous(a.x.suggest_memory_format());
      const bool w_grad = k.affine;
      out.push_back(
          {k.name,
           {go, a.x, opt(a.w), opt(a.rm), opt(a.rv), k.training ? IValue(std::get<1>(fwd)) : IValue(),
            k.training ? IValue(std::get<2>(fwd)) : IValue(), IValue(k.training), IValue(1e-5),
            IValue(c10::List<bool>({true, w_grad, w_grad}))}});
    }
    return out;
  };
}

at::Tensor long_tensor(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).reshape(shape);
}
at::Tensor rand_index(std::vector<int64_t> shape, int64_t bound, ScalarType dt = at::kLong) {
  at::Generator gen = at::detail::createCPUGenerator(next_seed());
  return at::randint(0, std::max<int64_t>(bound, 1), shape, gen, at::TensorOptions().dtype(at::kLong)).to(dt);
}

SampleFn embedding_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor w, at::Tensor idx) {
      out.push_back({n, {w, idx, int64_t{-1}, false, false}});
    };
    add("[10,4] x [3,5]", make({10, 4}, dt), rand_index({3, 5}, 10));
    add("int32 indices", make({10, 4}, dt), rand_index({7}, 10, at::kInt));
    add("0-d index", make({10, 4}, dt), rand_index({}, 10));
    add("empty indices", make({10, 4}, dt), rand_index({0}, 10));
    add("large", make({1000, 64}, dt), rand_index({64, 32}, 1000));
    add("index out of range (error)", make({10, 4}, dt), long_tensor({1, 10}, {2}));
    add("negative index (error)", make({10, 4}, dt), long_tensor({-1}, {1}));
    return out;
  };
}

SampleFn embedding_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor idx = rand_index({3, 5}, 6);
    out.push_back({"plain", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{-1}, false}});
    out.push_back({"padding_idx 2", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{2}, false}});
    out.push_back({"scale_grad_by_freq", {make({3, 5, 4}, dt), idx, int64_t{6}, int64_t{-1}, true}});
    out.push_back(
        {"large", {make({64, 32, 16}, dt), rand_index({64, 32}, 500), int64_t{500}, int64_t{-1}, false}});
    return out;
  };
}

SampleFn nll_loss_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor t = rand_index({6}, 5);
    t[2] = -100;  // ignored
    for (int64_t red : {0, 1, 2}) {
      out.push_back({"[6,5] reduction " + std::to_string(red),
                     {make({6, 5}, dt), t, IValue(), red, int64_t{-100}, empty_out(dt), empty_out(dt)}});
      out.push_back(
          {"weighted, reduction " + std::to_string(red),
           {make({6, 5}, dt, 1), t, make({5}, dt, 1), red, int64_t{-100}, empty_out(dt), empty_out(dt)}});
    }
    out.push_back({"1-d input",
                   {make({5}, dt), long_tensor({3}, {}), IValue(), int64_t{1}, int64_t{-100}, empty_out(dt),
                    empty_out(dt)}});
    out.push_back({"target out of bounds (error)",
                   {make({2, 5}, dt), long_tensor({1, 7}, {2}), IValue(), int64_t{1}, int64_t{-100},
                    empty_out(dt), empty_out(dt)}});
    return out;
  };
}

SampleFn nll_loss_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor t = rand_index({6}, 5);
    t[1] = -100;
    for (int64_t red : {0, 1, 2}) {
      for (bool weighted : {false, true}) {
        at::Tensor x = make({6, 5}, dt);
        at::Tensor w = weighted ? make({5}, dt, 1) : at::Tensor();
        auto fwd = at::nll_loss_forward(x, t, w, red, -100);
        at::Tensor go = red == 0 ? make({6}, dt) : make({}, dt);
        out.push_back({std::string(weighted ? "weighted, " : "") + "reduction " + std::to_string(red),
                       {go, x, t, weighted ? IValue(w) : IValue(), red, int64_t{-100}, std::get<1>(fwd),
                        empty_out(dt)}});
      }
    }
    return out;
  };
}

SampleFn index_select_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 0", {make({6, 4}, dt), int64_t{0}, rand_index({5}, 6), empty_out(dt)}});
    out.push_back(
        {"dim 1, int32 index", {make({6, 4}, dt), int64_t{1}, rand_index({7}, 4, at::kInt), empty_out(dt)}});
    out.push_back({"dim -1 of 3-d", {make({2, 3, 5}, dt), int64_t{-1}, rand_index({4}, 5), empty_out(dt)}});
    out.push_back({"empty index", {make({6, 4}, dt), int64_t{0}, rand_index({0}, 6), empty_out(dt)}});
    out.push_back({"transposed self", {make_t(6, 5, dt), int64_t{0}, rand_index({3}, 6), empty_out(dt)}});
    out.push_back({"large", {make({2048, 64}, dt), int64_t{0}, rand_index({1024}, 2048), empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({6, 4}, dt), int64_t{0}, long_tensor({0, 6}, {2}), empty_out(dt)}});
    return out;
  };
}

SampleFn index_copy_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;  // distinct indices: ATen leaves duplicates' order open
    out.push_back({"dim 2 (a KV cache update)",
                   {make({2, 3, 8, 4}, dt), int64_t{2}, long_tensor({5, 1}, {2}), make({2, 3, 2, 4}, dt),
                    empty_out(dt)}});
    out.push_back(
        {"dim 0",
         {make({6, 4}, dt), int64_t{0}, long_tensor({0, 3, 5}, {3}), make({3, 4}, dt), empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({6, 4}, dt), int64_t{0}, long_tensor({6}, {1}), make({1, 4}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn gather_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 1", {make({4, 6}, dt), int64_t{1}, rand_index({4, 3}, 6), false, empty_out(dt)}});
    out.push_back({"dim 0, smaller index",
                   {make({4, 6}, dt), int64_t{0}, rand_index({2, 5}, 4), false, empty_out(dt)}});
    out.push_back({"3-d", {make({2, 3, 5}, dt), int64_t{2}, rand_index({2, 3, 7}, 5), false, empty_out(dt)}});
    out.push_back(
        {"large", {make({256, 512}, dt), int64_t{1}, rand_index({256, 256}, 512), false, empty_out(dt)}});
    out.push_back({"int32 index",
                   {make({4, 6}, dt), int64_t{1}, rand_index({4, 3}, 6, at::kInt), false, empty_out(dt)}});
    out.push_back({"0-d self", {make({}, dt), int64_t{0}, long_tensor({0}, {1}), false, empty_out(dt)}});
    out.push_back(
        {"0-d self and index", {make({}, dt), int64_t{0}, long_tensor({0}, {}), false, empty_out(dt)}});
    out.push_back(
        {"empty index", {make({4, 6}, dt), int64_t{1}, rand_index({4, 0}, 6), false, empty_out(dt)}});
    out.push_back({"index out of range (error)",
                   {make({4, 6}, dt), int64_t{1}, long_tensor({0, 6, 1, 2}, {2, 2}), false, empty_out(dt)}});
    return out;
  };
}

SampleFn scatter_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    // Unique targets per row for scatter (duplicates make its result order-dependent).
    at::Tensor perm = at::stack(
        {at::randperm(6, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 4),
         at::randperm(6, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 4)});
    out.push_back({"dim 1", {make({2, 6}, dt), int64_t{1}, perm, make({2, 4}, dt), empty_out(dt)}});
    at::Tensor perm0 = at::randperm(5, sample_generator(), at::TensorOptions().dtype(at::kLong))
                           .narrow(0, 0, 3)
                           .unsqueeze(1)
                           .expand({3, 4})
                           .contiguous();
    out.push_back({"dim 0", {make({5, 4}, dt), int64_t{0}, perm0, make({3, 4}, dt), empty_out(dt)}});
    out.push_back(
        {"index out of range (error)",
         {make({2, 6}, dt), int64_t{1}, long_tensor({0, 6}, {1, 2}), make({1, 2}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn scatter_add_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"dim 1 with duplicates",
                   {make({3, 5}, dt), int64_t{1}, rand_index({3, 8}, 5), make({3, 8}, dt), empty_out(dt)}});
    out.push_back(
        {"dim 0", {make({4, 3}, dt), int64_t{0}, rand_index({6, 3}, 4), make({6, 3}, dt), empty_out(dt)}});
    out.push_back(
        {"large",
         {make({64, 128}, dt), int64_t{1}, rand_index({64, 256}, 128), make({64, 256}, dt), empty_out(dt)}});
    out.push_back(
        {"index out of range (error)",
         {make({2, 6}, dt), int64_t{1}, long_tensor({-1, 0}, {1, 2}), make({1, 2}, dt), empty_out(dt)}});
    return out;
  };
}

SampleFn cat_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto list = [](std::vector<at::Tensor> v) { return IValue(c10::List<at::Tensor>(v)); };
    out.push_back({"dim 0", {list({make({2, 3}, dt), make({4, 3}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back(
        {"dim 1, three parts",
         {list({make({2, 3}, dt), make({2, 1}, dt), make({2, 5}, dt)}), int64_t{1}, empty_out(dt)}});
    out.push_back(
        {"dim -1 of 3-d", {list({make({2, 3, 4}, dt), make({2, 3, 2}, dt)}), int64_t{-1}, empty_out(dt)}});
    out.push_back({"skips 1-d empty", {list({make({0}, dt), make({2, 3}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back(
        {"transposed part", {list({make_t(3, 2, dt), make({3, 2}, dt)}), int64_t{0}, empty_out(dt)}});
    out.push_back({"large", {list({make({512, 256}, dt), make({512, 256}, dt)}), int64_t{1}, empty_out(dt)}});
    out.push_back(
        {"size mismatch (error)", {list({make({2, 3}, dt), make({2, 4}, dt)}), int64_t{0}, empty_out(dt)}});
    return out;
  };
}

SampleFn nonzero_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{}, std::vector<int64_t>{0, 3},
                       std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{300, 200}}) {
      at::Tensor t = make(shape, dt);
      if (dt != at::kBool) t = t * (make(shape, at::kBool).to(dt));  // plenty of zeros
      out.push_back({std::to_string(shape.size()) + "-d", {t}});
    }
    return out;
  };
}

// Values unique within each row of the last dim (a permutation per row),
// exactly representable in every dtype for rows of up to 200, so that
// top-k indices are unambiguous.
at::Tensor unique_values(std::vector<int64_t> shape, ScalarType dt) {
  const int64_t cols = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  std::vector<at::Tensor> r;
  for (int64_t i = 0; i < rows; ++i)
    r.push_back(at::randperm(cols, sample_generator(), at::TensorOptions().dtype(at::kLong)));
  at::Tensor p = at::stack(r).reshape(shape);
  if (at::isFloatingType(dt)) return (p.to(at::kDouble) * 0.25 - cols * 0.1).to(dt);
  if (dt == at::kByte) return p.to(dt);
  return (p - cols / 2).to(dt);
}

SampleFn topk_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor t, int64_t k, int64_t dim, bool largest) {
      out.push_back({n, {t, k, dim, largest, true, empty_out(dt), empty_out(at::kLong)}});
    };
    add("k 3 largest", unique_values({4, 9}, dt), 3, -1, true);
    add("k 2 smallest, dim 0 (transposed)", unique_values({4, 5}, dt).t(), 2, 0, false);
    add("k = size", unique_values({3, 6}, dt), 6, 1, true);
    add("k 0", unique_values({3, 6}, dt), 0, 1, true);
    add("large", unique_values({256, 200}, dt), 10, 1, true);
    add("k too large (error)", unique_values({3, 4}, dt), 5, 1, true);
    return out;
  };
}

SampleFn sort_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor t, int64_t dim, bool desc) {
      out.push_back({n, {t, IValue(true), dim, desc, empty_out(dt), empty_out(at::kLong)}});
    };
    add("ascending", make({4, 9}, dt), -1, false);
    add("descending, dim 0", make({5, 4}, dt), 0, true);
    add("ties are stable", at::zeros({3, 5}, at::TensorOptions().dtype(dt)), 1, false);
    add("0-d", make({}, dt), 0, false);
    add("transposed", make_t(6, 5, dt), 1, true);
    add("large", make({128, 300}, dt), 1, false);
    if (at::isFloatingType(dt)) add("nan last", make({4, 4}, dt, 2), 1, false);
    return out;
  };
}

IValue opt_list(std::vector<std::optional<at::Tensor>> v) {
  c10::List<std::optional<at::Tensor>> l;
  for (auto& t : v) l.push_back(t);
  return IValue(l);
}

SampleFn index_tensor_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor self, std::vector<std::optional<at::Tensor>> idx) {
      out.push_back({n, {self, opt_list(idx), empty_out(dt)}});
    };
    add("one long index", make({5, 4}, dt), {rand_index({3}, 5)});
    add("negative indices", make({5, 4}, dt), {long_tensor({-1, -5, 2}, {3})});
    add("index on dim 1", make({5, 4}, dt), {std::nullopt, rand_index({2, 3}, 4)});
    add("two broadcast indices", make({5, 4, 3}, dt), {rand_index({2, 1}, 5), rand_index({3}, 4)});
    add("non-adjacent indices", make({5, 4, 3}, dt), {rand_index({2}, 5), std::nullopt, rand_index({2}, 3)});
    add("bool mask", make({4, 5}, dt), {make({4, 5}, at::kBool)});
    add("bool mask on dim 0", make({4, 5}, dt), {make({4}, at::kBool)});
    add("int32 index", make({6}, dt), {rand_index({4}, 6, at::kInt)});
    add("index out of range (error)", make({5, 4}, dt), {long_tensor({5}, {1})});
    return out;
  };
}

SampleFn index_put_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, at::Tensor self, std::vector<std::optional<at::Tensor>> idx,
                   at::Tensor v, bool acc) {
      out.push_back({n, {self, opt_list(idx), v, acc}});
    };
    add("unique rows", make({5, 4}, dt),
        {at::randperm(5, sample_generator(), at::TensorOptions().dtype(at::kLong)).narrow(0, 0, 3)},
        make({3, 4}, dt), false);
    add("broadcast value", make({5, 4}, dt), {long_tensor({0, 2}, {2})}, make({4}, dt), false);
    add("accumulate with duplicates", make({5, 4}, dt), {long_tensor({1, 1, 3}, {3})}, make({3, 4}, dt),
        dt != at::kBool);
    add("two indices", make({5, 4}, dt), {long_tensor({0, 4}, {2}), long_tensor({1, 3}, {2})}, make({2}, dt),
        false);
    add("bool mask", make({4, 5}, dt), {make({4, 5}, at::kBool)}, make({}, dt), false);
    add("index out of range (error)", make({5, 4}, dt), {long_tensor({7}, {1})}, make({4}, dt), false);
    return out;
  };
}

SampleFn random_fill_spec(std::vector<std::vector<IValue>> params) {
  return [params](ScalarType dt) {
    std::vector<Sample> out;
    for (const auto& p : params) {
      std::vector<IValue> args{make({256, 256}, dt)};
      for (const auto& v : p) args.push_back(v);
      args.push_back(IValue());  // generator
      std::string name = "large, params";
      for (const auto& v : p) name += " " + std::to_string(v.toDouble());
      out.push_back({name, args});
      std::vector<IValue> small = args;
      small[0] = make({3, 5}, dt);
      out.push_back({"small", small});
    }
    return out;
  };
}

// Activation gradients: (grad_output, input-or-output, [extra...], grad_input).
SampleFn activation_backward_spec(std::vector<IValue> extra, bool from_output) {
  return [extra, from_output](ScalarType dt) {
    std::vector<Sample> out;
    for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{}, std::vector<int64_t>{0},
                       std::vector<int64_t>{128, 512}}) {
      at::Tensor x = make(shape, dt);
      if (from_output) x = at::sigmoid(x.to(at::kFloat)).to(dt);  // a value an output can take
      std::vector<IValue> args{make(shape, dt), x};
      for (const auto& e : extra) args.push_back(e);
      args.push_back(empty_out(dt));
      out.push_back({std::to_string(shape.size()) + "-d", args});
    }
    return out;
  };
}

SampleFn dropout_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"p 0.5 large", {make({256, 512}, dt), IValue(0.5), IValue(true)}});
    out.push_back({"p 0.1 large", {make({256, 512}, dt), IValue(0.1), IValue()}});
    out.push_back({"p 0.9", {make({64, 64}, dt), IValue(0.9), IValue(true)}});
    out.push_back({"p 0", {make({5, 7}, dt), IValue(0.0), IValue(true)}});
    out.push_back({"p 1", {make({5, 7}, dt), IValue(1.0), IValue(true)}});
    out.push_back({"not training", {make({5, 7}, dt), IValue(0.5), IValue(false)}});
    out.push_back({"0-d", {make({}, dt), IValue(0.5), IValue(true)}});
    out.push_back({"p 1.5 (error)", {make({5}, dt), IValue(1.5), IValue(true)}});
    return out;
  };
}

// native_dropout_backward(grad_output, mask, scale): kept and dropped
// elements with dropout's scales (1 / (1 - p), and 0 for p = 1).
SampleFn dropout_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"p 0.3", {make({64, 33}, dt), make({64, 33}, at::kBool), IValue(1 / 0.7)}});
    out.push_back({"p 0.5 3-d", {make({4, 5, 6}, dt), make({4, 5, 6}, at::kBool), IValue(2.0)}});
    out.push_back({"p 1", {make({5, 7}, dt), make({5, 7}, at::kBool), IValue(0.0)}});
    out.push_back({"0-d", {make({}, dt), make({}, at::kBool), IValue(2.0)}});
    out.push_back({"mask of another shape (error)", {make({5}, dt), make({4}, at::kBool), IValue(2.0)}});
    return out;
  };
}

// ---------------------------------------------------------------------------
// convolution and pooling
// ---------------------------------------------------------------------------

struct ConvCase {
  std::string name;
  std::vector<int64_t> x, w;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
  bool transposed = false;
  std::vector<int64_t> output_padding = {};  // zeros of the spatial rank when empty
  std::vector<int64_t> out_pad() const {
    return output_padding.empty() ? std::vector<int64_t>(x.size() - 2, 0) : output_padding;
  }
  int64_t out_channels() const { return transposed ? w[1] * groups : w[0]; }
};
std::vector<ConvCase> conv_cases() {
  return {{"3x3 pad 1", {2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
          {"stride 2, no bias", {1, 4, 9, 7}, {6, 4, 3, 3}, {2, 2}, {0, 0}, {1, 1}, 1, false},
          {"dilation 2, pad 2", {2, 2, 10, 10}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1, true},
          {"groups 2, 1x1", {2, 4, 5, 5}, {6, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2, true},
          {"depthwise", {1, 4, 6, 6}, {4, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, true},
          {"rectangular kernel", {1, 3, 7, 9}, {2, 3, 2, 4}, {1, 2}, {1, 0}, {1, 1}, 1, true},
          {"larger", {4, 16, 28, 28}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
          {"3-d", {2, 3, 5, 6, 4}, {4, 3, 3, 2, 3}, {1, 2, 1}, {1, 0, 1}, {1, 1, 1}, 1, true},
          {"3-d groups 2, dilation 2",
           {1, 4, 7, 6, 6},
           {6, 2, 2, 3, 2},
           {1, 1, 2},
           {0, 1, 0},
           {2, 1, 1},
           2,
           false},
          {"transposed stride 2", {2, 4, 5, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true, true, {1, 1}},
          {"transposed groups 2, dilation 2",
           {2, 4, 5, 6},
           {4, 3, 3, 2},
           {2, 1},
           {0, 1},
           {2, 2},
           2,
           false,
           true,
           {1, 0}},
          {"transposed 3-d",
           {1, 2, 3, 4, 3},
           {2, 3, 3, 3, 3},
           {2, 2, 2},
           {1, 1, 1},
           {1, 1, 1},
           1,
           true,
           true,
           {1, 0, 1}}};
}

SampleFn conv_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const ConvCase& c : conv_cases())
      out.push_back({c.name,
                     {make(c.x, dt), make(c.w, dt), c.bias ? IValue(make({c.out_channels()}, dt)) : IValue(),
                      IValue(c.stride), IValue(c.padding), IValue(c.dilation), c.transposed,
                      IValue(c.out_pad()), c.groups}});
    out.push_back(
        {"channel mismatch (error)",
         {make({1, 3, 5, 5}, dt), make({2, 4, 3, 3}, dt), IValue(), IValue(std::vector<int64_t>{1, 1}),
          IValue(std::vector<int64_t>{0, 0}), IValue(std::vector<int64_t>{1, 1}), false,
          IValue(std::vector<int64_t>{0, 0}), int64_t{1}}});
    return out;
  };
}

SampleFn conv_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (ConvCase c : conv_cases()) {
      // grad_weight sums N*OH*OW products: keep that in the hundreds so that
      // float32 summation order stays within tolerance.
      if (c.name == "larger") c.x = {2, 16, 14, 14};
      at::Tensor x = make(c.x, dt), w = make(c.w, dt);
      at::Tensor y =
          at::convolution(x, w, {}, c.stride, c.padding, c.dilation, c.transposed, c.out_pad(), c.groups);
      out.push_back(
          {c.name,
           {make(y.sizes().vec(), dt), x, w, IValue(c.stride), IValue(c.padding), IValue(c.dilation),
            c.transposed, IValue(c.out_pad()), c.groups, IValue(c10::List<bool>({true, true, c.bias}))}});
    }
    return out;
  };
}

SampleFn conv2d_bias_relu_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const ConvCase& c : conv_cases())
      if (c.x.size() == 4 && !c.transposed)
        out.push_back({c.name,
                       {make(c.x, dt), make(c.w, dt), make({c.w[0]}, dt), IValue(c.stride), IValue(c.padding),
                        IValue(c.dilation), c.groups}});
    return out;
  };
}

SampleFn max_pool_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> k,
                   std::vector<int64_t> s, std::vector<int64_t> p, std::vector<int64_t> d, bool ceil) {
      out.push_back({n,
                     {make(shape, dt), IValue(k), IValue(s), IValue(p), IValue(d), ceil, empty_out(dt),
                      empty_out(at::kLong)}});
    };
    add("2x2", {2, 3, 8, 8}, {2, 2}, {}, {0, 0}, {1, 1}, false);
    add("3x3 stride 2 pad 1", {1, 2, 9, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false);
    add("ceil_mode", {1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, true);
    add("dilation 2", {1, 1, 10, 10}, {3, 3}, {1, 1}, {0, 0}, {2, 2}, false);
    add("3-d input", {3, 6, 6}, {2, 2}, {}, {0, 0}, {1, 1}, false);
    add("large", {8, 64, 56, 56}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false);
    if (at::isFloatingType(dt)) add("nan propagates", {1, 1, 4, 4}, {2, 2}, {}, {0, 0}, {1, 1}, false);
    if (at::isFloatingType(dt)) out.back().args[0] = make({1, 1, 4, 4}, dt, 2);
    add("pad too large (error)", {1, 1, 6, 6}, {2, 2}, {}, {2, 2}, {1, 1}, false);
    return out;
  };
}

SampleFn max_pool_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> k,
                   std::vector<int64_t> s, std::vector<int64_t> p, bool ceil) {
      at::Tensor x = make(shape, dt);
      auto fwd = at::max_pool2d_with_indices(x, k, s, p, {1, 1}, ceil);
      out.push_back({n,
                     {make(std::get<0>(fwd).sizes().vec(), dt), x, IValue(k), IValue(s), IValue(p),
                      IValue(std::vector<int64_t>{1, 1}), ceil, std::get<1>(fwd), empty_out(dt)}});
    };
    add("2x2", {2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, false);
    add("overlapping 3x3 stride 1", {1, 2, 7, 7}, {3, 3}, {1, 1}, {1, 1}, false);
    add("ceil_mode", {1, 2, 7, 7}, {2, 2}, {2, 2}, {0, 0}, true);
    return out;
  };
}

SampleFn avg_pool_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> k,
                   std::vector<int64_t> s, std::vector<int64_t> p, bool ceil, bool include_pad, IValue div) {
      out.push_back(
          {n, {make(shape, dt), IValue(k), IValue(s), IValue(p), ceil, include_pad, div, empty_out(dt)}});
    };
    add("2x2", {2, 3, 8, 8}, {2, 2}, {}, {0, 0}, false, true, IValue());
    add("3x3 pad 1 include pad", {1, 2, 9, 9}, {3, 3}, {2, 2}, {1, 1}, false, true, IValue());
    add("3x3 pad 1 exclude pad", {1, 2, 9, 9}, {3, 3}, {2, 2}, {1, 1}, false, false, IValue());
    add("ceil_mode", {1, 2, 7, 7}, {2, 2}, {2, 2}, {1, 1}, true, true, IValue());
    add("divisor_override 3", {1, 2, 6, 6}, {2, 2}, {}, {0, 0}, false, true, IValue(int64_t{3}));
    add("divisor_override -2", {1, 1, 4, 4}, {2, 2}, {}, {0, 0}, false, true, IValue(int64_t{-2}));
    add("3-d input", {3, 6, 6}, {3, 3}, {3, 3}, {0, 0}, false, true, IValue());
    return out;
  };
}

SampleFn avg_pool_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    auto add = [&](const std::string& n, std::vector<int64_t> shape, std::vector<int64_t> k,
                   std::vector<int64_t> s, std::vector<int64_t> p, bool ceil, bool include_pad, IValue div) {
      at::Tensor x = make(shape, dt);
      std::optional<int64_t> d = div.isNone() ? std::nullopt : std::optional<int64_t>(div.toInt());
      at::Tensor y = at::avg_pool2d(x, k, s, p, ceil, include_pad, d);
      out.push_back({n,
                     {make(y.sizes().vec(), dt), x, IValue(k), IValue(s), IValue(p), ceil, include_pad, div,
                      empty_out(dt)}});
    };
    add("2x2", {2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, false, true, IValue());
    add("3x3 pad 1 exclude pad", {1, 2, 9, 9}, {3, 3}, {2, 2}, {1, 1}, false, false, IValue());
    add("ceil_mode", {1, 2, 7, 7}, {2, 2}, {2, 2}, {1, 1}, true, true, IValue());
    add("divisor_override 3", {1, 2, 6, 6}, {2, 2}, {2, 2}, {0, 0}, false, true, IValue(int64_t{3}));
    add("divisor_override -2", {1, 1, 4, 4}, {2, 2}, {2, 2}, {0, 0}, false, true, IValue(int64_t{-2}));
    return out;
  };
}

// ---------------------------------------------------------------------------
// the fused RNN cells
// ---------------------------------------------------------------------------

struct CellCase {
  std::string name;
  int64_t n, h;
  bool bias;
};
std::vector<CellCase> cell_cases() {
  return {{"with biases", 3, 4, true}, {"no biases", 2, 5, false}, {"larger", 64, 96, true}};
}

// LSTM gates [n, 4h] activated as the cell does: i, f, o sigmoid, g tanh.
at::Tensor lstm_workspace(const at::Tensor& gates) {
  auto c = gates.chunk(4, 1);
  return at::cat({c[0].sigmoid(), c[1].sigmoid(), c[2].tanh(), c[3].sigmoid()}, 1);
}

SampleFn lstm_cell_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases())
      out.push_back({c.name,
                     {make({c.n, 4 * c.h}, dt), make({c.n, 4 * c.h}, dt), make({c.n, c.h}, dt),
                      c.bias ? IValue(make({4 * c.h}, dt)) : IValue(),
                      c.bias ? IValue(make({4 * c.h}, dt)) : IValue()}});
    out.push_back({"gates of another hidden size (error)",
                   {make({2, 12}, dt), make({2, 8}, dt), make({2, 3}, dt), IValue(), IValue()}});
    return out;
  };
}

SampleFn lstm_cell_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases()) {
      at::Tensor gates = make({c.n, 4 * c.h}, dt), cx = make({c.n, c.h}, dt);
      at::Tensor ws = lstm_workspace(gates);
      auto a = ws.chunk(4, 1);
      at::Tensor cy = a[1] * cx + a[0] * a[2];
      out.push_back({c.name, {make({c.n, c.h}, dt), make({c.n, c.h}, dt), cx, cy, ws, c.bias}});
    }
    at::Tensor gates = make({3, 8}, dt), cx = make({3, 2}, dt);
    at::Tensor ws = lstm_workspace(gates);
    auto a = ws.chunk(4, 1);
    out.push_back({"no grad_hy", {IValue(), make({3, 2}, dt), cx, a[1] * cx + a[0] * a[2], ws, true}});
    out.push_back({"no grad_cy", {make({3, 2}, dt), IValue(), cx, a[1] * cx + a[0] * a[2], ws, false}});
    return out;
  };
}

SampleFn gru_cell_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases())
      out.push_back({c.name,
                     {make({c.n, 3 * c.h}, dt), make({c.n, 3 * c.h}, dt), make({c.n, c.h}, dt),
                      c.bias ? IValue(make({3 * c.h}, dt)) : IValue(),
                      c.bias ? IValue(make({3 * c.h}, dt)) : IValue()}});
    out.push_back(
        {"a 1-d hx (error)", {make({2, 9}, dt), make({2, 9}, dt), make({3}, dt), IValue(), IValue()}});
    return out;
  };
}

SampleFn gru_cell_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases()) {
      // [r, z, n, hx, hidden n-gate]: gates in their ranges, any hx and n-gate.
      at::Tensor rz = make({c.n, 2 * c.h}, dt).sigmoid(), n = make({c.n, c.h}, dt).tanh();
      at::Tensor ws = at::cat({rz, n, make({c.n, c.h}, dt), make({c.n, c.h}, dt)}, 1);
      out.push_back({c.name, {make({c.n, c.h}, dt), ws, c.bias}});
    }
    return out;
  };
}

// ---------------------------------------------------------------------------
// the ops of Hugging Face's default training paths (issue 28)
// ---------------------------------------------------------------------------

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

// _grouped_mm: (self, mat2, Tensor? offs, Tensor? bias, ScalarType? out_dtype), the result allocated by
// the kernel. Offsets leave an empty group and rows (or columns) past the last one.
SampleFn grouped_mm_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return out;
    auto offs = [](std::vector<int64_t> v) {
      return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(at::kInt);
    };
    auto add = [&](const std::string& n, at::Tensor a, at::Tensor b, IValue o) {
      out.push_back({n, {a, b, o, IValue(), IValue()}});
    };
    add("2d x 3d", make({37, 24}, dt), make({4, 24, 40}, dt), offs({5, 5, 20, 33}));
    add("2d x 3d, transposed mat2", make({37, 24}, dt), make({4, 40, 24}, dt).transpose(1, 2),
        offs({5, 5, 20, 37}));
    add("3d x 2d", make({4, 12, 24}, dt), make({24, 40}, dt), offs({10, 10, 25, 38}));
    add("2d x 2d (weight gradient)", make({12, 30}, dt), make({30, 16}, dt), offs({6, 6, 17, 30}));
    add("2d x 2d, transposed self", make({30, 12}, dt).t(), make({30, 16}, dt), offs({6, 6, 17, 24}));
    add("3d x 3d", make({3, 9, 24}, dt), make({3, 24, 5}, dt), IValue());
    add("large", make({512, 256}, dt), make({8, 256, 128}, dt),
        offs({64, 100, 200, 256, 300, 400, 450, 512}));
    add("offset past the rows (error)", make({10, 8}, dt), make({3, 8, 5}, dt), offs({4, 12, 12}));
    add("decreasing offsets (error)", make({10, 8}, dt), make({3, 8, 5}, dt), offs({4, 7, 3}));
    add("contraction mismatch (error)", make({10, 8}, dt), make({3, 9, 5}, dt), offs({1, 2, 3}));
    return out;
  };
}

// triu.out / tril.out: (self, diagonal, *, out)
SampleFn triangle_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (int64_t diag : {-2, 0, 3, 9})
      out.push_back({"[5,7] diagonal " + std::to_string(diag), {make({5, 7}, dt), diag, empty_out(dt)}});
    out.push_back({"batched", {make({2, 4, 3}, dt), int64_t{1}, empty_out(dt)}});
    out.push_back({"transposed", {make_t(6, 5, dt), int64_t{-1}, empty_out(dt)}});
    out.push_back({"empty", {make({0, 3}, dt), int64_t{0}, empty_out(dt)}});
    out.push_back({"large", {make({8, 128, 256}, dt), int64_t{0}, empty_out(dt)}});
    out.push_back({"1-d (error)", {make({5}, dt), int64_t{0}, empty_out(dt)}});
    return out;
  };
}

// random_.from: (self, int from, int? to, *, Generator? generator); judged by its properties.
SampleFn random_from_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool small = dt == at::kByte || dt == at::kChar || dt == at::kBool || dt == at::kBFloat16;
    const int64_t lo = dt == at::kByte || dt == at::kBool ? 0 : -5, hi = dt == at::kBool ? 2
                                                                         : small         ? 100
                                                                                         : 1000;
    out.push_back({"large, [" + std::to_string(lo) + ", " + std::to_string(hi) + ")",
                   {make({256, 256}, dt), lo, hi, IValue()}});
    out.push_back({"small", {make({3, 5}, dt), lo, hi, IValue()}});
    out.push_back({"from == to (error)", {make({4}, dt), int64_t{3}, int64_t{3}, IValue()}});
    return out;
  };
}

}  // namespace

void seed_samples(const std::string& key) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  g_seed = h;
}

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

const std::map<std::string, SampleFn>& sample_specs() {
  static const std::map<std::string, SampleFn> specs = [] {
    std::map<std::string, SampleFn> m;
    using R = OutRule;
    // copy and fill
    m["aten::copy_"] = copy_spec();
    // the gradient scaler (plugins/cann_like/src/amp.cpp)
    m["aten::_amp_foreach_non_finite_check_and_unscale_"] = amp_unscale_spec();
    m["aten::_amp_update_scale_"] = amp_update_scale_spec();
    m["aten::fill_.Scalar"] = fill_spec();
    m["aten::arange.start_out"] = arange_spec();
    m["aten::zero_"] = zero_spec();
    m["aten::clone"] = clone_spec();
    // binary
    m["aten::add.out"] = binary({{IValue(c10::Scalar(int64_t{1}))}});
    m["aten::sub.out"] = error_cases_for(binary({{IValue(c10::Scalar(int64_t{2}))}}),
                                         [](ScalarType dt) { return dt == at::kBool; });
    m["aten::mul.out"] = binary({});
    m["aten::div.out"] = binary({{}, R::float_if_int, 1});
    m["aten::div.out_mode"] = [](ScalarType dt) {
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
    };
    m["aten::remainder.Tensor_out"] = [](ScalarType dt) {
      auto out = binary({{}, R::same, 1})(dt);
      if (dt == at::kInt || dt == at::kLong)
        out.push_back(
            {"INT_MIN by -1",
             {int_min_and_friends(dt), at::full({3}, -1, at::TensorOptions().dtype(dt)), empty_out(dt)}});
      return out;
    };
    m["aten::pow.Tensor_Tensor_out"] = [](ScalarType dt) {
      BinarySpec s{{}, R::same, 1, true, false};
      auto out = binary_samples(dt, s);
      if (at::isIntegralType(dt, false))  // small bases keep integer powers in range
        for (auto& smp : out) smp.args[1] = smp.args[1].toTensor().clamp(0, 3);
      return out;
    };
    m["aten::pow.Tensor_Scalar_out"] =
        binary_scalar(R::same, {IValue(c10::Scalar(int64_t{2})), IValue(c10::Scalar(int64_t{3})),
                                IValue(c10::Scalar(0.5)), IValue(c10::Scalar(int64_t{0}))});
    m["aten::maximum.out"] = binary({{}, R::same, 0, true, false});
    m["aten::minimum.out"] = binary({{}, R::same, 0, true, false});
    for (const char* c : {"eq", "ne", "lt", "le", "gt", "ge"}) {
      m[std::string("aten::") + c + ".Tensor_out"] = binary({{}, R::boolean});
      m[std::string("aten::") + c + ".Scalar_out"] = binary_scalar(
          R::boolean, {IValue(c10::Scalar(int64_t{0})), IValue(c10::Scalar(1.5)), IValue(c10::Scalar(true))});
    }
    m["aten::logical_and.out"] = binary({{}, R::boolean});
    m["aten::logical_or.out"] = binary({{}, R::boolean});
    // bitwise: integer and bool dtypes only (no inf/nan; a float64 `other` is an error in ATen)
    for (const char* b : {"bitwise_and", "bitwise_or", "bitwise_xor"}) {
      m[std::string("aten::") + b + ".Tensor_out"] = binary({{}, R::same, 0, false, false});
      m[std::string("aten::") + b + ".Scalar_out"] =
          binary_scalar(R::same, {IValue(c10::Scalar(int64_t{5})), IValue(c10::Scalar(true))});
    }
    m["aten::where.self_out"] = where_spec();
    m["aten::masked_fill.Scalar"] = masked_fill_spec(false);
    m["aten::masked_fill_.Scalar"] = masked_fill_spec(true);
    m["aten::clamp.out"] = clamp_spec();
    m["aten::addcmul.out"] = addc_spec(false);
    m["aten::addcdiv.out"] = addc_spec(true);
    m["aten::lerp.Scalar_out"] = lerp_spec();
    // unary
    for (const char* u : {"neg", "abs", "sign", "floor", "ceil", "round"})
      m[std::string("aten::") + u + ".out"] = unary(R::same);
    for (const char* u : {"exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh",
                          "sigmoid", "erf", "silu"})
      m[std::string("aten::") + u + ".out"] = unary(R::float_if_int);
    m["aten::logical_not.out"] = unary(R::boolean);
    m["aten::isposinf.out"] = unary(R::boolean);
    m["aten::isneginf.out"] = unary(R::boolean);
    m["aten::bitwise_not.out"] = unary(R::same);
    // No inf/nan sample for gelu: ATen's vectorised erf returns nan at inf
    // where gelu(inf) = inf; the kernel keeps the mathematical value.
    m["aten::gelu.out"] = [](ScalarType dt) {
      auto a = unary(R::same, {IValue(std::string("none"))}, false)(dt);
      auto b = unary(R::same, {IValue(std::string("tanh"))}, false)(dt);
      for (auto& s : b) s.name = "tanh: " + s.name;
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    m["aten::relu"] = unary_functional();
    m["aten::relu_"] = unary_functional();
    m["aten::isnan"] = unary_functional();
    // reductions
    m["aten::sum.IntList_out"] = reduce_dims(true, true, R::int64_if_int, true, true);
    m["aten::mean.out"] = error_cases_for(reduce_dims(true, true, R::same, true, false),
                                          [](ScalarType dt) { return at::isIntegralType(dt, true); });
    // Products of many values overflow or lose all precision: prod's
    // samples stay near 1 (floats in [0.5, 1.5], integers in {-1, 0, 1}).
    m["aten::prod.int_out"] = [](ScalarType dt) {
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
    };
    m["aten::amax.out"] = reduce_extreme_list();
    m["aten::amin.out"] = reduce_extreme_list();
    m["aten::max.dim_max"] = reduce_with_indices();
    m["aten::min.dim_min"] = reduce_with_indices();
    m["aten::argmax.out"] = reduce_arg();
    m["aten::argmin.out"] = reduce_arg();
    m["aten::var.correction_out"] = reduce_var();
    m["aten::std.correction_out"] = reduce_var();
    m["aten::norm.out"] = reduce_norm();
    m["aten::all.dims_out"] = reduce_dims(true, false, R::boolean, true, true);
    m["aten::any.dims_out"] = reduce_dims(true, false, R::boolean, true, true);
    m["aten::all.out"] = reduce_dims(false, false, R::boolean, false, true);
    m["aten::any.out"] = reduce_dims(false, false, R::boolean, false, true);
    m["aten::linalg_vector_norm.out"] = vector_norm_spec();
    m["aten::all.all_out"] = all_any_full_spec();
    m["aten::any.all_out"] = all_any_full_spec();
    m["aten::histc.out"] = histc_spec();
    m["aten::_grouped_mm"] = grouped_mm_spec();
    m["aten::triu.out"] = triangle_spec();
    m["aten::tril.out"] = triangle_spec();
    m["aten::random_.from"] = random_from_spec();
    m["aten::floor_divide.out"] = [](ScalarType dt) {
      auto out = binary_samples(dt, BinarySpec{{}, R::same, 1, true, false});
      if (at::isIntegralType(dt, false))
        out.push_back({"integer division by zero (error)",
                       {make({3}, dt), at::zeros({3}, at::TensorOptions().dtype(dt)), empty_out(dt)}});
      return out;
    };
    m["aten::_index_put_impl_"] = [](ScalarType dt) {
      auto out = index_put_spec()(dt);
      for (Sample& smp : out) smp.args.push_back(false);  // unsafe
      return out;
    };
    m["aten::cumsum.out"] = cumsum_spec();
    m["aten::_softmax.out"] = softmax_spec();
    m["aten::_log_softmax.out"] = softmax_spec();
    m["aten::_softmax_backward_data.out"] = softmax_backward_spec(false);
    m["aten::_log_softmax_backward_data.out"] = softmax_backward_spec(true);
    // matrix products
    m["aten::mm.out"] = mm_spec();
    m["aten::bmm.out"] = bmm_spec();
    m["aten::addmm.out"] = addmm_spec();
    m["aten::baddbmm.out"] = baddbmm_spec();
    // NN and indexing
    m["aten::_thnn_fused_lstm_cell"] = lstm_cell_spec();
    m["aten::_thnn_fused_lstm_cell_backward_impl"] = lstm_cell_backward_spec();
    m["aten::_thnn_fused_gru_cell"] = gru_cell_spec();
    m["aten::_thnn_fused_gru_cell_backward"] = gru_cell_backward_spec();
    m["aten::native_layer_norm"] = layer_norm_spec();
    m["aten::native_layer_norm_backward"] = layer_norm_backward_spec();
    m["aten::native_batch_norm"] = batch_norm_spec(0);
    m["aten::_native_batch_norm_legit"] = batch_norm_spec(1);
    m["aten::_native_batch_norm_legit.no_stats"] = batch_norm_spec(2);
    m["aten::_native_batch_norm_legit_no_training"] = batch_norm_spec(3);
    m["aten::native_batch_norm_backward"] = batch_norm_backward_spec();
    m["aten::embedding"] = embedding_spec();
    m["aten::embedding_dense_backward"] = embedding_backward_spec();
    m["aten::nll_loss_forward.output"] = nll_loss_spec();
    m["aten::nll_loss_backward.grad_input"] = nll_loss_backward_spec();
    m["aten::index_select.out"] = index_select_spec();
    m["aten::index_copy.out"] = index_copy_spec();
    m["aten::gather.out"] = gather_spec();
    m["aten::scatter.src_out"] = scatter_spec();
    m["aten::scatter_add.out"] = scatter_add_spec();
    m["aten::cat.out"] = cat_spec();
    m["aten::native_dropout"] = dropout_spec();
    m["aten::native_dropout_backward"] = dropout_backward_spec();
    m["aten::gelu_backward.grad_input"] = [](ScalarType dt) {
      auto a = activation_backward_spec({IValue(std::string("none"))}, false)(dt);
      auto b = activation_backward_spec({IValue(std::string("tanh"))}, false)(dt);
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    m["aten::threshold_backward.grad_input"] = activation_backward_spec({IValue(c10::Scalar(0.0))}, false);
    m["aten::sigmoid_backward.grad_input"] = activation_backward_spec({}, true);
    m["aten::tanh_backward.grad_input"] = activation_backward_spec({}, true);
    m["aten::silu_backward.grad_input"] = activation_backward_spec({}, false);
    m["aten::uniform_"] = random_fill_spec({{IValue(0.0), IValue(1.0)}, {IValue(-2.0), IValue(3.0)}});
    m["aten::normal_"] = random_fill_spec({{IValue(0.0), IValue(1.0)}, {IValue(2.0), IValue(0.5)}});
    m["aten::bernoulli_.float"] = random_fill_spec({{IValue(0.3)}, {IValue(0.9)}});
    m["aten::exponential_"] = random_fill_spec({{IValue(1.0)}, {IValue(2.5)}});
    m["aten::index.Tensor_out"] = index_tensor_spec();
    m["aten::index_put_"] = index_put_spec();
    m["aten::nonzero"] = nonzero_spec();
    m["aten::topk.values"] = topk_spec();
    m["aten::sort.values_stable"] = sort_spec();
    m["aten::convolution_overrideable"] = conv_spec();
    m["aten::convolution_backward_overrideable"] = conv_backward_spec();
    m["aten::max_pool2d_with_indices.out"] = max_pool_spec();
    m["aten::max_pool2d_with_indices_backward.grad_input"] = max_pool_backward_spec();
    m["aten::avg_pool2d.out"] = avg_pool_spec();
    m["aten::avg_pool2d_backward.grad_input"] = avg_pool_backward_spec();
    // plugin ops
    m["cann_like::conv2d_bias_relu"] = conv2d_bias_relu_spec();
    m["mindspeed_like::npu_rms_norm"] = rms_norm_spec();
    m["mindspeed_like::npu_rms_norm_backward"] = rms_norm_backward_spec();
    m["vllm_like::silu_and_mul"] = silu_and_mul_spec();
    return m;
  }();
  return specs;
}

namespace {

// Mean and spread of a random fill against its distribution (6 sigma).
std::string check_moments(const at::Tensor& t, double mean, double sd, double lo, double hi) {
  const at::Tensor d = t.to(at::kDouble);
  if (d.numel() == 0) return "";
  if (d.min().item<double>() < lo || d.max().item<double>() > hi)
    return "values outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (d.numel() < 1000) return "";
  const double m = d.mean().item<double>(), s = d.std().item<double>();
  const double tol = 6 * sd / std::sqrt(static_cast<double>(d.numel())) + 1e-2 * std::fabs(sd);
  if (std::fabs(m - mean) > tol)
    return "mean " + std::to_string(m) + ", expected " + std::to_string(mean) + " +- " + std::to_string(tol);
  if (sd > 0 && std::fabs(s - sd) > 0.05 * sd)
    return "std " + std::to_string(s) + ", expected " + std::to_string(sd) + " +- 5%";
  return "";
}

}  // namespace

const std::map<std::string, PropertyFn>& property_checks() {
  static const std::map<std::string, PropertyFn> checks = {
      {"aten::uniform_",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         const double lo = a[1].toDouble(), hi = a[2].toDouble();
         if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes())) return "expected self back";
         return check_moments(got[0], (lo + hi) / 2, (hi - lo) / std::sqrt(12.0), lo, hi);
       }},
      {"aten::normal_",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes())) return "expected self back";
         return check_moments(got[0], a[1].toDouble(), a[2].toDouble(), -1e30, 1e30);
       }},
      {"aten::bernoulli_.float",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         const double p = a[1].toDouble();
         if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes())) return "expected self back";
         const at::Tensor d = got[0].to(at::kDouble);
         if (!d.eq(0).logical_or(d.eq(1)).all().item<bool>()) return "values other than 0 and 1";
         return check_moments(got[0], p, std::sqrt(p * (1 - p)), 0, 1);
       }},
      {"aten::exponential_",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         // Exp(lambda): mean and standard deviation 1 / lambda, never 0
         // (ATen's exponential_ excludes it: vLLM's sampler divides by it).
         const double l = a[1].toDouble();
         if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes())) return "expected self back";
         if (!got[0].to(at::kDouble).gt(0).all().item<bool>()) return "a value <= 0";
         return check_moments(got[0], 1 / l, 1 / l, 0, 1e30);
       }},
      {"aten::random_.from",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         const double lo = static_cast<double>(a[1].toInt()), hi = static_cast<double>(a[2].toInt()) - 1;
         if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes())) return "expected self back";
         const at::Tensor d = got[0].to(at::kDouble);
         if (!at::equal(d, d.floor())) return "values that are not integers";
         // The discrete uniform distribution on [lo, hi].
         const double n = hi - lo + 1;
         return check_moments(got[0], (lo + hi) / 2, std::sqrt((n * n - 1) / 12), lo, hi);
       }},
      {"aten::native_dropout",
       [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
         const at::Tensor x = a[0].toTensor();
         const double p = a[1].toDouble();
         const bool train = a[2].isNone() || a[2].toBool();
         if (got.size() != 2) return "expected (output, mask)";
         const at::Tensor out = got[0], mask = got[1];
         if (mask.scalar_type() != at::kBool) return "mask is not bool";
         if (!out.sizes().equals(x.sizes()) || !mask.sizes().equals(x.sizes()))
           return "output or mask shape differs from input";
         if (out.scalar_type() != x.scalar_type()) return "output dtype differs from input";
         if (!train || p == 0) {
           if (!mask.all().item<bool>()) return "mask must be all true when not training or p == 0";
           if (!at::equal(out, x)) return "output must equal input when not training or p == 0";
           return "";
         }
         const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
         const at::Tensor expect = (x.to(at::kDouble) * mask.to(at::kDouble) * scale).to(x.scalar_type());
         if (!at::allclose(out.to(at::kDouble), expect.to(at::kDouble), 1e-3, 1e-6))
           return "output != input * mask / (1 - p)";
         const double n = static_cast<double>(x.numel());
         if (n >= 1000) {
           const double kept = mask.to(at::kDouble).sum().item<double>();
           const double mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
           if (std::fabs(kept - mean) > 6 * sd + 1)
             return "kept " + std::to_string(kept) + " of " + std::to_string(n) + " elements; expected " +
                    std::to_string(mean) + " +- 6 sigma (" + std::to_string(6 * sd) + ")";
         }
         return "";
       }},
  };
  return checks;
}

const std::map<std::string, ReferenceFn>& reference_library() {
  static const std::map<std::string, ReferenceFn> refs = {
      // The scaler's ops take float32 scalars (found_inf, inv_scale, the
      // scale), which the float64 reference run widens: ATen's CPU kernels
      // refuse those, so the reference runs them in float32 on the (widened)
      // gradients. Outputs: the written arguments in schema order.
      {"aten::_amp_foreach_non_finite_check_and_unscale_",
       [](const std::vector<IValue>& a) {
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
       }},
      {"aten::_amp_update_scale_",
       [](const std::vector<IValue>& a) {
         at::Tensor scale = a[0].toTensor(), tracker = a[1].toTensor(), found = a[2].toTensor();
         at::Tensor scale32 = scale.scalar_type() == at::kDouble ? scale.to(at::kFloat) : scale;
         at::Tensor found32 = found.scalar_type() == at::kDouble ? found.to(at::kFloat) : found;
         at::_amp_update_scale_(scale32, tracker, found32, a[3].toDouble(), a[4].toDouble(), a[5].toInt());
         // The return (self): with an aliased return the tool compares the
         // returns only; growth_tracker is checked in tests/python/test_fused_adam.py.
         return std::vector<at::Tensor>{scale32.to(scale.scalar_type())};
       }},
      // ATen's CPU backend has no *_overrideable kernels (they exist for
      // out-of-tree backends); the reference is the convolution it would run.
      {"aten::convolution_overrideable",
       [](const std::vector<IValue>& a) {
         at::Tensor bias = a[2].isNone() ? at::Tensor() : a[2].toTensor();
         return std::vector<at::Tensor>{
             at::convolution(a[0].toTensor(), a[1].toTensor(), bias, a[3].toIntVector(), a[4].toIntVector(),
                             a[5].toIntVector(), a[6].toBool(), a[7].toIntVector(), a[8].toInt())};
       }},
      {"aten::convolution_backward_overrideable",
       [](const std::vector<IValue>& a) {
         auto mask_list = a[9].toBoolList();
         std::array<bool, 3> mask{mask_list[0], mask_list[1], mask_list[2]};
         // grad_bias has the output's channels: grad_output's dim 1.
         const int64_t oc = a[0].toTensor().size(1);
         auto r = at::convolution_backward(
             a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), std::vector<int64_t>{oc}, a[3].toIntVector(),
             a[4].toIntVector(), a[5].toIntVector(), a[6].toBool(), a[7].toIntVector(), a[8].toInt(), mask);
         std::vector<at::Tensor> out;
         for (const at::Tensor& t : {std::get<0>(r), std::get<1>(r), std::get<2>(r)})
           if (t.defined()) out.push_back(t);
         return out;
       }},
      // ATen's CPU backend has no fused RNN cells (CUDA has them): the
      // reference is ATen's CPU LSTM cell on the summed gates (an identity
      // input weight, no hidden state), and for the backward ATen's own
      // derivative of the cell, _thnn_differentiable_lstm_cell_backward, on
      // gates recovered from the workspace (Note [The fused RNN cells'
      // workspace] in plugins/cann_like/src/rnn.cpp).
      {"aten::_thnn_fused_lstm_cell",
       [](const std::vector<IValue>& a) {
         at::Tensor ig = a[0].toTensor(), hg = a[1].toTensor(), cx = a[2].toTensor();
         at::Tensor ib = a[3].isNone() ? at::Tensor() : a[3].toTensor();
         at::Tensor hb = a[4].isNone() ? at::Tensor() : a[4].toTensor();
         if (cx.dim() != 2 || !ig.sizes().equals({cx.size(0), 4 * cx.size(1)}) ||
             !hg.sizes().equals(ig.sizes()))
           throw std::invalid_argument("gates must be [batch, 4 * hidden]");
         const int64_t gates = ig.size(1);
         at::Tensor eye = at::eye(gates, ig.options());
         auto [hy, cy] = at::lstm_cell(at::cat({ig, hg}, 1), {at::zeros_like(cx), cx}, at::cat({eye, eye}, 1),
                                       at::zeros({gates, cx.size(1)}, ig.options()), ib, hb);
         at::Tensor sum = ig + hg;
         if (ib.defined()) sum = sum + ib + hb;
         return std::vector<at::Tensor>{hy, cy, lstm_workspace(sum)};
       }},
      {"aten::_thnn_fused_lstm_cell_backward_impl",
       [](const std::vector<IValue>& a) {
         at::Tensor cx = a[2].toTensor(), cy = a[3].toTensor(), ws = a[4].toTensor();
         auto w = ws.chunk(4, 1);
         at::Tensor pre = at::cat({at::logit(w[0]), at::logit(w[1]), at::atanh(w[2]), at::logit(w[3])}, 1);
         auto opt = [](const IValue& v) { return v.isNone() ? std::optional<at::Tensor>() : v.toTensor(); };
         auto r = at::_thnn_differentiable_lstm_cell_backward(opt(a[0]), opt(a[1]), pre, at::zeros_like(pre),
                                                              {}, {}, cx, cy);
         std::vector<at::Tensor> out{std::get<0>(r), std::get<2>(r)};
         if (a[5].toBool()) out.push_back(std::get<0>(r).sum(0));
         return out;
       }},
      // GRU: ATen's CPU cell computes r = sigmoid(ir + hr), z = sigmoid(iz + hz),
      // n = tanh(in + r * hn), hy = (hx - n) * z + n; the backward is ATen's
      // _thnn_differentiable_gru_cell_backward on gates recovered from the
      // workspace [r, z, n, hx, hn].
      {"aten::_thnn_fused_gru_cell",
       [](const std::vector<IValue>& a) {
         at::Tensor ig = a[0].toTensor(), hg = a[1].toTensor(), hx = a[2].toTensor();
         if (hx.dim() != 2 || !ig.sizes().equals({hx.size(0), 3 * hx.size(1)}) ||
             !hg.sizes().equals(ig.sizes()))
           throw std::invalid_argument("gates must be [batch, 3 * hidden]");
         if (!a[3].isNone()) ig = ig + a[3].toTensor();
         if (!a[4].isNone()) hg = hg + a[4].toTensor();
         auto i = ig.chunk(3, 1), h = hg.chunk(3, 1);
         at::Tensor r = (i[0] + h[0]).sigmoid(), z = (i[1] + h[1]).sigmoid();
         at::Tensor n = (i[2] + r * h[2]).tanh();
         return std::vector<at::Tensor>{(hx - n) * z + n, at::cat({r, z, n, hx, h[2]}, 1)};
       }},
      {"aten::_thnn_fused_gru_cell_backward",
       [](const std::vector<IValue>& a) {
         at::Tensor ghy = a[0].toTensor();
         auto w = a[1].toTensor().chunk(5, 1);
         at::Tensor zeros = at::zeros_like(w[0]);
         at::Tensor ig = at::cat({at::logit(w[0]), at::logit(w[1]), at::atanh(w[2]) - w[0] * w[4]}, 1);
         at::Tensor hg = at::cat({zeros, zeros, w[4]}, 1);
         auto r = at::_thnn_differentiable_gru_cell_backward(ghy, ig, hg, w[3], {}, {});
         std::vector<at::Tensor> out{std::get<0>(r), std::get<1>(r), std::get<2>(r)};
         if (a[2].toBool()) {
           out.push_back(std::get<0>(r).sum(0));
           out.push_back(std::get<1>(r).sum(0));
         }
         return out;
       }},
      // CUDA's histc, which the CPU's has no integer kernel for: ATen's
      // float64 histc of the converted values (exact for the samples'
      // integers), its counts in the input's dtype.
      {"aten::histc.out",
       [](const std::vector<IValue>& a) {
         const at::Tensor x = a[0].toTensor();
         return std::vector<at::Tensor>{
             at::histc(x.to(at::kDouble), a[1].toInt(), a[2].toScalar(), a[3].toScalar())
                 .to(x.scalar_type())};
       }},
      // ATen's CPU _grouped_mm takes no float64 (the reference's dtype): one
      // mm per group on the CPU, offsets checked as the kernel checks them;
      // rows or columns past the last offset are zeros.
      {"aten::_grouped_mm",
       [](const std::vector<IValue>& a) {
         const at::Tensor x = a[0].toTensor(), w = a[1].toTensor();
         if (x.size(-1) != w.size(-2))
           throw std::invalid_argument("contraction dimension of mat_a and mat_b must match");
         std::vector<int64_t> b{0};
         if (!a[2].isNone()) {
           const at::Tensor o = a[2].toTensor().to(at::kLong).contiguous();
           for (int64_t i = 0; i < o.numel(); ++i) b.push_back(o.data_ptr<int64_t>()[i]);
         }
         const int64_t groups = static_cast<int64_t>(b.size()) - 1;
         const int64_t limit = x.dim() == 2 && w.dim() == 3   ? x.size(0)
                               : x.dim() == 3 && w.dim() == 2 ? w.size(1)
                                                              : x.size(1);
         for (size_t g = 1; g < b.size(); ++g)
           if (b[g] < b[g - 1] || b[g] > limit)
             throw std::invalid_argument("offs out of order or out of range");
         at::Tensor out;
         if (x.dim() == 2 && w.dim() == 3) {
           out = at::zeros({x.size(0), w.size(2)}, x.options());
           for (int64_t g = 0; g < groups; ++g)
             out.narrow(0, b[g], b[g + 1] - b[g]).copy_(at::mm(x.narrow(0, b[g], b[g + 1] - b[g]), w[g]));
         } else if (x.dim() == 3 && w.dim() == 2) {
           out = at::zeros({x.size(1), w.size(1)}, x.options());
           for (int64_t g = 0; g < groups; ++g)
             out.narrow(1, b[g], b[g + 1] - b[g]).copy_(at::mm(x[g], w.narrow(1, b[g], b[g + 1] - b[g])));
         } else if (x.dim() == 2) {
           out = at::zeros({groups, x.size(0), w.size(1)}, x.options());
           for (int64_t g = 0; g < groups; ++g)
             out[g].copy_(at::mm(x.narrow(1, b[g], b[g + 1] - b[g]), w.narrow(0, b[g], b[g + 1] - b[g])));
         } else {
           out = at::bmm(x, w);
         }
         return std::vector<at::Tensor>{out};
       }},
      {"cann_like::conv2d_bias_relu",
       [](const std::vector<IValue>& a) {
         return std::vector<at::Tensor>{
             at::relu(at::conv2d(a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), a[3].toIntVector(),
                                 a[4].toIntVector(), a[5].toIntVector(), a[6].toInt()))};
       }},
      {"mindspeed_like::npu_rms_norm",
       [](const std::vector<IValue>& a) {
         at::Tensor x = a[0].toTensor(), g = a[1].toTensor();
         const double eps = a[2].toDouble();
         if (g.dim() < 1 || g.dim() > x.dim() || !x.sizes().slice(x.dim() - g.dim()).equals(g.sizes()))
           throw std::invalid_argument("gamma must match the trailing shape of self");
         std::vector<int64_t> dims;
         for (int64_t d = x.dim() - g.dim(); d < x.dim(); ++d) dims.push_back(d);
         at::Tensor xf = x.to(at::kDouble);
         at::Tensor rstd = at::rsqrt(xf.pow(2).mean(dims, /*keepdim=*/true) + eps);
         // rstd in float32 whatever the input, float64 for float64 (as the kernel keeps it)
         return std::vector<at::Tensor>{(xf * rstd * g.to(at::kDouble)).to(x.scalar_type()),
                                        rstd.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)};
       }},
      // The gradients of y = x * rstd * gamma by LibTorch's autograd, in
      // float64, with the sample's rstd held fixed as the kernel's input.
      {"mindspeed_like::npu_rms_norm_backward",
       [](const std::vector<IValue>& a) {
         at::Tensor dy = a[0].toTensor(), x = a[1].toTensor(), g = a[2].toTensor(), rstd = a[3].toTensor();
         std::vector<int64_t> rshape = x.sizes().vec();
         for (int64_t d = x.dim() - g.dim(); d < x.dim(); ++d) rshape[static_cast<size_t>(d)] = 1;
         if (!rstd.sizes().equals(rshape)) throw std::invalid_argument("rstd shape");
         std::vector<int64_t> dims;
         for (int64_t d = x.dim() - g.dim(); d < x.dim(); ++d) dims.push_back(d);
         at::Tensor xd = x.to(at::kDouble).detach().requires_grad_(true);
         at::Tensor gd = g.to(at::kDouble).detach().requires_grad_(true);
         const int64_t n = g.numel();
         // rstd as a function of x (so dx includes its term), equal in value to the sample's.
         at::Tensor r = at::rsqrt(xd.pow(2).sum(dims, true) / double(n) + 1e-6);
         at::Tensor y = xd * r * gd;
         auto grads = torch::autograd::grad({y}, {xd, gd}, {dy.to(at::kDouble)});
         return std::vector<at::Tensor>{grads[0].to(x.scalar_type()), grads[1].to(g.scalar_type())};
       }},
      {"vllm_like::silu_and_mul",
       [](const std::vector<IValue>& a) {
         at::Tensor in = a[1].toTensor();
         const int64_t d = in.size(-1) / 2;
         if (in.size(-1) % 2 != 0) throw std::invalid_argument("input's last dimension must be even");
         return std::vector<at::Tensor>{at::silu(in.narrow(-1, 0, d)) * in.narrow(-1, d, d)};
       }},
  };
  return refs;
}

}  // namespace npub::conformance
