// Vector norms: aten::linalg_vector_norm.out (gradient clipping calls it once
// per parameter through torch._foreach_norm) and the legacy aten::norm.out,
// one engine for both.
//
// Every norm accumulates in double whatever the input (ATen accumulates
// float32 and the half types in float32): more accurate than ATen, and a
// float32 2-norm cannot overflow in its sum of squares (ATen's does once an
// element passes 1.8e19). A float64 2-norm whose sum of squares overflows or
// underflows is computed again scaled (Note [A float64 2-norm is rescaled]).
#include "common.h"
#include "ops.h"
#include "scalar_range.h"

#include <cmath>
#include <limits>

namespace cann_like {

namespace {

// ord as the reduction it selects.
enum class Ord { zero, one, two, inf, neg_inf, p };

Ord classify(double p) {
  if (p == 0) return Ord::zero;
  if (p == 1) return Ord::one;
  if (p == 2) return Ord::two;
  if (p == std::numeric_limits<double>::infinity()) return Ord::inf;
  if (p == -std::numeric_limits<double>::infinity()) return Ord::neg_inf;
  return Ord::p;
}

// max/min of |x| with NaN propagating (ATen's AbsMaxOps/AbsMinOps).
inline double nan_max(double a, double b) { return (std::isnan(a) || a >= b) ? a : b; }
inline double nan_min(double a, double b) { return (std::isnan(a) || a <= b) ? a : b; }

double identity(Ord o) { return o == Ord::neg_inf ? std::numeric_limits<double>::infinity() : 0.0; }

double combine(Ord o, double a, double b) {
  if (o == Ord::inf) return nan_max(a, b);
  if (o == Ord::neg_inf) return nan_min(a, b);
  return a + b;
}

// The partial reduction of n elements of type In, `stride` bytes apart,
// each scaled by `scale` first. Four accumulators: a double sum of
// float32 squares is latency-bound otherwise.
// Contiguous float32 (gradients): eight independent double accumulators,
// which the compiler turns into vector lanes.
template <Ord O>
double run_dense_f32(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) {
      const double v = static_cast<double>(x[j + k]);
      acc[k] += O == Ord::two ? v * v : std::fabs(v);
    }
  for (; j < n; ++j) {
    const double v = static_cast<double>(x[j]);
    acc[0] += O == Ord::two ? v * v : std::fabs(v);
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename In, Ord O>
double run(const char* p, int64_t stride, int64_t n, double p_value, double scale) {
  if constexpr (std::is_same_v<In, F32> && (O == Ord::two || O == Ord::one))
    if (stride == 4 && scale == 1.0) return run_dense_f32<O>(reinterpret_cast<const float*>(p), n);
  double acc[4] = {identity(O), identity(O), identity(O), identity(O)};
  auto value = [&](int64_t j) {
    typename In::E raw;
    std::memcpy(&raw, p + j * stride, sizeof raw);
    return std::fabs(static_cast<double>(In::load(raw))) * scale;
  };
  auto step = [&](double& a, double x) {
    if constexpr (O == Ord::zero)
      a += x != 0 ? 1.0 : 0.0;  // NaN counts, as ATen's NormZeroOps
    else if constexpr (O == Ord::one)
      a += x;
    else if constexpr (O == Ord::two)
      a += x * x;
    else if constexpr (O == Ord::inf)
      a = nan_max(a, x);
    else if constexpr (O == Ord::neg_inf)
      a = nan_min(a, x);
    else
      a += std::pow(x, p_value);
  };
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) step(acc[k], value(j + k));
  for (; j < n; ++j) step(acc[0], value(j));
  return combine(O, combine(O, acc[0], acc[1]), combine(O, acc[2], acc[3]));
}

using RunFn = double (*)(const char*, int64_t, int64_t, double, double);

template <typename In>
RunFn pick_for(Ord o) {
  switch (o) {
    case Ord::zero:
      return &run<In, Ord::zero>;
    case Ord::one:
      return &run<In, Ord::one>;
    case Ord::two:
      return &run<In, Ord::two>;
    case Ord::inf:
      return &run<In, Ord::inf>;
    case Ord::neg_inf:
      return &run<In, Ord::neg_inf>;
    default:
      return &run<In, Ord::p>;
  }
}

RunFn pick(DT d, Ord o) {
  switch (d) {
    case DT::f64:
      return pick_for<F64>(o);
    case DT::f16:
      return pick_for<F16>(o);
    case DT::bf16:
      return pick_for<BF16>(o);
    default:
      return pick_for<F32>(o);
  }
}

struct NormPlan {
  const char* base;
  Plan plan;
  DT dtype;
  Ord ord;
  double p;
};

// Elements [begin, end) of output o's reduction (in plan order).
double reduce_range(const NormPlan& np, Ord ord, double scale, int64_t o, int64_t begin, int64_t end) {
  const Plan& pl = np.plan;
  const RunFn fn = pick(np.dtype, ord);
  const char* ob = np.base + pl.out_offsets[static_cast<size_t>(o)];
  double acc = identity(ord);
  for (int64_t i = begin; i < end;) {
    const int64_t r = i / pl.run_len, j0 = i % pl.run_len;
    const int64_t j1 = std::min(pl.run_len, j0 + (end - i));
    acc = combine(ord, acc,
                  fn(ob + pl.run_offsets[static_cast<size_t>(r)] + j0 * pl.run_stride, pl.run_stride, j1 - j0,
                     np.p, scale));
    i += j1 - j0;
  }
  return acc;
}

// The accumulated (not yet finished) value of every output: outputs spread
// over the device's threads, or, for few long reductions, each reduction
// split in chunks combined in order.
std::vector<double> reduce_all(const Call& call, const NormPlan& np, Ord ord, double scale,
                               const std::vector<int64_t>& outputs) {
  const int64_t count = np.plan.count();
  const int64_t n = static_cast<int64_t>(outputs.size());
  std::vector<double> acc(static_cast<size_t>(n), identity(ord));
  const int64_t threads = std::max<int32_t>(1, call.num_threads());
  if (n >= threads || count < (1 << 15)) {
    call.parallel_for(0, n, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(count, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t i = b; i < e; ++i)
                          acc[static_cast<size_t>(i)] =
                              reduce_range(np, ord, scale, outputs[static_cast<size_t>(i)], 0, count);
                      });
    return acc;
  }
  const int64_t chunks = threads * 4, chunk = (count + chunks - 1) / chunks;
  std::vector<double> partial(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < n; ++i) {
    call.parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        partial[static_cast<size_t>(c)] =
            reduce_range(np, ord, scale, outputs[static_cast<size_t>(i)], std::min(count, c * chunk),
                         std::min(count, (c + 1) * chunk));
    });
    for (double v : partial) acc[static_cast<size_t>(i)] = combine(ord, acc[static_cast<size_t>(i)], v);
  }
  return acc;
}

