// mindspeed_like::npu_rms_norm, npu_add_rms_norm and their backwards.
//
// y = x * rstd * gamma over the trailing dims that gamma covers, rstd =
// (mean(x^2) + eps)^-1/2 per row, kept in float32 (float64 for a float64 x)
// with the leading dims of x and size 1 in the normalised ones, as torch_npu
// returns it. npu_add_rms_norm normalises x = x1 + x2 (rounded to the dtype,
// as the composite add then norm does) and returns that sum too.
//
// The rows are reduced in float32 for float32 and the half types (blocked
// partial sums: float_access.h's blocked_sum), in double for float64.
// dgamma sums over the rows: each thread accumulates the rows of its block
// into its own partial row, which one pass over the columns adds up, so that
// the rows are read once, in order (a column at a time would stride through
// the whole tensor per column).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "float_access.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// --- the shared checks ---

struct RmsShape {
  int64_t rows = 1, cols = 1;
  std::vector<int64_t> rstd_shape;
  DLDataType rstd_dtype;  // float32, or float64 for a float64 x
};

void check_same(const Call& call, const TensorRef& t, const char* name, const TensorRef& x,
                const char* x_name) {
  if (t.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the shape of " + x_name + " " +
                                             Call::shape_str(x.sizes()) + " but found " +
                                             Call::shape_str(t.sizes()));
  if (!t.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the dtype of " + x_name + " (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(t.dtype()));
}

// gamma covers the trailing dims of x (named x_name in messages), in x's dtype.
RmsShape rms_shape(const Call& call, const TensorRef& x, const TensorRef& gamma, const char* x_name) {
  if (!x.is(gamma.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("gamma: expected the dtype of ") + x_name + " (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(gamma.dtype()));
  if (gamma.dim() < 1 || gamma.dim() > x.dim())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "gamma: expected 1 to " + std::to_string(x.dim()) +
                                             " dimensions but found " + std::to_string(gamma.dim()));
  RmsShape s;
  s.rstd_shape = x.sizes();
  const int32_t lead = x.dim() - gamma.dim();
  for (int32_t i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      s.rows *= x.size(i);
      continue;
    }
    if (gamma.size(i - lead) != x.size(i))
      call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("gamma: expected the trailing shape of ") + x_name +
                                               " " + Call::shape_str(x.sizes()) + " but found " +
                                               Call::shape_str(gamma.sizes()));
    s.cols *= x.size(i);
    s.rstd_shape[static_cast<size_t>(i)] = 1;
  }
  s.rstd_dtype = x.is(npub::sdk::kFloat64) ? npub::sdk::kFloat64 : npub::sdk::kFloat32;
  return s;
}

void check_rstd(const Call& call, const TensorRef& rstd, const RmsShape& s) {
  if (!rstd.is(s.rstd_dtype))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "rstd: expected " + npub::sdk::dtype_name(s.rstd_dtype) +
                                             " (the forward's statistics) but found " +
                                             npub::sdk::dtype_name(rstd.dtype()));
  if (rstd.sizes() != s.rstd_shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "rstd: expected shape " + Call::shape_str(s.rstd_shape) +
                                             " but found " + Call::shape_str(rstd.sizes()));
}

// --- forward rows ---

template <typename S>
struct ForwardRows {
  using E = typename S::E;
  const E *x, *x2, *gamma;  // x2: npu_add_rms_norm's second addend (x is the first)
  E *y, *sum;               // sum: npu_add_rms_norm's x1 + x2
  typename S::T* rstd;
  int64_t cols;
  double eps;
};

// One row: y = x * rstd * gamma; returns rstd.
template <typename S>
PLUGIN_KERNELS_INLINE typename S::T normalise_row(const typename S::E* __restrict x,
                                                  const typename S::E* __restrict g,
                                                  typename S::E* __restrict y, int64_t n, double eps) {
  const typename S::T inv = plugin_kernels::inverse_rms<S>(x, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = S::store(S::load(x[i]) * inv * S::load(g[i]));
  return inv;
}

// Compiled for AVX2 and baseline x86-64 (Note [One ISA layer for the in-tree plugins]).
template <typename S, bool Add>
struct RmsRows {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const ForwardRows<S>& a, int64_t r0, int64_t r1) {
    using E = typename S::E;
    const int64_t n = a.cols;
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (Add) {
        const E* __restrict x1 = a.x + r * n;
        const E* __restrict x2 = a.x2 + r * n;
        E* __restrict s = a.sum + r * n;
        for (int64_t i = 0; i < n; ++i) s[i] = S::store(S::load(x1[i]) + S::load(x2[i]));
        // the rounded sum is normalised, as add then norm does
        a.rstd[r] = normalise_row<S>(a.sum + r * n, a.gamma, a.y + r * n, n, a.eps);
      } else {
        a.rstd[r] = normalise_row<S>(a.x + r * n, a.gamma, a.y + r * n, n, a.eps);
      }
    }
  }
};

