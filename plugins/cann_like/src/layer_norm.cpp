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

// One float32 row of layer norm with float32 (or no) weight and bias: two
// passes in float, as ATen's CPU kernel, each in 32 partial sums (four
// vectors' lanes: add chains side by side, then combined by halves), then
// y = (x - m) * inv * w + b.
// Compiled per ISA level (Note [float32 elementwise loops per ISA level]):
// the baseline build's 4-lane loops and single chain of 8 ran a BERT
// layer's [1024, 256] at 1.5-1.7x ATen's time.
PLUGIN_KERNELS_INLINE float ln_lane_sum(const float* x, int64_t n, float m, bool squared) {
  constexpr int kLanes = 32;
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float t = x[c + l] - m;
      acc[l] += squared ? t * t : t;
    }
  // The lanes combined by halves, vector adds (one after another they were
  // a chain of 32 dependent adds, twice a row: longer than the row's loops).
  float total = sum_lanes_by_halves(acc);
  for (; c < n; ++c) {
    const float t = x[c] - m;
    total += squared ? t * t : t;
  }
  return total;
}
// (No lambda in the body: a lambda's operator() does not take the target
// attribute of the function it is written in, and would run at baseline.)
PLUGIN_KERNELS_INLINE void ln_row_f32_body(const float* x, int64_t n, float eps, const float* w,
                                           const float* b, float* y, float* mean, float* rstd) {
  const float m = ln_lane_sum(x, n, 0.0f, false) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(ln_lane_sum(x, n, m, true) / static_cast<float>(n) + eps);
  if (w != nullptr && b != nullptr) {
    for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - m) * inv * w[c] + b[c];
  } else if (w != nullptr) {
    for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - m) * inv * w[c];
  } else if (b != nullptr) {
    for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - m) * inv + b[c];
  } else {
    for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - m) * inv;
  }
  *mean = m;
  *rstd = inv;
}
PLUGIN_KERNELS_ISA_DISPATCH(void, ln_row_f32, ln_row_f32_body,
                            (const float* x, int64_t n, float eps, const float* w, const float* b, float* y,
                             float* mean, float* rstd),
                            (x, n, eps, w, b, y, mean, rstd))