double finish(Ord ord, double p, double acc) {
  if (ord == Ord::two) return std::sqrt(acc);
  if (ord == Ord::p) return std::pow(acc, 1.0 / p);
  return acc;
}

// Note [A float64 2-norm is rescaled]
// A double sum of squares overflows once |x| passes 1.3e154 and loses its
// digits to underflow below 1e-154, although the norm itself is
// representable (ATen's float64 kernel gives inf or 0 there). Only float64
// inputs can get there (the squares of float32 and half values fit a
// double). Those outputs are computed again as amax * sqrt(sum((x / amax)^2)),
// the scaling of LAPACK's dnrm2, at the cost of two more passes over them alone.
void rescale_float64(const Call& call, const NormPlan& np, const std::vector<double>& acc,
                     std::vector<double>& result) {
  std::vector<int64_t> redo;
  for (int64_t o = 0; o < np.plan.outputs; ++o) {
    const double a = acc[static_cast<size_t>(o)];
    if (std::isinf(a) || a < std::numeric_limits<double>::min() * 0x1p53) redo.push_back(o);
  }
  if (redo.empty()) return;
  const std::vector<double> amax = reduce_all(call, np, Ord::inf, 1.0, redo);
  for (size_t i = 0; i < redo.size(); ++i) {
    const double m = amax[i];
    if (!(m > 0 && std::isfinite(m))) continue;  // all zeros, an inf or a NaN: the plain sum is right
    // One output at a time: each has its own scale.
    const double ssq = reduce_all(call, np, Ord::two, 1.0 / m, {redo[i]})[0];
    result[static_cast<size_t>(redo[i])] = m * std::sqrt(ssq);
  }
}

