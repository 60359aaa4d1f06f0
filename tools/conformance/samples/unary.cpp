// Elementwise ops of one tensor, (self, [extra...], out) and functional
// forms, and the activations' gradients.
#include "sample_kit.h"

namespace npub::conformance {
namespace {

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

}  // namespace

void add_unary_samples(SampleTable& t) {
  using R = OutRule;
  for (const char* u : {"neg", "abs", "sign", "floor", "ceil", "round"})
    t.samples(std::string("aten::") + u + ".out", unary(R::same));
  for (const char* u :
       {"exp", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "silu"})
    t.samples(std::string("aten::") + u + ".out", unary(R::float_if_int));
  t.samples("aten::logical_not.out", unary(R::boolean));
  t.samples("aten::isposinf.out", unary(R::boolean));
  t.samples("aten::isneginf.out", unary(R::boolean));
  t.samples("aten::bitwise_not.out", unary(R::same));
  // No inf/nan sample for gelu: ATen's vectorised erf returns nan at inf
  // where gelu(inf) = inf; the kernel keeps the mathematical value.
  t.samples("aten::gelu.out", [](ScalarType dt) {
    auto a = unary(R::same, {IValue(std::string("none"))}, false)(dt);
    auto b = unary(R::same, {IValue(std::string("tanh"))}, false)(dt);
    for (auto& s : b) s.name = "tanh: " + s.name;
    a.insert(a.end(), b.begin(), b.end());
    return a;
  });
  t.samples("aten::relu", unary_functional());
  t.samples("aten::relu_", unary_functional());
  t.samples("aten::isnan", unary_functional());
  t.samples("aten::gelu_backward.grad_input", [](ScalarType dt) {
    auto a = activation_backward_spec({IValue(std::string("none"))}, false)(dt);
    auto b = activation_backward_spec({IValue(std::string("tanh"))}, false)(dt);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  });
  t.samples("aten::threshold_backward.grad_input",
            activation_backward_spec({IValue(c10::Scalar(0.0))}, false));
  t.samples("aten::sigmoid_backward.grad_input", activation_backward_spec({}, true));
  t.samples("aten::tanh_backward.grad_input", activation_backward_spec({}, true));
  t.samples("aten::silu_backward.grad_input", activation_backward_spec({}, false));
}

}  // namespace npub::conformance
