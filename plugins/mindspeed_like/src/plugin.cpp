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
  if (!x.is(gamma.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected the dtype of self (" + npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(gamma.dtype()));
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
  float* pr = rstd.data<float>();
  // Half types are read and written in their own dtype and computed in
  // float32 (rstd is float32 whatever the input, as in torch_npu).
  auto run = [&](auto load, auto store) {
    call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double v = load(x, r * cols + c);
          ss += v * v;
        }
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(cols) + eps));
        pr[r] = inv;
        for (int64_t c = 0; c < cols; ++c) store(y, r * cols + c, load(x, r * cols + c) * inv * load(gamma, c));
      }
    });
  };
  if (x.is(npub::sdk::kFloat32)) {
    run([](const TensorRef& t, int64_t i) { return t.data<float>()[i]; },
        [](const TensorRef& t, int64_t i, float v) { t.data<float>()[i] = v; });
  } else if (x.is(npub::sdk::kFloat16)) {
    run([](const TensorRef& t, int64_t i) { return npub::sdk::half_to_float(t.data<uint16_t>()[i]); },
        [](const TensorRef& t, int64_t i, float v) { t.data<uint16_t>()[i] = npub::sdk::float_to_half(v); });
  } else if (x.is(npub::sdk::kBFloat16)) {
    run([](const TensorRef& t, int64_t i) { return npub::sdk::bf16_to_float(t.data<uint16_t>()[i]); },
        [](const TensorRef& t, int64_t i, float v) { t.data<uint16_t>()[i] = npub::sdk::float_to_bf16(v); });
  } else {
    call.fail(NPUB_ERR_UNSUPPORTED, "dtype " + npub::sdk::dtype_name(x.dtype()));
  }
}

void init(npub::sdk::Registrar& r) {
  r.def("mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm", &rms_norm)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16})
      .contiguous_only()
      .opt_level(2);
}

}  // namespace

NPUB_DEFINE_PLUGIN(mindspeed_like, "0.1.0", init)
