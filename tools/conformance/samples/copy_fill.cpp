// Copies, fills and factories: copy_, fill_, zero_, clone, arange, and the
// triangle copies triu/tril.
#include "sample_kit.h"

namespace npub::conformance {
namespace {

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

}  // namespace

void add_copy_fill_samples(SampleTable& t) {
  t.samples("aten::copy_", copy_spec());
  t.samples("aten::fill_.Scalar", fill_spec());
  t.samples("aten::arange.start_out", arange_spec());
  t.samples("aten::zero_", zero_spec());
  t.samples("aten::clone", clone_spec());
  t.samples("aten::triu.out", triangle_spec());
  t.samples("aten::tril.out", triangle_spec());
}

}  // namespace npub::conformance
