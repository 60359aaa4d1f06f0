// softmax and log_softmax with their backward, on tensors viewed as
// [outer, D, inner] (registered contiguous-only: the dispatcher stages
// strided ones). Contiguous float32 rows, forward and backward, are compiled
// for each ISA level (plugin_kernels/isa.h); other rows accumulate in their compute type
// (forward) or double (backward).
#include "elementwise.h"
#include "ops.h"

#include <cmath>
#include <limits>

namespace cann_like {

namespace {

struct SoftmaxView {
  int64_t outer = 1, d = 1, inner = 1;
};
SoftmaxView softmax_view(const Call& call, const TensorRef& t, int64_t dim_arg) {
  SoftmaxView v;
  const int64_t dim = wrap_dim(call, dim_arg, t.dim());
  for (int32_t i = 0; i < t.dim(); ++i) {
    if (i < dim)
      v.outer *= t.size(i);
    else if (i == dim)
      v.d = t.size(i);
    else
      v.inner *= t.size(i);
  }
  return v;
}

// One contiguous fp32 softmax row, compiled for each ISA level (plugin_kernels/isa.h).
// The max and the sum run on 16-lane vectors
// (GCC vector extensions; the compiler does not vectorise a scalar max
// reduction written with `?:`, which kept the first pass scalar), fast_exp
// for the exponentials.
using F32x16 = float __attribute__((vector_size(64), aligned(4)));
PLUGIN_KERNELS_INLINE void softmax_row_body(const float* __restrict x, float* __restrict y, int64_t d,
                                            bool log) {
  // A NaN in the row needs no special case: the max skips it, exp(NaN - mx)
  // is NaN, so the sum and every output become NaN, as in ATen.
  constexpr int64_t L = 16;
  F32x16 vmax = F32x16{} - INFINITY;
  int64_t j = 0;
  for (; j + L <= d; j += L) {
    F32x16 v;
    std::memcpy(&v, x + j, sizeof v);
    vmax = v > vmax ? v : vmax;
  }
  float mx = -INFINITY;
  for (int64_t k = 0; k < L; ++k) mx = vmax[k] > mx ? vmax[k] : mx;
  for (; j < d; ++j) mx = x[j] > mx ? x[j] : mx;
  if (log) {
    // log_softmax needs the sum alone: no exponential is stored, and the
    // sum runs in 16 lanes. Every x - mx <= 0 (NaN where the row has one, or
    // is all -inf, as before), and a term below exp(-87.3) that
    // exp_nonpositive gives as 0 adds nothing to a sum of at least 1.
    float acc[L] = {};
    int64_t k = 0;
    for (; k + L <= d; k += L)
      for (int64_t l = 0; l < L; ++l) acc[l] += exp_nonpositive(x[k + l] - mx);
    float sum = 0;
    for (int64_t l = 0; l < L; ++l) sum += acc[l];
    for (; k < d; ++k) sum += exp_nonpositive(x[k] - mx);
    const float lse = std::log(sum) + mx;
    for (int64_t t = 0; t < d; ++t) y[t] = x[t] - lse;
    return;
  }
  for (int64_t i = 0; i < d; ++i) y[i] = fast_exp(x[i] - mx);
  F32x16 vsum = F32x16{};
  int64_t i = 0;
  for (; i + L <= d; i += L) {
    F32x16 v;
    std::memcpy(&v, y + i, sizeof v);
    vsum += v;
  }
  float sum = 0;
  for (int64_t k = 0; k < L; ++k) sum += vsum[k];
  for (; i < d; ++i) sum += y[i];
  const float inv = 1.0f / sum;
  for (int64_t t = 0; t < d; ++t) y[t] *= inv;
}
PLUGIN_KERNELS_ISA_DISPATCH(void, softmax_row_f32, softmax_row_body,
                            (const float* __restrict x, float* __restrict y, int64_t d, bool log),
                            (x, y, d, log))

// One contiguous fp32 row of the backward, compiled for each ISA level:
// log_softmax: gi = g - exp(y) * sum(g); softmax: gi = y * (g - sum(g * y)).
// The sum runs on 16-lane float vectors (as ATen's vectorised CPU kernel
// accumulates in float), fast_exp for exp(y).
PLUGIN_KERNELS_INLINE void softmax_bwd_row_body(const float* __restrict g, const float* __restrict y,
                                                float* __restrict o, int64_t d, bool log) {
  constexpr int64_t L = 16;
  F32x16 vacc = F32x16{};
  int64_t j = 0;
  for (; j + L <= d; j += L) {
    F32x16 gv, yv;
    std::memcpy(&gv, g + j, sizeof gv);
    std::memcpy(&yv, y + j, sizeof yv);
    vacc += log ? gv : gv * yv;
  }
  float acc = 0;
  for (int64_t k = 0; k < L; ++k) acc += vacc[k];
  for (; j < d; ++j) acc += log ? g[j] : g[j] * y[j];
  if (log) {
    for (int64_t t = 0; t < d; ++t) o[t] = g[t] - fast_exp(y[t]) * acc;
  } else {
    for (int64_t t = 0; t < d; ++t) o[t] = y[t] * (g[t] - acc);
  }
}
PLUGIN_KERNELS_ISA_DISPATCH(void, softmax_bwd_row_f32, softmax_bwd_row_body,
                            (const float* __restrict g, const float* __restrict y, float* __restrict o,
                             int64_t d, bool log),
                            (g, y, o, d, log))

// Applies f(in_row, out_row, stride) to each of the outer*inner rows of D
// elements (row-local float buffers for half types).
template <bool kLog>
void softmax_fwd(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  const bool half_to_float = call.bool_arg(2);
  const DT d = dt_of(in.dtype()), od = dt_of(out.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_UNSUPPORTED, std::string("softmax expects a floating tensor but found ") + dt_name(d));
  if (half_to_float && d != DT::f16 && d != DT::bf16)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "conversion from Half to Float is supported only for half inputs");
  if (od != (half_to_float ? DT::f32 : d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") +
                                             dt_name(half_to_float ? DT::f32 : d) + " but found " +
                                             dt_name(od));
  check_out(call, out, in.sizes());
  const SoftmaxView v = softmax_view(call, in, call.int_arg(1));
  const int64_t rows = v.outer * v.inner;
  const char* ib = in.data<char>();
  char* ob = out.data<char>();
  const int64_t ies = dt_size(d), oes = dt_size(od);
  auto row = [&](auto tag, int64_t r) {
    using T = decltype(tag);
    const int64_t o = r / v.inner, i = r % v.inner;
    const int64_t base = o * v.d * v.inner + i;
    const int64_t step = v.inner;
    if constexpr (std::is_same_v<T, float>) {
      if (d == DT::f32 && od == DT::f32 && step == 1) {  // the hot case: contiguous fp32 rows
        softmax_row_f32(reinterpret_cast<const float*>(ib) + base, reinterpret_cast<float*>(ob) + base, v.d,
                        kLog);
        return;
      }
    }
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < v.d; ++j) {
      const T x = load<T>(ib + (base + j * step) * ies, d);
      if (std::isnan(x) || x > mx) mx = x;
    }
    T sum = 0;
    for (int64_t j = 0; j < v.d; ++j) sum += std::exp(load<T>(ib + (base + j * step) * ies, d) - mx);
    for (int64_t j = 0; j < v.d; ++j) {
      const T x = load<T>(ib + (base + j * step) * ies, d);
      store<T>(ob + (base + j * step) * oes, od, kLog ? x - mx - std::log(sum) : std::exp(x - mx) / sum);
    }
  };
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(v.d, 1)),
                        [&](int64_t b, int64_t e) {
                          for (int64_t r = b; r < e; ++r) row(T{}, r);
                        });
    }
  });
}

