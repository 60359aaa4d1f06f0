// native_layer_norm and its backward, over the trailing normalized dims
// viewed as rows x cols.
#include "elementwise.h"
#include "ops.h"

#include <cmath>

namespace cann_like {

namespace {

// Rows x cols view for layer norm: the normalized shape is the trailing dims.
struct RowsCols {
  int64_t rows = 1, cols = 1;
  Shape stat_shape;  // input shape with the normalized dims set to 1
};

RowsCols layer_norm_view(const Call& call, const TensorRef& x, const std::vector<int64_t>& normalized) {
  const int64_t n = static_cast<int64_t>(normalized.size());
  if (n == 0 || n > x.dim())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "normalized_shape: expected 1 to " + std::to_string(x.dim()) +
                                             " trailing dimensions but found " + std::to_string(n));
  RowsCols v;
  v.stat_shape = x.sizes();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t d = static_cast<int32_t>(x.dim() - n + i);
    if (x.size(d) != normalized[static_cast<size_t>(i)])
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "Given normalized_shape=" + shape_str(normalized) + ", expected input with shape [*, " +
                    shape_str(normalized).substr(1) + ", but got input of size " + shape_str(x.sizes()));
    v.cols *= x.size(d);
    v.stat_shape[static_cast<size_t>(d)] = 1;
  }
  v.rows = v.cols == 0 ? 0 : x.numel() / v.cols;
  if (v.cols == 0) v.rows = numel_of(v.stat_shape);
  return v;
}

void check_param(const Call& call, const TensorRef& p, int64_t cols, const char* name) {
  if (p.defined() && p.numel() != cols)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected " + std::to_string(cols) +
                                             " elements (the normalized shape) but found " +
                                             std::to_string(p.numel()));
}

// aten::native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
void layer_norm(Call& call) {
  TensorRef x = call.tensor(0);
  const auto normalized = call.int_list(1);
  TensorRef w = call.optional_tensor(2), b = call.optional_tensor(3);
  const double eps = call.double_arg(4);
  const RowsCols v = layer_norm_view(call, x, normalized);
  check_param(call, w, v.cols, "weight");
  check_param(call, b, v.cols, "bias");
  const DT d = dt_of(x.dtype());
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  TensorRef mean = call.output(1, v.stat_shape, x.dtype());
  TensorRef rstd = call.output(2, v.stat_shape, x.dtype());
  const char* xb = x.data<char>();
  const char* wb = w.defined() ? w.data<char>() : nullptr;
  const char* bb = b.defined() ? b.data<char>() : nullptr;
  const DT wd = w.defined() ? dt_of(w.dtype()) : d, bd = b.defined() ? dt_of(b.dtype()) : d;
  const int64_t es = dt_size(d);
  call.parallel_for(
      0, v.rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(v.cols, 1)), [&](int64_t r0, int64_t r1) {
        std::vector<double> row(static_cast<size_t>(v.cols));
        for (int64_t r = r0; r < r1; ++r) {
          double mu = 0, var = 0;
          if (d == DT::f32) {
            const float* xr = reinterpret_cast<const float*>(xb) + r * v.cols;
            float s = 0, ss = 0;  // two-pass in float, as ATen's CPU kernel
            for (int64_t c = 0; c < v.cols; ++c) s += xr[c];
            const float m = s / static_cast<float>(v.cols);
            for (int64_t c = 0; c < v.cols; ++c) {
              const float t = xr[c] - m;
              ss += t * t;
            }
            mu = m;
            var = ss / static_cast<float>(v.cols);
            const float inv = 1.0f / std::sqrt(static_cast<float>(var) + static_cast<float>(eps));
            float* yr = y.data<float>() + r * v.cols;
            const float* wf = (w.defined() && wd == DT::f32) ? reinterpret_cast<const float*>(wb) : nullptr;
            const float* bf = (b.defined() && bd == DT::f32) ? reinterpret_cast<const float*>(bb) : nullptr;
            if ((w.defined() && !wf) || (b.defined() && !bf)) {
              for (int64_t c = 0; c < v.cols; ++c) {
                float t = (xr[c] - m) * inv;
                if (w.defined()) t *= load<float>(wb + c * dt_size(wd), wd);
                if (b.defined()) t += load<float>(bb + c * dt_size(bd), bd);
                yr[c] = t;
              }
            } else if (wf && bf) {
              for (int64_t c = 0; c < v.cols; ++c) yr[c] = (xr[c] - m) * inv * wf[c] + bf[c];
            } else if (wf) {
              for (int64_t c = 0; c < v.cols; ++c) yr[c] = (xr[c] - m) * inv * wf[c];
            } else {
              for (int64_t c = 0; c < v.cols; ++c) yr[c] = (xr[c] - m) * inv + (bf ? bf[c] : 0.0f);
            }
            store<float>(mean.data<char>() + r * 4, DT::f32, m);
            store<float>(rstd.data<char>() + r * 4, DT::f32, inv);
            continue;
          }
          for (int64_t c = 0; c < v.cols; ++c) {
            row[static_cast<size_t>(c)] = load<double>(xb + (r * v.cols + c) * es, d);
            mu += row[static_cast<size_t>(c)];
          }
          mu /= static_cast<double>(v.cols);
          for (int64_t c = 0; c < v.cols; ++c)
            var += (row[static_cast<size_t>(c)] - mu) * (row[static_cast<size_t>(c)] - mu);
          var /= static_cast<double>(v.cols);
          const double inv = 1.0 / std::sqrt(var + eps);
          for (int64_t c = 0; c < v.cols; ++c) {
            double t = (row[static_cast<size_t>(c)] - mu) * inv;
            if (w.defined()) t *= load<double>(wb + c * dt_size(wd), wd);
            if (b.defined()) t += load<double>(bb + c * dt_size(bd), bd);
            store<double>(y.data<char>() + (r * v.cols + c) * es, d, t);
          }
          store<double>(mean.data<char>() + r * es, d, v.cols == 0 ? std::nan("") : mu);
          store<double>(rstd.data<char>() + r * es, d, v.cols == 0 ? std::nan("") : inv);
        }
      });
}

