// npub-conformance's samples and references of mindspeed_like's RMSNorm
// ops (plugins/mindspeed_like). Compiled into npub-conformance
// (tools/CMakeLists.txt), not into the plugin.
#include "sample_kit.h"

#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>

namespace npub::conformance {
namespace {

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

}  // namespace

void add_mindspeed_like_samples(SampleTable& t) {
  t.samples("mindspeed_like::npu_rms_norm", rms_norm_spec());
  t.samples("mindspeed_like::npu_rms_norm_backward", rms_norm_backward_spec());
  t.reference("mindspeed_like::npu_rms_norm", [](const std::vector<IValue>& a) {
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
  });
  // The gradients of y = x * rstd * gamma by LibTorch's autograd, in
  // float64, with the sample's rstd held fixed as the kernel's input.
  t.reference("mindspeed_like::npu_rms_norm_backward", [](const std::vector<IValue>& a) {
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
  });
}

}  // namespace npub::conformance