template <typename S, bool Add>
void run_forward(const Call& call, const ForwardRows<S>& a, int64_t rows) {
  call.parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(a.cols, 1)),
                    [&](int64_t b, int64_t e) { run_at_kernel_isa<RmsRows<S, Add>, Isa::kAvx2>(a, b, e); });
}

// mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
// Checks the arguments and declares (or allocates) the returns; on its own
// it is the op's meta function.
struct RmsOutputs {
  TensorRef y, rstd;  // undefined in a meta call
  RmsShape shape;
};
RmsOutputs rms_norm_outputs(Call& call) {
  TensorRef x = call.tensor(0), gamma = call.tensor(1);
  RmsShape s = rms_shape(call, x, gamma, "self");
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  TensorRef rstd = call.output(1, s.rstd_shape, s.rstd_dtype);
  return {y, rstd, std::move(s)};
}

void rms_norm_meta(Call& call) { rms_norm_outputs(call); }

void rms_norm(Call& call) {
  TensorRef x = call.tensor(0), gamma = call.tensor(1);
  const RmsOutputs o = rms_norm_outputs(call);
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const ForwardRows<S> a{elements<S>(x),   nullptr,           elements<S>(gamma),
                           elements<S>(o.y), nullptr,           o.rstd.data<typename S::T>(),
                           o.shape.cols,     call.double_arg(2)};
    run_forward<S, false>(call, a, o.shape.rows);
  });
}

// mindspeed_like::npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06)
//   -> (Tensor, Tensor, Tensor) = (y, rstd, x1 + x2)
struct AddRmsOutputs {
  TensorRef y, rstd, sum;
  RmsShape shape;
};
AddRmsOutputs add_rms_norm_outputs(Call& call) {
  TensorRef x1 = call.tensor(0), x2 = call.tensor(1), gamma = call.tensor(2);
  check_same(call, x2, "x2", x1, "x1");
  RmsShape s = rms_shape(call, x1, gamma, "x1");
  TensorRef y = call.output(0, x1.sizes(), x1.dtype());
  TensorRef rstd = call.output(1, s.rstd_shape, s.rstd_dtype);
  TensorRef sum = call.output(2, x1.sizes(), x1.dtype());
  return {y, rstd, sum, std::move(s)};
}

void add_rms_norm_meta(Call& call) { add_rms_norm_outputs(call); }

void add_rms_norm(Call& call) {
  TensorRef x1 = call.tensor(0), x2 = call.tensor(1), gamma = call.tensor(2);
  const AddRmsOutputs o = add_rms_norm_outputs(call);
  with_float_types(call, x1.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const ForwardRows<S> a{elements<S>(x1),  elements<S>(x2),    elements<S>(gamma),
                           elements<S>(o.y), elements<S>(o.sum), o.rstd.data<typename S::T>(),
                           o.shape.cols,     call.double_arg(3)};
    run_forward<S, true>(call, a, o.shape.rows);
  });
}

// --- backward rows ---
// Of y = x * rstd * gamma, rstd = (mean(x^2) + eps)^-1/2 per row of N:
//   dgamma_c = sum_rows dy_c * x_c * rstd
//   dx_c = rstd * dy_c * g_c - x_c * rstd^3 / N * sum_k dy_k * g_k * x_k
// (+ the gradient of the sum output, for npu_add_rms_norm, written to both
// addends' gradients).

template <typename S>
struct BackwardRows {
  using E = typename S::E;
  using T = typename S::T;
  const E *dy, *dsum, *x, *gamma;  // dsum: the gradient flowing into npu_add_rms_norm's sum
  const T* rstd;
  E *dx, *dx2;  // dx2: the second addend's gradient (npu_add_rms_norm)
  int64_t cols;
};