// aten::native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd):
// float32 rows with float32 parameters per ISA level, any other mix in double.
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
  const bool f32_rows =
      d == DT::f32 && (!w.defined() || wd == DT::f32) && (!b.defined() || bd == DT::f32) && v.cols > 0;
  call.parallel_for(
      0, v.rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(v.cols, 1)), [&](int64_t r0, int64_t r1) {
        std::vector<double> row;  // the generic path's row in double
        for (int64_t r = r0; r < r1; ++r) {
          double mu = 0, var = 0;
          if (f32_rows) {
            ln_row_f32(reinterpret_cast<const float*>(xb) + r * v.cols, v.cols, static_cast<float>(eps),
                       reinterpret_cast<const float*>(wb), reinterpret_cast<const float*>(bb),
                       y.data<float>() + r * v.cols, mean.data<float>() + r, rstd.data<float>() + r);
            continue;
          }
          row.resize(static_cast<size_t>(v.cols));
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

// Note [Layer norm backward rows]
// As ATen's CPU kernel, in the compute type (float for float32 and the half
// types, double for float64), one pass over the input: per row, xhat =
// (x - mean) * rstd, the row's sums of g*w and g*w*xhat on vectors (one
// lane per column mod the vector width, added lane by lane at the end),
// then grad_input, and g*xhat and g added into the grad_weight / grad_bias
// partials of the row's block. Blocks are kBlock rows whatever the thread
// count (one call of the per-ISA loop each), their partials added in double
// in block order: deterministic sums.
// (The kernel before ran per element through the generic loads, in double,
// and summed the columns with a strided walk: 12x slower than ATen on
// GPT-2's layer norms.) Half types go through float32 rows.
template <typename T>
struct Vec64;  // 64 bytes of T, GCC vector extension
template <>
struct Vec64<float> {
  using type = float __attribute__((vector_size(64), aligned(4)));
};
template <>
struct Vec64<double> {
  using type = double __attribute__((vector_size(64), aligned(8)));
};
// The sum of a vector's lanes, halves added pairwise (a fixed order).
template <typename T, typename V>
PLUGIN_KERNELS_INLINE T lane_sum(V v) {
  constexpr int kLanes = sizeof(V) / sizeof(T);
  T t[kLanes];
  std::memcpy(t, &v, sizeof v);
  return sum_lanes_by_halves(t);
}
// Rows [0, rows) of n elements (row r at r * n; gi, dw and db may be null,
// dw and db together): Note [Layer norm backward rows].
template <typename T>
PLUGIN_KERNELS_INLINE void ln_bwd_rows_body(const T* __restrict g, const T* __restrict x,
                                            const T* __restrict w, const T* mu, const T* inv, int64_t rows,
                                            int64_t n, T* __restrict gi, T* __restrict dw, T* __restrict db,
                                            T* __restrict xh) {
  constexpr int kLanes = 64 / sizeof(T);
  using V = typename Vec64<T>::type;
  for (int64_t r = 0; r < rows; ++r, g += n, x += n) {
    const T m = mu[r], s = inv[r];
    V va = {}, vb = {};
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes) {
      V gv, wv, xv;
      std::memcpy(&gv, g + c, sizeof gv);
      std::memcpy(&wv, w + c, sizeof wv);
      std::memcpy(&xv, x + c, sizeof xv);
      xv = (xv - m) * s;
      std::memcpy(xh + c, &xv, sizeof xv);
      const V gw = gv * wv;
      va += gw;
      vb += gw * xv;
    }
    T sa = lane_sum<T>(va), sb = lane_sum<T>(vb);
    for (; c < n; ++c) {
      xh[c] = (x[c] - m) * s;
      const T gw = g[c] * w[c];
      sa += gw;
      sb += gw * xh[c];
    }
    const T ma = sa / static_cast<T>(n), mb = sb / static_cast<T>(n);
    if (gi != nullptr && dw != nullptr) {
      for (c = 0; c < n; ++c) {
        gi[c] = s * (g[c] * w[c] - ma - xh[c] * mb);
        dw[c] += g[c] * xh[c];
        db[c] += g[c];
      }
    } else if (gi != nullptr) {
      for (c = 0; c < n; ++c) gi[c] = s * (g[c] * w[c] - ma - xh[c] * mb);
    } else {
      for (c = 0; c < n; ++c) {
        dw[c] += g[c] * xh[c];
        db[c] += g[c];
      }
    }
    if (gi != nullptr) gi += n;
  }
}
#define LN_BWD_INSTANCE(T, suffix)                                                                          \
  PLUGIN_KERNELS_INLINE void ln_bwd_rows_##suffix##_body(const T* g, const T* x, const T* w, const T* mu,   \
                                                         const T* inv, int64_t rows, int64_t n, T* gi,      \
                                                         T* dw, T* db, T* xh) {                             \
    ln_bwd_rows_body(g, x, w, mu, inv, rows, n, gi, dw, db, xh);                                            \
  }                                                                                                         \
  PLUGIN_KERNELS_ISA_DISPATCH(void, ln_bwd_rows_##suffix, ln_bwd_rows_##suffix##_body,                      \
                              (const T* g, const T* x, const T* w, const T* mu, const T* inv, int64_t rows, \
                               int64_t n, T* gi, T* dw, T* db, T* xh),                                      \
                              (g, x, w, mu, inv, rows, n, gi, dw, db, xh))
LN_BWD_INSTANCE(float, f32)
LN_BWD_INSTANCE(double, f64)
#undef LN_BWD_INSTANCE

template <typename T>
void ln_bwd_block(const T* g, const T* x, const T* w, const T* mu, const T* inv, int64_t rows, int64_t n,
                  T* gi, T* dw, T* db, T* xh) {
  if constexpr (std::is_same_v<T, float>)
    ln_bwd_rows_f32(g, x, w, mu, inv, rows, n, gi, dw, db, xh);
  else
    ln_bwd_rows_f64(g, x, w, mu, inv, rows, n, gi, dw, db, xh);
}

