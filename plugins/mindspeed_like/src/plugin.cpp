// mindspeed_like: fused training ops (the role of MindSpeed's fused kernels).
// Built against the plugin C ABI only.
#include <npubridge/plugin_sdk.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
// y = x * rstd * gamma over the trailing dims that gamma covers; rstd in fp32
// with the leading dims of x and size 1 in the normalised ones (as torch_npu).
void rms_norm(Call& call) {
  TensorRef x = call.tensor(0), gamma = call.tensor(1);
  const double eps = call.double_arg(2);
  if (!x.is(npub::sdk::kFloat32) || !gamma.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_UNSUPPORTED, "expected float32 self and gamma");
  if (gamma.dim() < 1 || gamma.dim() > x.dim())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected 1 to " + std::to_string(x.dim()) +
                                             " dimensions but found " + std::to_string(gamma.dim()));
  int64_t cols = 1;
  for (int32_t i = 0; i < gamma.dim(); ++i) {
    const int32_t xd = x.dim() - gamma.dim() + i;
    if (gamma.size(i) != x.size(xd))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected the trailing shape of self " +
                                               Call::shape_str(x.sizes()) + " but found " +
                                               Call::shape_str(gamma.sizes()));
    cols *= gamma.size(i);
  }
  std::vector<int64_t> rstd_shape = x.sizes();
  for (int32_t i = x.dim() - gamma.dim(); i < x.dim(); ++i) rstd_shape[static_cast<size_t>(i)] = 1;
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  TensorRef rstd = call.output(1, rstd_shape, npub::sdk::kFloat32);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const float* px = x.data<float>();
  const float* pg = gamma.data<float>();
  float* py = y.data<float>();
  float* pr = rstd.data<float>();
  call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = px + r * cols;
      double ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += double(xr[c]) * xr[c];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(cols) + eps));
      pr[r] = inv;
      float* yr = py + r * cols;
      for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * inv * pg[c];
    }
  });
}

void init(npub::sdk::Registrar& r) {
  r.def("mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm", &rms_norm)
      .dtypes({npub::sdk::kFloat32})
      .contiguous_only()
      .opt_level(2);
}

}  // namespace

NPUB_DEFINE_PLUGIN(mindspeed_like, "0.1.0", init)
