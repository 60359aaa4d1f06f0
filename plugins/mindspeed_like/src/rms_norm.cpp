// mindspeed_like::npu_rms_norm and its backward.
#include <algorithm>
#include <cmath>
#include <vector>

#include "float_access.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
// y = x * rstd * gamma over the trailing dims that gamma covers; rstd in fp32
// with the leading dims of x and size 1 in the normalised ones (as torch_npu).
// Checks the arguments and declares (or allocates) both returns; on its own
// it is the op's meta function.
struct RmsOutputs {
  TensorRef y, rstd;  // undefined in a meta call
  int64_t rows, cols;
};
RmsOutputs rms_norm_outputs(Call& call) {
  TensorRef x = call.tensor(0), gamma = call.tensor(1);
  if (!x.is(gamma.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected the dtype of self (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
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
  return {y, rstd, cols == 0 ? 0 : x.numel() / cols, cols};
}

void rms_norm_meta(Call& call) { rms_norm_outputs(call); }

void rms_norm(Call& call) {
  TensorRef x = call.tensor(0), gamma = call.tensor(1);
  const double eps = call.double_arg(2);
  const RmsOutputs o = rms_norm_outputs(call);
  const TensorRef& y = o.y;
  const int64_t rows = o.rows, cols = o.cols;
  float* pr = o.rstd.data<float>();
  // rstd is float32 whatever the input, as in torch_npu.
  with_float_access(call, x.dtype(), [&](auto load, auto store) {
    call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t r = b; r < e; ++r) {
                          double ss = 0;
                          for (int64_t c = 0; c < cols; ++c) {
                            const double v = load(x, r * cols + c);
                            ss += v * v;
                          }
                          const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(cols) + eps));
                          pr[r] = inv;
                          for (int64_t c = 0; c < cols; ++c)
                            store(y, r * cols + c, load(x, r * cols + c) * inv * load(gamma, c));
                        }
                      });
  });
}

// mindspeed_like::npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor,
// Tensor) (dx, dgamma) of y = x * rstd * gamma, rstd = (mean(x^2) + eps)^-1/2 per row:
//   dgamma_c = sum_rows dy_c * x_c * rstd
//   dx_c = rstd * dy_c * g_c - x_c * rstd^3 / N * sum_k dy_k * g_k * x_k
struct RmsBackwardOutputs {
  TensorRef dx, dgamma;
  int64_t rows, cols;
};
RmsBackwardOutputs rms_norm_backward_outputs(Call& call) {
  TensorRef dy = call.tensor(0), x = call.tensor(1), gamma = call.tensor(2), rstd = call.tensor(3);
  if (dy.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "dy: expected the shape of self " + Call::shape_str(x.sizes()) +
                                             " but found " + Call::shape_str(dy.sizes()));
  if (!dy.is(x.dtype()) || !gamma.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "dy, gamma: expected the dtype of self (" + npub::sdk::dtype_name(x.dtype()) + ") but found " +
                  npub::sdk::dtype_name(dy.dtype()) + " and " + npub::sdk::dtype_name(gamma.dtype()));
  if (!rstd.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "rstd: expected float32 but found " + npub::sdk::dtype_name(rstd.dtype()));
  if (gamma.dim() < 1 || gamma.dim() > x.dim())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected 1 to " + std::to_string(x.dim()) +
                                             " dimensions but found " + std::to_string(gamma.dim()));
  int64_t cols = 1;
  std::vector<int64_t> rstd_shape = x.sizes();
  for (int32_t i = 0; i < gamma.dim(); ++i) {
    const int32_t xd = x.dim() - gamma.dim() + i;
    if (gamma.size(i) != x.size(xd))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected the trailing shape of self " +
                                               Call::shape_str(x.sizes()) + " but found " +
                                               Call::shape_str(gamma.sizes()));
    cols *= gamma.size(i);
    rstd_shape[static_cast<size_t>(xd)] = 1;
  }
  if (rstd.sizes() != rstd_shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "rstd: expected shape " + Call::shape_str(rstd_shape) +
                                             " but found " + Call::shape_str(rstd.sizes()));
  TensorRef dx = call.output(0, x.sizes(), x.dtype());
  TensorRef dgamma = call.output(1, gamma.sizes(), gamma.dtype());
  return {dx, dgamma, cols == 0 ? 0 : x.numel() / cols, cols};
}

void rms_norm_backward_meta(Call& call) { rms_norm_backward_outputs(call); }

void rms_norm_backward(Call& call) {
  TensorRef dy = call.tensor(0), x = call.tensor(1), gamma = call.tensor(2), rstd = call.tensor(3);
  const RmsBackwardOutputs o = rms_norm_backward_outputs(call);
  const int64_t rows = o.rows, cols = o.cols;
  const float* pr = rstd.data<float>();
  with_float_access(call, x.dtype(), [&](auto load, auto store) {
    // dx: rows are independent.
    call.parallel_for(
        0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            const double inv = pr[r];
            double dot = 0;
            for (int64_t c = 0; c < cols; ++c)
              dot += double(load(dy, r * cols + c)) * load(gamma, c) * load(x, r * cols + c);
            const double k = inv * inv * inv * dot / double(cols);
            for (int64_t c = 0; c < cols; ++c) {
              const int64_t i = r * cols + c;
              store(o.dx, i, static_cast<float>(inv * load(dy, i) * load(gamma, c) - load(x, i) * k));
            }
          }
        });
    // dgamma: columns are independent (each sums over the rows).
    call.parallel_for(0, cols, std::max<int64_t>(1, 4096 / std::max<int64_t>(rows, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t c = b; c < e; ++c) {
                          double acc = 0;
                          for (int64_t r = 0; r < rows; ++r)
                            acc += double(load(dy, r * cols + c)) * load(x, r * cols + c) * pr[r];
                          store(o.dgamma, c, static_cast<float>(acc));
                        }
                      });
  });
}

}  // namespace

void register_rms_norm(npub::sdk::Registrar& r) {
  r.def("mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm", &rms_norm)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16})
      .contiguous_only()
      .opt_level(2);
  r.meta<&rms_norm_meta>("mindspeed_like::npu_rms_norm");
  r.def(
      "mindspeed_like::npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, "
      "Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm_backward", &rms_norm_backward)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16})
      .arg_dtypes("rstd", {npub::sdk::kFloat32})  // the forward's fp32 statistics
      .contiguous_only()
      .opt_level(2);
  r.meta<&rms_norm_backward_meta>("mindspeed_like::npu_rms_norm_backward");
  // Autograd through the plugin's own backward (what op-plugin's
  // derivatives.yaml says for torch_npu's npu_rms_norm).
  r.derivative("mindspeed_like::npu_rms_norm",
               "self, gamma: mindspeed_like::npu_rms_norm_backward(grads[0], self, gamma, results[1])");
}

}  // namespace mindspeed_like
