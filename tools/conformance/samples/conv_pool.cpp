// Convolution (forward and backward, 2-d and 3-d, transposed) and 2-d
// max and average pooling.
#include "conv_cases.h"
#include "sample_kit.h"

#include <array>
#include <optional>

namespace npub::conformance {
namespace {

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

}  // namespace

void add_conv_pool_samples(SampleTable& t) {
  t.samples("aten::convolution_overrideable", conv_spec());
  t.samples("aten::convolution_backward_overrideable", conv_backward_spec());
  t.samples("aten::max_pool2d_with_indices.out", max_pool_spec());
  t.samples("aten::max_pool2d_with_indices_backward.grad_input", max_pool_backward_spec());
  t.samples("aten::avg_pool2d.out", avg_pool_spec());
  t.samples("aten::avg_pool2d_backward.grad_input", avg_pool_backward_spec());
  // ATen's CPU backend has no *_overrideable kernels (they exist for
  // out-of-tree backends); the reference is the convolution it would run.
  t.reference("aten::convolution_overrideable", [](const std::vector<IValue>& a) {
    at::Tensor bias = a[2].isNone() ? at::Tensor() : a[2].toTensor();
    return std::vector<at::Tensor>{at::convolution(a[0].toTensor(), a[1].toTensor(), bias, a[3].toIntVector(),
                                                   a[4].toIntVector(), a[5].toIntVector(), a[6].toBool(),
                                                   a[7].toIntVector(), a[8].toInt())};
  });
  t.reference("aten::convolution_backward_overrideable", [](const std::vector<IValue>& a) {
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
  });
}

}  // namespace npub::conformance