// The rows of layer_norm_backward in compute type T (Note [Layer norm
// backward rows]); dw_out / db_out (cols doubles each) when params.
template <typename T>
void ln_bwd_rows(const Call& call, DT d, const char* gb, const char* xb, const TensorRef& mean,
                 const TensorRef& rstd, const std::vector<T>& w, int64_t rows, int64_t cols, char* gi,
                 bool params, double* dw_out, double* db_out) {
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (rows + kBlock - 1) / kBlock, es = dt_size(d);
  const DT md = dt_of(mean.dtype()), rd = dt_of(rstd.dtype());
  const bool half = d == DT::f16 || d == DT::bf16;
  // grad_weight and grad_bias partials of each block: [blocks][2][cols].
  std::vector<T> part(params ? static_cast<size_t>(blocks * 2 * cols) : 0, T(0));
  call.parallel_for(0, blocks, std::max<int64_t>(1, 8192 / (kBlock * cols)), [&](int64_t b0, int64_t b1) {
    std::vector<T> xh(static_cast<size_t>(cols));
    std::vector<float> hb(half ? static_cast<size_t>(cols) * 3 : 0);
    T mu[kBlock], inv[kBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * kBlock, n = std::min(rows, r0 + kBlock) - r0;
      for (int64_t i = 0; i < n; ++i) {
        mu[i] = load<T>(mean.data<char>() + (r0 + i) * dt_size(md), md);
        inv[i] = load<T>(rstd.data<char>() + (r0 + i) * dt_size(rd), rd);
      }
      T* dw = params ? part.data() + blk * 2 * cols : nullptr;
      T* db = params ? dw + cols : nullptr;
      const int64_t off = r0 * cols * es;
      if constexpr (std::is_same_v<T, float>) {
        if (half) {
          for (int64_t i = 0; i < n; ++i) {
            const int64_t o = off + i * cols * es;
            float *gf = hb.data(), *xf = gf + cols, *of = xf + cols;
            half_block_to_float(gb + o, d, gf, cols);
            half_block_to_float(xb + o, d, xf, cols);
            ln_bwd_block(gf, xf, w.data(), mu + i, inv + i, 1, cols, gi ? of : nullptr, dw, db, xh.data());
            if (gi) float_block_to_half(of, gi + o, d, cols);
          }
          continue;
        }
      }
      ln_bwd_block(reinterpret_cast<const T*>(gb + off), reinterpret_cast<const T*>(xb + off), w.data(), mu,
                   inv, n, cols, gi ? reinterpret_cast<T*>(gi + off) : nullptr, dw, db, xh.data());
    }
  });
  if (!params) return;
  // Block by block, each column's sums in block order (a column at a time
  // walked the partials with a stride: a fifth of a [1040, 256] backward).
  std::fill(dw_out, dw_out + cols, 0.0);
  std::fill(db_out, db_out + cols, 0.0);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const T* pw = part.data() + blk * 2 * cols;
    const T* pb = pw + cols;
    for (int64_t c = 0; c < cols; ++c) {
      dw_out[c] += static_cast<double>(pw[c]);
      db_out[c] += static_cast<double>(pb[c]);
    }
  }
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
  const int64_t rows = v.rows, cols = v.cols;
  TensorRef gi, gw, gbias;
  if (mask[0]) gi = call.output(0, x.sizes(), x.dtype());
  if (mask[1] && w.defined()) gw = call.output(1, w.sizes(), w.dtype());
  if (mask[2] && b.defined()) gbias = call.output(2, b.sizes(), b.dtype());
  const bool params = gw.defined() || gbias.defined();
  if ((!mask[0] && !params) || rows == 0 || cols == 0) {
    // Nothing to sum: the parameters' gradients are zeros (grad_input is empty).
    if (gw.defined())
      std::memset(gw.data<char>(), 0, static_cast<size_t>(gw.numel() * dt_size(dt_of(w.dtype()))));
    if (gbias.defined())
      std::memset(gbias.data<char>(), 0, static_cast<size_t>(gbias.numel() * dt_size(dt_of(b.dtype()))));
    return;
  }
  const DT wd = w.defined() ? dt_of(w.dtype()) : d;
  std::vector<double> dw(params ? static_cast<size_t>(cols) : 0), db(dw.size());
  char* gio = mask[0] ? gi.data<char>() : nullptr;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> wv(static_cast<size_t>(cols), T(1));
    if (w.defined())
      for (int64_t c = 0; c < cols; ++c)
        wv[static_cast<size_t>(c)] = load<T>(w.data<char>() + c * dt_size(wd), wd);
    ln_bwd_rows<T>(call, d, g.data<char>(), x.data<char>(), mean, rstd, wv, rows, cols, gio, params,
                   dw.data(), db.data());
  };
  if (d == DT::f64)
    run(double{});
  else
    run(float{});
  if (gw.defined())
    for (int64_t c = 0; c < cols; ++c)
      store<double>(gw.data<char>() + c * dt_size(wd), wd, dw[static_cast<size_t>(c)]);
  if (gbias.defined()) {
    const DT bd = dt_of(b.dtype());
    for (int64_t c = 0; c < cols; ++c)
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
