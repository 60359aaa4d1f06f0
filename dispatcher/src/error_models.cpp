// The error model of each op the in-tree plugins serve (Note [The error
// model], error_bound.h): which kind of comparison, how many terms one
// output element sums and how large they are. An op that is not listed is
// compared host-calibrated. Entries that loosen the defaults say why.
#include <npubridge/dispatcher/error_bound.h>

#include <algorithm>
#include <map>

namespace npub::numerics {

namespace {

using Terms = std::function<int64_t(const CallArgs&)>;

ErrorModel exact(const char* why = "") {
  ErrorModel m;
  m.kind = ErrorKind::kExact;
  m.why = why;
  return m;
}

ErrorModel rounded(double ulps = 2, const char* why = "") {
  ErrorModel m;
  m.kind = ErrorKind::kRounded;
  m.ulps = ulps;
  m.why = why;
  return m;
}

ErrorModel same_dtype(double ulps, const char* why) {
  ErrorModel m;
  m.kind = ErrorKind::kSameDtype;
  m.ulps = ulps;
  m.why = why;
  return m;
}

ErrorModel accumulated(Magnitude magnitude, Terms terms, const char* why = "") {
  ErrorModel m;
  m.kind = ErrorKind::kAccumulated;
  m.ulps = 1;  // the final rounding (half an ulp, and the sum may sit on the boundary)
  m.magnitude = magnitude;
  m.terms = std::move(terms);
  m.why = why;
  return m;
}

// Terms of a reduction of `tensor` over the dims argument `dims`.
Terms reduced(const char* tensor, const char* dims) {
  return [=](const CallArgs& a) { return a.reduced(tensor, dims); };
}
// Terms along one dimension (an int argument) of `tensor`.
Terms along(const char* tensor, const char* dim) {
  return [=](const CallArgs& a) {
    const NpubValue d = a.get(dim);
    return d.tag == NPUB_VALUE_INT ? a.size(tensor, d.u.i) : a.numel(tensor);
  };
}
// Terms of a matrix product whose reduction dimension is the last of
// `tensor`, plus the added input when there is one.
Terms inner(const char* tensor, int64_t extra) {
  return [=](const CallArgs& a) { return a.size(tensor, -1) + extra; };
}

std::map<std::string, ErrorModel> build() {
  std::map<std::string, ErrorModel> m;
  // Values are moved, selected or compared, never computed.
  for (const char* op : {"aten::copy_",
                         "aten::fill_.Scalar",
                         "aten::zero_",
                         "aten::clone",
                         "aten::cat.out",
                         "aten::where.self_out",
                         "aten::masked_fill.Scalar",
                         "aten::masked_fill_.Scalar",
                         "aten::clamp.out",
                         "aten::maximum.out",
                         "aten::minimum.out",
                         "aten::neg.out",
                         "aten::abs.out",
                         "aten::sign.out",
                         "aten::floor.out",
                         "aten::ceil.out",
                         "aten::round.out",
                         "aten::relu",
                         "aten::relu_",
                         "aten::isnan",
                         "aten::logical_not.out",
                         "aten::logical_and.out",
                         "aten::logical_or.out",
                         "aten::amax.out",
                         "aten::amin.out",
                         "aten::max.dim_max",
                         "aten::min.dim_min",
                         "aten::argmax.out",
                         "aten::argmin.out",
                         "aten::all.dims_out",
                         "aten::any.dims_out",
                         "aten::all.out",
                         "aten::any.out",
                         "aten::all.all_out",
                         "aten::any.all_out",
                         "aten::histc.out",
                         "aten::triu.out",
                         "aten::tril.out",
                         "aten::index_select.out",
                         "aten::gather.out",
                         "aten::scatter.src_out",
                         "aten::index.Tensor_out",
                         "aten::nonzero",
                         "aten::topk.values",
                         "aten::sort.values_stable",
                         "aten::embedding",
                         "aten::max_pool2d_with_indices.out",
                         "aten::threshold_backward.grad_input"})
    m[op] = exact();
  for (const char* c : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    m[std::string("aten::") + c + ".Tensor_out"] = exact();
    m[std::string("aten::") + c + ".Scalar_out"] = exact();
  }
  m["aten::arange.start_out"] =
      same_dtype(0, "start + i * step is computed in float64 and rounded once, as ATen does");
  m["aten::div.out_mode"] = same_dtype(0, "");
  m["aten::floor_divide.out"] = same_dtype(0, "div with rounding_mode floor");
  m["aten::remainder.Tensor_out"] =
      same_dtype(1,
                 "a - b * floor(a / b) with the quotient in the op's dtype (as floor "
                 "division); 1 ulp for the fused or unfused final subtraction");

  // Elementwise arithmetic and elementary functions, rounded once.
  for (const char* op : {"aten::add.out", "aten::sub.out", "aten::mul.out", "aten::div.out", "aten::sqrt.out",
                         "aten::rsqrt.out", "aten::reciprocal.out", "aten::pow.Tensor_Tensor_out",
                         "aten::pow.Tensor_Scalar_out"})
    m[op] = rounded();
  for (const char* op :
       {"aten::exp.out", "aten::log.out", "aten::log1p.out", "aten::sin.out", "aten::cos.out",
        "aten::tanh.out", "aten::sigmoid.out", "aten::erf.out", "aten::silu.out"})
    m[op] =
        rounded(4, "float32 elementary functions (SLEEF, libm, the plugins' own) are accurate to a few ulps");
  // Compound elementwise ops: several roundings of intermediates as large as
  // the inputs, and cancellation in between.
  auto compound = [](int64_t roundings) {
    return accumulated(
        Magnitude::kScale, [=](const CallArgs&) { return roundings; },
        "compound elementwise op: a few roundings of intermediates as large as the inputs");
  };
  m["aten::addcmul.out"] = compound(3);
  m["aten::addcdiv.out"] = compound(3);
  m["aten::lerp.Scalar_out"] = compound(3);
  m["aten::gelu.out"] = compound(8);
  m["aten::gelu_backward.grad_input"] = compound(8);
  m["aten::sigmoid_backward.grad_input"] = compound(3);
  m["aten::tanh_backward.grad_input"] = compound(3);
  m["aten::silu_backward.grad_input"] = compound(8);
  m["aten::nll_loss_backward.grad_input"] = compound(3);
  m["vllm_like::silu_and_mul"] = compound(8);

  // Sums: K terms of the same sign after |.|, measured by the op on |inputs|.
  m["aten::sum.IntList_out"] = accumulated(Magnitude::kAbsInputs, reduced("self", "dim"));
  m["aten::mean.out"] = accumulated(Magnitude::kAbsInputs, reduced("self", "dim"));
  m["aten::cumsum.out"] = accumulated(Magnitude::kAbsInputs, along("self", "dim"));
  m["aten::mm.out"] = accumulated(Magnitude::kAbsInputs, inner("self", 0));
  m["aten::bmm.out"] = accumulated(Magnitude::kAbsInputs, inner("self", 0));
  // K: the whole contraction dimension (a 2-d x 2-d call's groups each sum part of it).
  m["aten::_grouped_mm"] = accumulated(Magnitude::kAbsInputs, inner("self", 0));
  m["aten::addmm.out"] = accumulated(Magnitude::kAbsInputs, inner("mat1", 1));
  m["aten::baddbmm.out"] = accumulated(Magnitude::kAbsInputs, inner("batch1", 1));
  // Adds in place into the output, one value at a time: ATen rounds to the
  // output's dtype after each add, so u is that dtype's.
  m["aten::scatter_add.out"] = accumulated(
      Magnitude::kAbsInputs, [](const CallArgs& a) { return along("src", "dim")(a) + 1; },
      "adds in place into the output, rounding to its dtype after each add (as ATen)");
  m["aten::scatter_add.out"].accumulates_in_output = true;
  m["aten::index_put_"] = accumulated(
      Magnitude::kAbsInputs,
      [](const CallArgs& a) -> int64_t {
        const NpubValue acc = a.get("accumulate");
        return acc.tag == NPUB_VALUE_BOOL && acc.u.i ? a.list_numel("indices") + 1 : 0;
      },
      "accumulate=True adds in place into self, rounding to its dtype after each add (as ATen)");
  m["aten::index_put_"].accumulates_in_output = true;
  m["aten::_index_put_impl_"] = m["aten::index_put_"];
  m["aten::embedding_dense_backward"] =
      accumulated(Magnitude::kAbsInputs, [](const CallArgs& a) { return a.numel("indices"); });
  m["aten::nll_loss_forward.output"] =
      accumulated(Magnitude::kAbsInputs, [](const CallArgs& a) { return 2 * a.numel("target"); });
  // Convolutions: Cin/groups * kh * kw terms forward, and the bias; the
  // gradients sum over Cout/groups * kh * kw (input) or N * OH * OW
  // (weight, bias) terms: K is the larger.
  m["aten::convolution_overrideable"] = accumulated(Magnitude::kAbsInputs, [](const CallArgs& a) {
    return a.numel("weight") / std::max<int64_t>(a.size("weight", 0), 1) + 1;
  });
  m["cann_like::conv2d_bias_relu"] = m["aten::convolution_overrideable"];
  m["aten::convolution_backward_overrideable"] = accumulated(Magnitude::kAbsInputs, [](const CallArgs& a) {
    const NpubValue g = a.get("groups");
    const int64_t groups = std::max<int64_t>(g.tag == NPUB_VALUE_INT ? g.u.i : 1, 1);
    const int64_t window =
        a.numel("weight") / std::max<int64_t>(a.size("weight", 0) * a.size("weight", 1), 1);
    const int64_t to_input = a.size("weight", 0) / groups * window;
    const int64_t to_weight = a.numel("grad_output") / std::max<int64_t>(a.size("grad_output", 1), 1);
    return std::max(to_input, to_weight);
  });
  auto window = [](const CallArgs& a) { return a.product("kernel_size"); };
  m["aten::avg_pool2d.out"] = accumulated(Magnitude::kAbsInputs, window);
  m["aten::avg_pool2d_backward.grad_input"] = accumulated(Magnitude::kAbsInputs, window);
  m["aten::max_pool2d_with_indices_backward.grad_input"] = accumulated(Magnitude::kAbsInputs, window);

  // Terms of one sign: the error is relative to the result.
  m["aten::prod.int_out"] = accumulated(Magnitude::kResult, along("self", "dim"));
  m["aten::norm.out"] = accumulated(Magnitude::kResult, reduced("self", "dim"));
  m["aten::linalg_vector_norm.out"] = accumulated(Magnitude::kResult, reduced("self", "dim"));
  m["aten::_softmax.out"] = accumulated(
      Magnitude::kResult, [](const CallArgs& a) { return along("self", "dim")(a) + 16; },
      "K terms of the sum, plus exp(x - max): its argument carries |x - max| * u of error (up to 12 u for "
      "the "
      "samples' values in [-3, 3]) and exp itself a few ulps");

  // Subtraction inside a reduction: bounded by the scale of the values.
  m["aten::var.correction_out"] = accumulated(Magnitude::kScale, reduced("self", "dim"));
  m["aten::std.correction_out"] = accumulated(Magnitude::kScale, reduced("self", "dim"));
  m["aten::_log_softmax.out"] = accumulated(Magnitude::kScale, along("self", "dim"));
  m["aten::_softmax_backward_data.out"] = accumulated(Magnitude::kScale, along("grad_output", "dim"));
  m["aten::_log_softmax_backward_data.out"] = accumulated(Magnitude::kScale, along("grad_output", "dim"));
  auto normalized = [](const char* input, const char* shape_arg) {
    return [=](const CallArgs& a) {
      const int64_t n = std::max<int64_t>(a.product(shape_arg), 1);
      return std::max(n, a.numel(input) / n) + 1;
    };
  };
  m["aten::native_layer_norm"] = accumulated(Magnitude::kScale, normalized("input", "normalized_shape"));
  m["aten::native_layer_norm_backward"] =
      accumulated(Magnitude::kScale, normalized("input", "normalized_shape"));
  // BatchNorm: sums over N * (spatial) values per channel, and the
  // differences x - mean bounded by the scale of the values.
  auto per_channel = [](const CallArgs& a) {
    return a.numel("input") / std::max<int64_t>(a.size("input", 1), 1) + 1;
  };
  for (const char* op : {"aten::native_batch_norm", "aten::_native_batch_norm_legit",
                         "aten::_native_batch_norm_legit.no_stats",
                         "aten::_native_batch_norm_legit_no_training", "aten::native_batch_norm_backward"})
    m[op] = accumulated(Magnitude::kScale, per_channel);
  auto rms = [](const CallArgs& a) {
    const int64_t n = std::max<int64_t>(a.numel("gamma"), 1);
    return std::max(n, a.numel("self") / n) + 1;
  };
  m["mindspeed_like::npu_rms_norm"] = accumulated(Magnitude::kScale, rms);
  m["mindspeed_like::npu_rms_norm_backward"] = accumulated(Magnitude::kScale, rms);
  return m;
}

const std::map<std::string, ErrorModel>& table() {
  static const std::map<std::string, ErrorModel> t = build();
  return t;
}

}  // namespace

const ErrorModel& error_model(const std::string& op) {
  static const ErrorModel host_calibrated;
  const auto it = table().find(op);
  return it == table().end() ? host_calibrated : it->second;
}

bool has_error_model(const std::string& op) { return table().count(op) != 0; }

}  // namespace npub::numerics
