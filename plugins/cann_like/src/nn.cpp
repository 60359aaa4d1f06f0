// NN ops: native_layer_norm (+ backward), embedding (+ dense backward),
// nll_loss (forward and backward).
#include "elementwise.h"
#include "ops.h"

#include <npubridge/philox.hpp>

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
// sum(x[c] - m) (squared: sum((x[c] - m)^2)) over n floats, in 8 partial sums.
inline float lane_sum(const float* x, int64_t n, float m, bool squared) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float t = x[c + l] - m;
      acc[l] += squared ? t * t : t;
    }
  float total = 0;
  for (; c < n; ++c) {
    const float t = x[c] - m;
    total += squared ? t * t : t;
  }
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

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
            // Two-pass in float, as ATen's CPU kernel, each pass in 8
            // independent partial sums (a vector's lanes; one running sum
            // is a chain of dependent adds the compiler may not reorder).
            const float s = lane_sum(xr, v.cols, 0.0f, false);
            const float m = s / static_cast<float>(v.cols);
            const float ss = lane_sum(xr, v.cols, m, true);
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

int64_t read_index(const TensorRef& idx, int64_t i) {
  const DT d = dt_of(idx.dtype());
  return load<int64_t>(idx.data<char>() + i * dt_size(d), d);
}

void check_index_dtype(const Call& call, const TensorRef& idx, const char* name) {
  const DT d = dt_of(idx.dtype());
  if (d != DT::i64 && d != DT::i32)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("Expected tensor for argument '") + name +
                  "' to have one of the following scalar types: Long, Int; but got " + dt_name(d) +
                  " instead");
  if (!idx.is_contiguous()) call.fail(NPUB_ERR_INTERNAL, std::string(name) + " must be contiguous");
}

// aten::embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False) -> Tensor
void embedding(Call& call) {
  TensorRef w = call.tensor(0), idx = call.tensor(1);
  if (w.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "'weight' must be 2-D but is " + std::to_string(w.dim()) + "-D");
  check_index_dtype(call, idx, "indices");
  const int64_t rows = w.size(0), dim = w.size(1), n = idx.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = read_index(idx, i);
    if (k < 0 || k >= rows)
      call.fail(NPUB_ERR_INDEX, "index out of range in self: index " + std::to_string(k) + " at position " +
                                    std::to_string(i) + " is not in [0, " + std::to_string(rows) + ")");
  }
  Shape shape = idx.sizes();
  shape.push_back(dim);
  TensorRef out = call.output(0, shape, w.dtype());
  const int64_t es = dt_size(dt_of(w.dtype()));
  const int64_t row_stride = w.stride(0) * es, col_stride = w.stride(1) * es;
  call.parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const char* src = w.data<char>() + read_index(idx, i) * row_stride;
      char* dst = out.data<char>() + i * dim * es;
      if (col_stride == es)
        std::memcpy(dst, src, static_cast<size_t>(dim * es));
      else
        for (int64_t c = 0; c < dim; ++c)
          std::memcpy(dst + c * es, src + c * col_stride, static_cast<size_t>(es));
    }
  });
}

// aten::embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) ->
// Tensor
void embedding_backward(Call& call) {
  TensorRef g = call.tensor(0), idx = call.tensor(1);
  const int64_t num_weights = call.int_arg(2), padding_idx = call.int_arg(3);
  const bool scale = call.bool_arg(4);
  check_index_dtype(call, idx, "indices");
  const int64_t n = idx.numel();
  const int64_t dim = g.dim() > 0 ? g.size(-1) : 1;
  if (g.numel() != n * dim)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output of shape " + shape_str(g.sizes()) +
                                             " does not match indices of shape " + shape_str(idx.sizes()));
  std::vector<int64_t> counts(static_cast<size_t>(std::max<int64_t>(num_weights, 0)), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = read_index(idx, i);
    if (k < 0 || k >= num_weights)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "index out of range: " + std::to_string(k) + " is not in [0, " +
                                               std::to_string(num_weights) + ")");
    ++counts[static_cast<size_t>(k)];
  }
  const DT d = dt_of(g.dtype());
  TensorRef out = call.output(0, {num_weights, dim}, g.dtype());
  const int64_t es = dt_size(d);
  std::vector<double> acc(static_cast<size_t>(num_weights * dim), 0.0);
  // Columns in parallel, rows in index order: deterministic sums.
  call.parallel_for(0, dim, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = read_index(idx, i);
      if (k == padding_idx) continue;
      const double s = scale ? 1.0 / static_cast<double>(counts[static_cast<size_t>(k)]) : 1.0;
      for (int64_t c = c0; c < c1; ++c)
        acc[static_cast<size_t>(k * dim + c)] += load<double>(g.data<char>() + (i * dim + c) * es, d) * s;
    }
  });
  for (int64_t i = 0; i < num_weights * dim; ++i)
    store<double>(out.data<char>() + i * es, d, acc[static_cast<size_t>(i)]);
}