// aten::_softmax_backward_data.out(grad_output, output, dim, input_dtype, *, grad_input)
// aten::_log_softmax_backward_data.out(grad_output, output, dim, input_dtype, *, out)
template <bool kLog>
void softmax_bwd(Call& call) {
  TensorRef g = call.tensor(0), y = call.tensor(1), gi = call.tensor(4);
  const DT gd = dt_of(g.dtype()), yd = dt_of(y.dtype()), od = dt_of(gi.dtype());
  if (!is_floating(gd) || !is_floating(yd))
    call.fail(NPUB_ERR_UNSUPPORTED, "softmax backward expects floating tensors");
  if (g.sizes() != y.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output of shape " + shape_str(g.sizes()) +
                                             " does not match output of shape " + shape_str(y.sizes()));
  const DT expected = from_scalar_type(call.int_arg(3));
  if (expected != od && !(od == gd))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("grad_input: expected dtype ") + dt_name(expected) + " but found " + dt_name(od));
  check_out(call, gi, g.sizes());
  const SoftmaxView v = softmax_view(call, g, call.int_arg(2));
  const int64_t rows = v.outer * v.inner;
  const char* gb = g.data<char>();
  const char* yb = y.data<char>();
  char* ob = gi.data<char>();
  const int64_t ges = dt_size(gd), yes = dt_size(yd), oes = dt_size(od);
  if (gd == DT::f32 && yd == DT::f32 && od == DT::f32 &&
      v.inner == 1) {  // the hot case: contiguous fp32 rows
    const auto* gf = reinterpret_cast<const float*>(gb);
    const auto* yf = reinterpret_cast<const float*>(yb);
    auto* of = reinterpret_cast<float*>(ob);
    call.parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(v.d, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t r = b; r < e; ++r)
                          softmax_bwd_row_f32(gf + r * v.d, yf + r * v.d, of + r * v.d, v.d, kLog);
                      });
    return;
  }
  call.parallel_for(
      0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(v.d, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const int64_t o = r / v.inner, i = r % v.inner;
          const int64_t base = o * v.d * v.inner + i;
          double acc = 0;
          for (int64_t j = 0; j < v.d; ++j) {
            const int64_t k = base + j * v.inner;
            const double gv = load<double>(gb + k * ges, gd);
            acc += kLog ? gv : gv * load<double>(yb + k * yes, yd);
          }
          for (int64_t j = 0; j < v.d; ++j) {
            const int64_t k = base + j * v.inner;
            const double gv = load<double>(gb + k * ges, gd), yv = load<double>(yb + k * yes, yd);
            store<double>(ob + k * oes, od, kLog ? gv - std::exp(yv) * acc : yv * (gv - acc));
          }
        }
      });
}

}  // namespace

void register_softmax(npub::sdk::Registrar& r) {
  const auto floating = dtypes_floating();
  r.op("aten::_softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out) -> Tensor(a!)",
       &softmax_fwd<false>)
      .dtypes(floating)
      .any_dtype("out")  // float32 for half_to_float; the body checks it
      .contiguous_only();
  r.op("aten::_log_softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out) -> Tensor(a!)",
       &softmax_fwd<true>)
      .dtypes(floating)
      .any_dtype("out")  // float32 for half_to_float; the body checks it
      .contiguous_only();
  r.op("aten::_softmax_backward_data.out(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, "
       "*, Tensor(a!) grad_input) -> Tensor(a!)",
       &softmax_bwd<false>)
      .dtypes(floating)
      .any_dtype("grad_input")  // input_dtype; the body checks it
      .contiguous_only();
  r.op("aten::_log_softmax_backward_data.out(Tensor grad_output, Tensor output, int dim, ScalarType "
       "input_dtype, *, Tensor(a!) out) -> Tensor(a!)",
       &softmax_bwd<true>)
      .dtypes(floating)
      .any_dtype("out")  // input_dtype; the body checks it
      .contiguous_only();
}

}  // namespace cann_like