// `row` (Add only): a row of T, where the norm's part of dx waits for the
// sum's gradient (one loop doing both does not vectorise for bf16).
template <typename S, bool Add>
struct RmsBackwardRows {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const BackwardRows<S>& a, int64_t r0, int64_t r1,
                                        typename S::T* __restrict dgamma_partial,
                                        typename S::T* __restrict row) {
    using T = typename S::T;
    using E = typename S::E;
    const int64_t n = a.cols;
    const E* __restrict g = a.gamma;
    std::memset(dgamma_partial, 0, sizeof(T) * static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      const E* __restrict dy = a.dy + r * n;
      const E* __restrict x = a.x + r * n;
      const T inv = a.rstd[r];
      const T dot =
          blocked_sum<T>(n, [&](int64_t i) { return S::load(dy[i]) * S::load(g[i]) * S::load(x[i]); });
      const T k = inv * inv * inv * dot / static_cast<T>(n);
      E* __restrict dx = a.dx + r * n;
      for (int64_t i = 0; i < n; ++i) {
        const T dyv = S::load(dy[i]), xv = S::load(x[i]);
        const T d = inv * dyv * S::load(g[i]) - xv * k;
        if constexpr (Add)
          row[i] = d;
        else
          dx[i] = S::store(d);
        dgamma_partial[i] += dyv * xv * inv;
      }
      if constexpr (Add) {
        const E* __restrict dsum = a.dsum + r * n;
        E* __restrict dx2 = a.dx2 + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const T d = row[i] + S::load(dsum[i]);
          dx[i] = S::store(d);
          dx2[i] = S::store(d);
        }
      }
    }
  }
};

// dx row by row, in one block of rows per compute thread, each block's
// dgamma partial row in scratch memory; then dgamma = the sum of the blocks'
// partial rows.
template <typename S, bool Add>
void run_backward(Call& call, const BackwardRows<S>& a, int64_t rows, const TensorRef& dgamma) {
  using T = typename S::T;
  const int64_t cols = a.cols;
  typename S::E* pdg = elements<S>(dgamma);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(call.num_threads(), rows));
  // per block: its dgamma partial row, and (Add) a row of dx in T
  const int64_t per_block = (Add ? 2 : 1) * std::max<int64_t>(cols, 1);
  T* partial = static_cast<T*>(call.scratch(sizeof(T) * static_cast<uint64_t>(blocks * per_block)));
  call.parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      T* mine = partial + blk * per_block;
      run_at_kernel_isa<RmsBackwardRows<S, Add>, Isa::kAvx2>(
          a, rows * blk / blocks, rows * (blk + 1) / blocks, mine, Add ? mine + cols : nullptr);
    }
  });
  call.parallel_for(0, cols, 4096, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      T s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[blk * per_block + c];
      pdg[c] = S::store(s);
    }
  });
}

// mindspeed_like::npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd)
//   -> (Tensor, Tensor) = (dx, dgamma)
struct RmsBackwardOutputs {
  TensorRef dx, dgamma;
  RmsShape shape;
};
RmsBackwardOutputs rms_norm_backward_outputs(Call& call) {
  TensorRef dy = call.tensor(0), x = call.tensor(1), gamma = call.tensor(2), rstd = call.tensor(3);
  check_same(call, dy, "dy", x, "self");
  RmsShape s = rms_shape(call, x, gamma, "self");
  check_rstd(call, rstd, s);
  TensorRef dx = call.output(0, x.sizes(), x.dtype());
  TensorRef dgamma = call.output(1, gamma.sizes(), gamma.dtype());
  return {dx, dgamma, std::move(s)};
}

void rms_norm_backward_meta(Call& call) { rms_norm_backward_outputs(call); }

void rms_norm_backward(Call& call) {
  TensorRef dy = call.tensor(0), x = call.tensor(1), gamma = call.tensor(2), rstd = call.tensor(3);
  const RmsBackwardOutputs o = rms_norm_backward_outputs(call);
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const BackwardRows<S> a{
        elements<S>(dy),   nullptr, elements<S>(x), elements<S>(gamma), rstd.data<typename S::T>(),
        elements<S>(o.dx), nullptr, o.shape.cols};
    run_backward<S, false>(call, a, o.shape.rows, o.dgamma);
  });
}