// aten::nll_loss_forward.output(self, target, weight?, reduction, ignore_index, *, output!, total_weight!)
void nll_loss_forward(Call& call) {
  TensorRef x = call.tensor(0), target = call.tensor(1), w = call.optional_tensor(2);
  const int64_t reduction = call.int_arg(3), ignore = call.int_arg(4);
  TensorRef out = call.tensor(5), total = call.tensor(6);
  if (x.dim() < 1 || x.dim() > 2) call.fail(NPUB_ERR_INVALID_ARGUMENT, "input tensor should be 1D or 2D");
  const int64_t n = x.dim() == 2 ? x.size(0) : 1, c = x.size(-1);
  if ((x.dim() == 2 && (target.dim() != 1 || target.size(0) != n)) || (x.dim() == 1 && target.dim() != 0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "size mismatch (got input: " + shape_str(x.sizes()) +
                                             ", target: " + shape_str(target.sizes()) + ")");
  if (w.defined() && w.numel() != c)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "weight tensor should be defined either for all " + std::to_string(c) +
                  " classes or no classes but got weight tensor of shape: " + shape_str(w.sizes()));
  if (dt_of(target.dtype()) != DT::i64)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "expected target of dtype int64");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  auto target_at = [&](int64_t i) {
    return load<int64_t>(target.data<char>() + i * 8 * (target.dim() > 0 ? target.stride(0) : 1), DT::i64);
  };
  // The targets first: a bad target is the caller's error whatever out is.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target_at(i);
    if (t != ignore && (t < 0 || t >= c))
      call.fail(NPUB_ERR_INDEX, "Target " + std::to_string(t) + " is out of bounds.");
  }
  check_out(call, out, reduction == 0 && x.dim() == 2 ? Shape{n} : Shape{}, "output");
  double sum = 0, wsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target_at(i);
    double loss = 0;
    if (t != ignore) {
      const double wt =
          w.defined() ? load<double>(w.data<char>() + t * dt_size(dt_of(w.dtype())), dt_of(w.dtype())) : 1.0;
      const int64_t off = x.dim() == 2 ? i * x.stride(0) + t * x.stride(1) : t * x.stride(0);
      loss = -load<double>(x.data<char>() + off * es, d) * wt;
      wsum += wt;
    }
    if (reduction == 0 && x.dim() == 2) store<double>(out.data<char>() + i * es, d, loss);
    sum += loss;
  }
  if (reduction == 0 && x.dim() == 1) store<double>(out.data<char>(), d, sum);
  if (reduction == 1) store<double>(out.data<char>(), d, sum / wsum);
  if (reduction == 2) store<double>(out.data<char>(), d, sum);
  store<double>(total.data<char>(), dt_of(total.dtype()), reduction == 0 ? 0.0 : wsum);
}

// aten::nll_loss_backward.grad_input(grad_output, self, target, weight?, reduction, ignore_index,
// total_weight, *, grad_input!)
void nll_loss_backward(Call& call) {
  TensorRef go = call.tensor(0), x = call.tensor(1), target = call.tensor(2), w = call.optional_tensor(3);
  const int64_t reduction = call.int_arg(4), ignore = call.int_arg(5);
  TensorRef total = call.tensor(6), gi = call.tensor(7);
  check_out(call, gi, x.sizes(), "grad_input");
  const DT d = dt_of(x.dtype());
  const int64_t es = dt_size(d);
  const int64_t n = x.dim() == 2 ? x.size(0) : 1, c = x.size(-1);
  std::memset(gi.data<char>(), 0, static_cast<size_t>(gi.numel() * es));
  const double tw = load<double>(total.data<char>(), dt_of(total.dtype()));
  const DT gd = dt_of(go.dtype());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t =
        load<int64_t>(target.data<char>() + i * 8 * (target.dim() > 0 ? target.stride(0) : 1), DT::i64);
    if (t == ignore) continue;
    if (t < 0 || t >= c) call.fail(NPUB_ERR_INDEX, "Target " + std::to_string(t) + " is out of bounds.");
    const double wt =
        w.defined() ? load<double>(w.data<char>() + t * dt_size(dt_of(w.dtype())), dt_of(w.dtype())) : 1.0;
    const double g = (reduction == 0 && x.dim() == 2)
                         ? load<double>(go.data<char>() + i * dt_size(gd) * go.stride(0), gd)
                         : load<double>(go.data<char>(), gd);
    double v = -wt * g;
    if (reduction == 1) v /= tw;
    store<double>(gi.data<char>() + (i * c + t) * es, d, v);
  }
}

}  // namespace

void register_nn(npub::sdk::Registrar& r) {
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
  r.op("aten::embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, "
       "bool sparse=False) -> Tensor",
       &embedding)
      .dtypes(dtypes_all())
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32})
      .contiguous_only();
  r.op("aten::embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt "
       "padding_idx, bool scale_grad_by_freq) -> Tensor",
       &embedding_backward)
      .dtypes(floating)
      .arg_dtypes("indices", {npub::sdk::kInt64, npub::sdk::kInt32})
      .contiguous_only();
  r.op("aten::nll_loss_forward.output(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt "
       "ignore_index, *, Tensor(a!) output, Tensor(b!) total_weight) -> (Tensor(a!), Tensor(b!))",
       &nll_loss_forward)
      .dtypes(floating)
      .arg_dtypes("target", {npub::sdk::kInt64})
      .contiguous_only();
  r.op("aten::nll_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, "
       "int reduction, SymInt ignore_index, Tensor total_weight, *, Tensor(a!) grad_input) -> Tensor(a!)",
       &nll_loss_backward)
      .dtypes(floating)
      .arg_dtypes("target", {npub::sdk::kInt64})
      .contiguous_only();
}

}  // namespace cann_like
