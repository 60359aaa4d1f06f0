// Softmax and log-softmax, layer norm and batch norm, forward and backward.
#include "sample_kit.h"

#include <array>

namespace npub::conformance {
namespace {

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

}  // namespace

void add_normalization_samples(SampleTable& t) {
  t.samples("aten::_softmax.out", softmax_spec());
  t.samples("aten::_log_softmax.out", softmax_spec());
  t.samples("aten::_softmax_backward_data.out", softmax_backward_spec(false));
  t.samples("aten::_log_softmax_backward_data.out", softmax_backward_spec(true));
  t.samples("aten::native_layer_norm", layer_norm_spec());
  t.samples("aten::native_layer_norm_backward", layer_norm_backward_spec());
  t.samples("aten::native_batch_norm", batch_norm_spec(0));
  t.samples("aten::_native_batch_norm_legit", batch_norm_spec(1));
  t.samples("aten::_native_batch_norm_legit.no_stats", batch_norm_spec(2));
  t.samples("aten::_native_batch_norm_legit_no_training", batch_norm_spec(3));
  t.samples("aten::native_batch_norm_backward", batch_norm_backward_spec());
}

}  // namespace npub::conformance