// out[o] = the ord-norm of self's elements reduced into o.
void vector_norm(Call& call, const TensorRef& in, double p, const std::vector<int64_t>& dims, bool keepdim,
                 const TensorRef& out) {
  const std::vector<bool> mask = reduce_mask(call, dims, in.dim());
  check_out(call, out, reduced_shape(in.sizes(), mask, keepdim));
  NormPlan np{in.data<char>(), make_plan(in, mask), dt_of(in.dtype()), classify(p), p};
  const std::vector<int64_t> pos = element_offsets(out);
  const int64_t count = np.plan.count();
  std::vector<int64_t> all(static_cast<size_t>(np.plan.outputs));
  for (int64_t o = 0; o < np.plan.outputs; ++o) all[static_cast<size_t>(o)] = o;
  // One element: |x| (x != 0 for ord 0) exactly, as ATen's shortcut for
  // reductions over dims of size 1 (pow(pow(|x|, p), 1/p) is not |x|).
  const Ord ord = count == 1 && np.ord != Ord::zero ? Ord::inf : np.ord;
  const std::vector<double> acc = reduce_all(call, np, ord, 1.0, all);
  std::vector<double> result(acc.size());
  for (size_t o = 0; o < acc.size(); ++o) result[o] = finish(ord, p, acc[o]);
  if (ord == Ord::two && np.dtype == DT::f64) rescale_float64(call, np, acc, result);
  const DT od = dt_of(out.dtype());
  for (int64_t o = 0; o < np.plan.outputs; ++o)
    store<double>(out.data<char>() + pos[static_cast<size_t>(o)], od, result[static_cast<size_t>(o)]);
}

// ATen's check_linalg_norm_dtype, and the out tensor's dtype.
void check_norm_dtypes(const Call& call, DT in, int32_t dtype_index, const TensorRef& out) {
  DT want = in;
  if (!call.is_none(dtype_index)) {
    want = from_scalar_type(call.int_arg(dtype_index));
    if (!is_floating(want))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("linalg.vector_norm: dtype should be floating point or "
                            "complex, but got ") +
                    dt_name(want));
    if (promote(in, want) != want)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("linalg.vector_norm: the dtype of the input (") + dt_name(in) +
                    ") should be convertible without narrowing to the specified dtype (" + dt_name(want) +
                    ")");
  }
  if (dt_of(out.dtype()) != want)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("Expected out tensor to have dtype ") +
                                             demangled_type_name(want) + ", but got " +
                                             demangled_type_name(dt_of(out.dtype())) + " instead");
}

// aten::linalg_vector_norm.out(self, Scalar ord=2, int[1]? dim=None, keepdim, *, ScalarType? dtype, out)
void linalg_vector_norm(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(5);
  const DT d = dt_of(in.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("linalg.vector_norm: Expected a floating point or complex tensor as input. Got ") +
                  dt_name(d));
  const double p = call.scalar_arg(1);
  std::vector<int64_t> dims;
  const NpubValue& dv = call.arg(2);
  if (dv.tag == NPUB_VALUE_INT)
    dims = {dv.u.i};
  else if (dv.tag == NPUB_VALUE_INT_LIST)
    dims = call.int_list(2);
  // ATen's meta function: no identity for these ords on an empty reduction.
  if (in.numel() == 0 && (p < 0 || p == std::numeric_limits<double>::infinity())) {
    if (dims.empty())
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "linalg.vector_norm cannot compute the " + std::to_string(p) +
                                               " norm on an empty tensor because the operation does not have "
                                               "an identity");
    for (int64_t dim : dims) {
      const int64_t w = wrap_dim(call, dim, in.dim());
      if (in.dim() > 0 && in.size(static_cast<int32_t>(w)) == 0)
        call.fail(NPUB_ERR_INVALID_ARGUMENT,
                  "linalg.vector_norm cannot compute the " + std::to_string(p) + " norm on the dimension " +
                      std::to_string(w) +
                      " because this dimension is empty and the operation does not "
                      "have an identity");
    }
  }
  check_norm_dtypes(call, d, 4, out);
  vector_norm(call, in, p, dims, call.bool_arg(3), out);
}

// aten::norm.out(self, Scalar? p, int[1] dim, keepdim, *, out)
void norm(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  if (!is_floating(dt_of(in.dtype())))
    call.fail(
        NPUB_ERR_INVALID_ARGUMENT,
        std::string("norm(): input dtype should be floating point, but got ") + dt_name(dt_of(in.dtype())));
  vector_norm(call, in, call.is_none(1) ? 2.0 : call.scalar_arg(1), call.int_list(2), call.bool_arg(3), out);
}

}  // namespace

void register_norm(npub::sdk::Registrar& r) {
  const auto floating = dtypes_floating();
  r.op("aten::linalg_vector_norm.out(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, "
       "ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)",
       &linalg_vector_norm)
      .dtypes(floating)
      .arg_dtypes("out", floating);
  r.op("aten::norm.out(Tensor self, Scalar? p, int[1] dim, bool keepdim=False, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &norm)
      .dtypes(floating);
}

}  // namespace cann_like