// aten::native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
//     weight?, bias?, bool[3] output_mask) -> (grad_input, grad_weight, grad_bias)
void layer_norm_backward(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1), mean = call.tensor(3), rstd = call.tensor(4);
  TensorRef w = call.optional_tensor(5), b = call.optional_tensor(6);
  const auto mask = call.int_list(7);
  if (mask.size() != 3) call.fail(NPUB_ERR_INVALID_ARGUMENT, "output_mask: expected 3 values");
  const RowsCols v = layer_norm_view(call, x, call.int_list(2));
  if (g.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_out of shape " + shape_str(g.sizes()) +
                                             " does not match input of shape " + shape_str(x.sizes()));
  if (mean.numel() != v.rows || rstd.numel() != v.rows)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "mean and rstd: expected " + std::to_string(v.rows) + " elements");
  check_param(call, w, v.cols, "weight");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  std::vector<double> dw(static_cast<size_t>(v.cols), 0.0), db(static_cast<size_t>(v.cols), 0.0);
  TensorRef gi;
  if (mask[0]) gi = call.output(0, x.sizes(), x.dtype());
  const char* gb = g.data<char>();
  const char* xb = x.data<char>();
  const DT md = dt_of(mean.dtype()), rd = dt_of(rstd.dtype());
  const int64_t mes = dt_size(md), res = dt_size(rd);
  const DT wd = w.defined() ? dt_of(w.dtype()) : d;
  // grad_input rows in parallel; grad_weight / grad_bias column sums serially
  // per column block (deterministic order).
  if (mask[0]) {
    call.parallel_for(
        0, v.rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(v.cols, 1)), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const double mu = load<double>(mean.data<char>() + r * mes, md),
                         inv = load<double>(rstd.data<char>() + r * res, rd);
            double sum_gw = 0, sum_gw_xhat = 0;
            for (int64_t c = 0; c < v.cols; ++c) {
              const int64_t k = r * v.cols + c;
              const double gw = load<double>(gb + k * es, d) *
                                (w.defined() ? load<double>(w.data<char>() + c * dt_size(wd), wd) : 1.0);
              const double xhat = (load<double>(xb + k * es, d) - mu) * inv;
              sum_gw += gw;
              sum_gw_xhat += gw * xhat;
            }
            const double n = static_cast<double>(v.cols);
            for (int64_t c = 0; c < v.cols; ++c) {
              const int64_t k = r * v.cols + c;
              const double gw = load<double>(gb + k * es, d) *
                                (w.defined() ? load<double>(w.data<char>() + c * dt_size(wd), wd) : 1.0);
              const double xhat = (load<double>(xb + k * es, d) - mu) * inv;
              store<double>(gi.data<char>() + k * es, d, inv * (gw - sum_gw / n - xhat * sum_gw_xhat / n));
            }
          }
        });
  }
  if (mask[1] || mask[2]) {
    call.parallel_for(0, v.cols, 64, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < v.rows; ++r) {
        const double mu = load<double>(mean.data<char>() + r * mes, md),
                     inv = load<double>(rstd.data<char>() + r * res, rd);
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t k = r * v.cols + c;
          const double gv = load<double>(gb + k * es, d);
          dw[static_cast<size_t>(c)] += gv * (load<double>(xb + k * es, d) - mu) * inv;
          db[static_cast<size_t>(c)] += gv;
        }
      }
    });
  }
  if (mask[1] && w.defined()) {
    TensorRef gw = call.output(1, w.sizes(), w.dtype());
    for (int64_t c = 0; c < v.cols; ++c)
      store<double>(gw.data<char>() + c * dt_size(wd), wd, dw[static_cast<size_t>(c)]);
  }
  if (mask[2] && b.defined()) {
    TensorRef gbias = call.output(2, b.sizes(), b.dtype());
    const DT bd = dt_of(b.dtype());
    for (int64_t c = 0; c < v.cols; ++c)
      store<double>(gbias.data<char>() + c * dt_size(bd), bd, db[static_cast<size_t>(c)]);
  }
}

}  // namespace

void register_layer_norm(npub::sdk::Registrar& r) {
  const auto floating = dtypes_floating();
  r.op("aten::native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float "
       "eps) -> (Tensor, Tensor, Tensor)",
       &layer_norm)
      .dtypes(floating)
      .contiguous_only();
  r.op("aten::native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor "
       "mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
       &layer_norm_backward)
      .dtypes(floating)
      .contiguous_only();
}

}  // namespace cann_like