// mindspeed_like::npu_add_rms_norm_backward(Tensor dy, Tensor dx, Tensor x, Tensor gamma, Tensor rstd)
//   -> (Tensor, Tensor, Tensor) = (dx1, dx2, dgamma); dx is the gradient of the sum return, x the sum.
struct AddRmsBackwardOutputs {
  TensorRef dx1, dx2, dgamma;
  RmsShape shape;
};
AddRmsBackwardOutputs add_rms_norm_backward_outputs(Call& call) {
  TensorRef dy = call.tensor(0), dsum = call.tensor(1), x = call.tensor(2), gamma = call.tensor(3),
            rstd = call.tensor(4);
  check_same(call, dy, "dy", x, "x");
  check_same(call, dsum, "dx", x, "x");
  RmsShape s = rms_shape(call, x, gamma, "x");
  check_rstd(call, rstd, s);
  TensorRef dx1 = call.output(0, x.sizes(), x.dtype());
  TensorRef dx2 = call.output(1, x.sizes(), x.dtype());
  TensorRef dgamma = call.output(2, gamma.sizes(), gamma.dtype());
  return {dx1, dx2, dgamma, std::move(s)};
}

void add_rms_norm_backward_meta(Call& call) { add_rms_norm_backward_outputs(call); }

void add_rms_norm_backward(Call& call) {
  TensorRef dy = call.tensor(0), dsum = call.tensor(1), x = call.tensor(2), gamma = call.tensor(3),
            rstd = call.tensor(4);
  const AddRmsBackwardOutputs o = add_rms_norm_backward_outputs(call);
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const BackwardRows<S> a{elements<S>(dy),
                            elements<S>(dsum),
                            elements<S>(x),
                            elements<S>(gamma),
                            rstd.data<typename S::T>(),
                            elements<S>(o.dx1),
                            elements<S>(o.dx2),
                            o.shape.cols};
    run_backward<S, true>(call, a, o.shape.rows, o.dgamma);
  });
}

}  // namespace

void register_rms_norm(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const auto dtypes = {kFloat32, kFloat16, kBFloat16, kFloat64};
  r.def("mindspeed_like::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm", &rms_norm).dtypes(dtypes).contiguous_only().opt_level(2);
  r.meta<&rms_norm_meta>("mindspeed_like::npu_rms_norm");
  r.def(
      "mindspeed_like::npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, "
      "Tensor)");
  r.kernel("mindspeed_like::npu_rms_norm_backward", &rms_norm_backward)
      .dtypes(dtypes)
      .arg_dtypes("rstd", {kFloat32, kFloat64})  // the forward's statistics; the body checks which
      .contiguous_only()
      .opt_level(2);
  r.meta<&rms_norm_backward_meta>("mindspeed_like::npu_rms_norm_backward");
  // Autograd through the plugin's own backward (what op-plugin's
  // derivatives.yaml says for torch_npu's npu_rms_norm).
  r.derivative("mindspeed_like::npu_rms_norm",
               "self, gamma: mindspeed_like::npu_rms_norm_backward(grads[0], self, gamma, results[1])");

  r.def(
      "mindspeed_like::npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, "
      "Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_add_rms_norm", &add_rms_norm).dtypes(dtypes).contiguous_only().opt_level(2);
  r.meta<&add_rms_norm_meta>("mindspeed_like::npu_add_rms_norm");
  r.def(
      "mindspeed_like::npu_add_rms_norm_backward(Tensor dy, Tensor dx, Tensor x, Tensor gamma, Tensor rstd) "
      "-> "
      "(Tensor, Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_add_rms_norm_backward", &add_rms_norm_backward)
      .dtypes(dtypes)
      .arg_dtypes("rstd", {kFloat32, kFloat64})
      .contiguous_only()
      .opt_level(2);
  r.meta<&add_rms_norm_backward_meta>("mindspeed_like::npu_add_rms_norm_backward");
  // The sum's gradient (grads[2]) joins the norm's in both addends; rstd
  // (results[1]) is a statistic, not differentiated.
  r.derivative("mindspeed_like::npu_add_rms_norm",
               "x1, x2, gamma: mindspeed_like::npu_add_rms_norm_backward(grads[0], grads[2], results[2], "
               "gamma, results[1])");
}

}  // namespace mindspeed_like
