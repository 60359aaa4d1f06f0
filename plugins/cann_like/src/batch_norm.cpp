// BatchNorm: aten::native_batch_norm (training and eval) and its backward,
// and the _native_batch_norm_legit forms that torch.compile and export
// trace (with statistics, .no_stats, _no_training), on contiguous (N, C, *)
// tensors: registered contiguous-only, as the dispatcher's staging copy of
// a channels_last input beat reading it in place channel by channel (the
// figures are in the commit that chose it). ATen's CPU kernel
// (Normalization.cpp, cpu/batch_norm_kernel.cpp) reduces the statistics in
// double (float for the half types) and computes the elementwise parts in
// float as x * alpha + beta; here the statistics are in double and the
// elementwise part is (x - mean) * scale + shift, in double rounded once to
// the result's dtype, or for float32 in float with the mean as two floats,
// so a large-mean channel keeps its digits.
#include "common.h"
#include "elementwise.h"
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace cann_like {

namespace {

// Note [BatchNorm writes the running statistics in place]
// native_batch_norm updates running_mean and running_var in training, but
// its schema marks neither as written (Note [native_batch_norm writes what
// its schema hides] in python_ext/csrc/aten/fallback.cpp), and the
// dispatcher copies back only what a schema marks when it stages a tensor
// (a dtype conversion, a contiguous copy). So the kernels take every
// floating dtype natively and the per-channel tensors in any floating
// dtype (mixed_dtypes, checked here by ATen's rule): no dtype conversion
// ever stages a call. Of the contiguous copies, those of the input and
// grad_out are read-only; a non-contiguous running statistic (a strided
// view) would be staged and its update lost, so native_batch_norm's
// `supports` declines such calls, and the host's fallback serves them
// (writing the statistics back). _native_batch_norm_legit, whose schema
// marks the writes, shares the body and needs no such care.

// A contiguous (N, C, *) tensor as N runs of `inner` elements per channel:
// channel c's n-th run starts at element (n * C + c) * inner.
struct Planes {
  int64_t batch = 1, channels = 1, inner = 1;
  int64_t count() const { return batch * inner; }  // values per channel
  int64_t run(int64_t n, int64_t c) const { return (n * channels + c) * inner; }
};
Planes planes_of(const TensorRef& t) {
  Planes p;
  p.batch = t.size(0);
  p.channels = t.size(1);
  for (int32_t d = 2; d < t.dim(); ++d) p.inner *= t.size(d);
  return p;
}

// A per-channel vector (weight, statistics): element c through its stride.
struct ChannelVector {
  const TensorRef* t = nullptr;
  DT dt = DT::f32;
  bool defined() const { return t != nullptr && t->defined(); }
  double at(int64_t c, double absent) const {
    if (!defined()) return absent;
    return load<double>(t->data<char>() + c * t->stride(0) * dt_size(dt), dt);
  }
  void set(int64_t c, double v) const {
    store<double>(t->data<char>() + c * t->stride(0) * dt_size(dt), dt, v);
  }
};

std::string dims_str(const TensorRef& t) {
  return std::to_string(t.dim()) + "-dim tensor of shape " + shape_str(t.sizes());
}

// An IndexError, as ATen's (whose first read of dim 1 is out of range).
void check_input(const Call& call, const TensorRef& x, const char* name) {
  if (x.dim() < 2)
    call.fail(NPUB_ERR_INDEX,
              std::string(name) + ": expected an (N, C, *) tensor of at least 2 dims but found a " +
                  dims_str(x) + " (Dimension out of range (expected to be in range of [-1, 0], " +
                  "but got 1))");
}

void check_channels(const Call& call, const TensorRef& p, int64_t channels, const char* name) {
  if (p.defined() && (p.dim() != 1 || p.size(0) != channels))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected a 1-dim tensor of " +
                                             std::to_string(channels) +
                                             " elements (the input's channels) but found a " + dims_str(p));
}

// ATen's CPU dtype rule for BatchNorm's per-channel tensors (its
// checkMixedDataTypes): all of the input's dtype, or, for a float16 or
// bfloat16 input, all float32 ("mixed"), decided by the first one given.
// Returns the dtype of the per-channel results (save_mean, save_invstd,
// grad_weight, grad_bias).
DT param_dtype(const Call& call, DT input,
               std::initializer_list<std::pair<const TensorRef*, const char*>> params) {
  DT first = DT::unknown;
  for (const auto& [p, name] : params)
    if (p->defined()) {
      first = dt_of(p->dtype());
      break;
    }
  if (first == DT::unknown || first == input) {
    for (const auto& [p, name] : params)
      if (p->defined() && dt_of(p->dtype()) != input)
        call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected scalar type " + dt_name(input) +
                                                 " (the input's) but found " + dt_name(dt_of(p->dtype())));
    return input;
  }
  if (input != DT::f16 && input != DT::bf16)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("mixed dtype (CPU): all inputs must share same datatype: the input is ") +
                  dt_name(input) + ", a per-channel argument " + dt_name(first));
  for (const auto& [p, name] : params)
    if (p->defined() && dt_of(p->dtype()) != DT::f32)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("mixed dtype (CPU): expect parameter to have scalar type of Float: ") + name +
                    " is " + dt_name(dt_of(p->dtype())) + " with a " + dt_name(input) + " input");
  return DT::f32;
}

// The sum of f(i) over [0, len) in four interleaved double partial sums:
// the adds no longer wait on one another, and the order is fixed, so
// results do not depend on the threads.
template <class F>
double run_sum(int64_t len, F&& f) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= len; i += 4) {
    s0 += f(i);
    s1 += f(i + 1);
    s2 += f(i + 2);
    s3 += f(i + 3);
  }
  for (; i < len; ++i) s0 += f(i);
  return (s0 + s1) + (s2 + s3);
}

// ATen's InvStd: 1 / sqrt(var + eps), 0 when both are 0.
double inv_std(double var, double eps) { return (var == 0 && eps == 0) ? 0.0 : 1.0 / std::sqrt(var + eps); }

struct ForwardArgs {
  TensorRef input, weight, bias, running_mean, running_var;
  bool training = true;
  double momentum = 0, eps = 0;
};

// Calls fn(std::integral_constant<DT, d>{}) for the input's floating dtype
// `d` (the kernels are instantiated per storage dtype).
template <typename Fn>
void with_floating_input(Call& call, DT d, Fn&& fn) {
  switch (d) {
    case DT::f32:
      return fn(std::integral_constant<DT, DT::f32>{});
    case DT::f64:
      return fn(std::integral_constant<DT, DT::f64>{});
    case DT::f16:
      return fn(std::integral_constant<DT, DT::f16>{});
    case DT::bf16:
      return fn(std::integral_constant<DT, DT::bf16>{});
    default:
      call.fail(NPUB_ERR_UNSUPPORTED,
                std::string("input: expected a floating dtype but found ") + dt_name(d));
  }
}

template <DT D>
void normalize(Call& call, const ForwardArgs& a, int64_t channels, DT pd, const TensorRef& y,
               const TensorRef& save_mean, const TensorRef& save_invstd) {
  constexpr int64_t es = D == DT::f64 ? 8 : D == DT::f32 ? 4 : 2;
  const Planes pl = planes_of(a.input);
  const int64_t m = pl.count(), len = pl.inner;
  const ChannelVector w{&a.weight, a.weight.defined() ? dt_of(a.weight.dtype()) : pd};
  const ChannelVector b{&a.bias, a.bias.defined() ? dt_of(a.bias.dtype()) : pd};
  const ChannelVector rm{&a.running_mean, a.running_mean.defined() ? dt_of(a.running_mean.dtype()) : pd};
  const ChannelVector rv{&a.running_var, a.running_var.defined() ? dt_of(a.running_var.dtype()) : pd};
  const ChannelVector sm{&save_mean, pd}, si{&save_invstd, pd};
  const char* xb = a.input.data<char>();
  char* yb = y.data<char>();
  // Note [BatchNorm on small planes]
  // A ResNet's last stages have planes of 2x2 or 4x4: a loop call per
  // (sample, channel) run of 4 or 16 floats made the eval forward of
  // [16,256,2,2] 45 us against ATen's 29. Planes under kShortPlane floats
  // keep each channel's four float32 constants here, and the runs are
  // normalised afterwards, samples split over the threads, in one inline
  // loop per run. That loop is compiled for the baseline ISA (no FMA), so a
  // result may differ by an ulp from the per-ISA loop's of a larger plane;
  // both are within the few ulp of the double result said below.
  constexpr int64_t kShortPlane = 64;
  const bool short_f32 = D == DT::f32 && len < kShortPlane;
  std::vector<float> consts(short_f32 ? static_cast<size_t>(4 * channels) : 0);
  call.parallel_for(0, channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double mean, invstd;
      if (a.training) {
        // Two passes in double: the variance of a large-mean channel keeps
        // its digits (a one-pass sum of squares would cancel them away).
        double sum = 0;
        for (int64_t n = 0; n < pl.batch; ++n) {
          const char* xr = xb + pl.run(n, c) * es;
          sum += run_sum(len, [&](int64_t i) { return load<double>(xr + i * es, D); });
        }
        mean = sum / static_cast<double>(m);
        double var_sum = 0;
        for (int64_t n = 0; n < pl.batch; ++n) {
          const char* xr = xb + pl.run(n, c) * es;
          var_sum += run_sum(len, [&](int64_t i) {
            const double t = load<double>(xr + i * es, D) - mean;
            return t * t;
          });
        }
        invstd = inv_std(var_sum / static_cast<double>(m), a.eps);
        sm.set(c, mean);
        si.set(c, invstd);
        if (rm.defined()) rm.set(c, a.momentum * mean + (1 - a.momentum) * rm.at(c, 0));
        if (rv.defined())
          rv.set(c, a.momentum * (var_sum / static_cast<double>(m - 1)) + (1 - a.momentum) * rv.at(c, 1));
      } else {
        mean = rm.at(c, 0);
        invstd = 1.0 / std::sqrt(rv.at(c, 1) + a.eps);
      }
      // (x - mean) * invstd * w + b, not x * alpha + beta: that form
      // cancels |mean| * invstd * w against the bias for large-mean inputs.
      const double scale = invstd * w.at(c, 1.0), shift = b.at(c, 0.0);
      if constexpr (D == DT::f32) {
        // In float, with the mean as a sum of two floats: x - hi is exact
        // where it cancels (Sterbenz), so the result is within a few ulp
        // of the one rounded from double, at twice the vector width.
        const float hi = static_cast<float>(mean), lo = static_cast<float>(mean - static_cast<double>(hi));
        const float sc = static_cast<float>(scale), sh = static_cast<float>(shift);
        if (short_f32) {
          float* k = consts.data() + 4 * c;
          k[0] = hi, k[1] = lo, k[2] = sc, k[3] = sh;
          continue;
        }
        auto fn = [ hi, lo, sc, sh ](float v) __attribute__((always_inline)) {
          return ((v - hi) - lo) * sc + sh;
        };
        for (int64_t n = 0; n < pl.batch; ++n) {
          const float* xr = reinterpret_cast<const float*>(xb) + pl.run(n, c);
          float* yr = reinterpret_cast<float*>(yb) + pl.run(n, c);
          run_at_kernel_isa<F32Loop1>(yr, xr, len, fn);  // Note [float32 elementwise loops per ISA level]
        }
        continue;
      }
      for (int64_t n = 0; n < pl.batch; ++n) {
        const char* xr = xb + pl.run(n, c) * es;
        char* yr = yb + pl.run(n, c) * es;
        for (int64_t i = 0; i < len; ++i)
          store<double>(yr + i * es, D, (load<double>(xr + i * es, D) - mean) * scale + shift);
      }
    }
  });
  if (!short_f32) return;
  // See Note [BatchNorm on small planes].
  const float* x = a.input.data<float>();
  float* out = y.data<float>();
  const int64_t sample = channels * len;
  call.parallel_for(0, pl.batch, std::max<int64_t>(1, 4096 / std::max<int64_t>(sample, 1)),
                    [&](int64_t n0, int64_t n1) {
                      for (int64_t n = n0; n < n1; ++n)
                        for (int64_t c = 0; c < channels; ++c) {
                          const float* k = consts.data() + 4 * c;
                          const float hi = k[0], lo = k[1], sc = k[2], sh = k[3];
                          const float* xr = x + n * sample + c * len;
                          float* yr = out + n * sample + c * len;
                          for (int64_t i = 0; i < len; ++i) yr[i] = ((xr[i] - hi) - lo) * sc + sh;
                        }
                    });
}

void batch_norm_forward(Call& call, const ForwardArgs& a) {
  const TensorRef& x = a.input;
  check_input(call, x, "input");
  const int64_t channels = x.size(1);
  check_channels(call, a.weight, channels, "weight");
  check_channels(call, a.bias, channels, "bias");
  check_channels(call, a.running_mean, channels, "running_mean");
  check_channels(call, a.running_var, channels, "running_var");
  const DT d = dt_of(x.dtype());
  const DT pd = param_dtype(call, d,
                            {{&a.weight, "weight"},
                             {&a.bias, "bias"},
                             {&a.running_mean, "running_mean"},
                             {&a.running_var, "running_var"}});
  if (!a.training && (!a.running_mean.defined() || !a.running_var.defined()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(a.running_mean.defined() ? "running_var" : "running_mean") +
                  " must be defined in evaluation mode");
  if (a.training && x.numel() == 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "input tensor must have at least one element, but got input_sizes = " + shape_str(x.sizes()));
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  const int64_t stat = a.training ? channels : 0;  // eval returns empty statistics, as ATen
  TensorRef save_mean = call.output(1, {stat}, to_dl(pd));
  TensorRef save_invstd = call.output(2, {stat}, to_dl(pd));
  if (call.is_meta() || x.numel() == 0) return;
  with_floating_input(call, d, [&](auto tag) {
    normalize<decltype(tag)::value>(call, a, channels, pd, y, save_mean, save_invstd);
  });
}

// aten::native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
//   -> (out, save_mean, save_invstd); also _native_batch_norm_legit (running stats Tensor(a!)).
void native_batch_norm(Call& call) {
  ForwardArgs a{call.tensor(0),          call.optional_tensor(1), call.optional_tensor(2),
                call.optional_tensor(3), call.optional_tensor(4), call.bool_arg(5),
                call.double_arg(6),      call.double_arg(7)};
  batch_norm_forward(call, a);
}

// aten::_native_batch_norm_legit.no_stats(input, weight?, bias?, training, momentum, eps)
void batch_norm_no_stats(Call& call) {
  ForwardArgs a{call.tensor(0), call.optional_tensor(1), call.optional_tensor(2), TensorRef(),
                TensorRef(),    call.bool_arg(3),        call.double_arg(4),      call.double_arg(5)};
  batch_norm_forward(call, a);
}

// aten::_native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum, eps)
void batch_norm_no_training(Call& call) {
  ForwardArgs a{call.tensor(0),     call.optional_tensor(1), call.optional_tensor(2),
                call.tensor(3),     call.tensor(4),          false,
                call.double_arg(5), call.double_arg(6)};
  batch_norm_forward(call, a);
}

struct BackwardArgs {
  TensorRef grad_out, input, weight, running_mean, running_var, save_mean, save_invstd;
  bool train = true;
  double eps = 0;
  bool mask[3] = {true, true, true};
};

// Note [BatchNorm backward in float32 per ISA level]
// A float32 channel's two sums (dy, and (x - mean) dy) are taken in double
// lanes, 16 a sum, combined by halves, and its grad_input in float32 with the
// mean as a sum of two floats (as the forward's normalisation), both in
// loops per ISA level that walk every sample's run of the channel in one
// call: the generic double loop, at baseline ISA and a call per run, took
// 4x ATen's time on a ResNet's [16, 64, 8, 8]. The sums stay more accurate
// than ATen's float ones; grad_input, computed in float as ATen's is, is
// within a few ulp of its largest term (dy - mean(dy) - (x - mean) k can
// cancel), inside the CPU's own float32 error.
PLUGIN_KERNELS_INLINE void bn_grad_sums_f32_body(const float* x, const float* g, int64_t batch,
                                                 int64_t stride, int64_t len, double mean, double* sum,
                                                 double* dot) {
  constexpr int kLanes = 16;
  double s[kLanes] = {}, d[kLanes] = {};
  for (int64_t n = 0; n < batch; ++n) {
    const float* xr = x + n * stride;
    const float* gr = g + n * stride;
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const double gv = static_cast<double>(gr[i + l]);
        s[l] += gv;
        d[l] += (static_cast<double>(xr[i + l]) - mean) * gv;
      }
    for (; i < len; ++i) {  // the tail in lanes too: short planes' runs add up across samples
      const double gv = static_cast<double>(gr[i]);
      s[i % kLanes] += gv;
      d[i % kLanes] += (static_cast<double>(xr[i]) - mean) * gv;
    }
  }
  *sum = sum_lanes_by_halves(s);
  *dot = sum_lanes_by_halves(d);
}
PLUGIN_KERNELS_ISA_DISPATCH(void, bn_grad_sums_f32, bn_grad_sums_f32_body,
                            (const float* x, const float* g, int64_t batch, int64_t stride, int64_t len,
                             double mean, double* sum, double* dot),
                            (x, g, batch, stride, len, mean, sum, dot))

// Training's dx = (dy - mean(dy) - (x - mean) * k) * scale over every
// sample's run of one channel (k = dotp * invstd^2 / m, scale = invstd * w).
PLUGIN_KERNELS_INLINE void bn_grad_input_f32_body(const float* x, const float* g, float* o, int64_t batch,
                                                  int64_t stride, int64_t len, float hi, float lo, float k,
                                                  float grad_mean, float scale) {
  for (int64_t n = 0; n < batch; ++n) {
    const float* xr = x + n * stride;
    const float* gr = g + n * stride;
    float* orow = o + n * stride;
    for (int64_t i = 0; i < len; ++i) orow[i] = ((gr[i] - grad_mean) - ((xr[i] - hi) - lo) * k) * scale;
  }
}
PLUGIN_KERNELS_ISA_DISPATCH(void, bn_grad_input_f32, bn_grad_input_f32_body,
                            (const float* x, const float* g, float* o, int64_t batch, int64_t stride,
                             int64_t len, float hi, float lo, float k, float grad_mean, float scale),
                            (x, g, o, batch, stride, len, hi, lo, k, grad_mean, scale))

template <DT D>
void batch_norm_grads(Call& call, const BackwardArgs& a, int64_t channels, DT pd, const TensorRef& gi,
                      const TensorRef& gw, const TensorRef& gb) {
  constexpr int64_t es = D == DT::f64 ? 8 : D == DT::f32 ? 4 : 2;
  const Planes pl = planes_of(a.input);
  const int64_t m = pl.count(), len = pl.inner;
  auto vec = [&](const TensorRef& t) { return ChannelVector{&t, t.defined() ? dt_of(t.dtype()) : pd}; };
  const ChannelVector w = vec(a.weight), rm = vec(a.running_mean), rv = vec(a.running_var),
                      sm = vec(a.save_mean), si = vec(a.save_invstd), gwv{&gw, pd}, gbv{&gb, pd};
  const char* xb = a.input.data<char>();
  const char* gob = a.grad_out.data<char>();
  char* gib = gi.defined() ? gi.data<char>() : nullptr;
  call.parallel_for(0, channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double mean = a.train ? sm.at(c, 0) : rm.at(c, 0);
      const double invstd = a.train ? si.at(c, 1) : 1.0 / std::sqrt(rv.at(c, 1) + a.eps);
      double sum = 0, dotp = 0;  // sum dy, sum (x - mean) dy
      if constexpr (D == DT::f32) {
        if (a.train) {  // Note [BatchNorm backward in float32 per ISA level]
          const float* x = reinterpret_cast<const float*>(xb) + pl.run(0, c);
          const float* g = reinterpret_cast<const float*>(gob) + pl.run(0, c);
          const int64_t stride = channels * len;
          bn_grad_sums_f32(x, g, pl.batch, stride, len, mean, &sum, &dotp);
          if (gib != nullptr) {
            const double k = dotp * invstd * invstd / static_cast<double>(m);
            const float hi = static_cast<float>(mean),
                        lo = static_cast<float>(mean - static_cast<double>(hi));
            bn_grad_input_f32(x, g, reinterpret_cast<float*>(gib) + pl.run(0, c), pl.batch, stride, len, hi,
                              lo, static_cast<float>(k), static_cast<float>(sum / static_cast<double>(m)),
                              static_cast<float>(invstd * w.at(c, 1.0)));
          }
          if (gw.defined()) gwv.set(c, dotp * invstd);
          if (gb.defined()) gbv.set(c, sum);
          continue;
        }
      }
      for (int64_t n = 0; n < pl.batch; ++n) {
        const char* xr = xb + pl.run(n, c) * es;
        const char* gr = gob + pl.run(n, c) * es;
        sum += run_sum(len, [&](int64_t i) { return load<double>(gr + i * es, D); });
        dotp += run_sum(len, [&](int64_t i) {
          return (load<double>(xr + i * es, D) - mean) * load<double>(gr + i * es, D);
        });
      }
      if (gib != nullptr) {
        const double wc = w.at(c, 1.0), scale = invstd * wc;
        // train: dx = (dy - mean(dy) - (x - mean) * dotp * invstd^2 / m) * invstd * w;
        // eval: dx = dy * invstd * w.
        const double k = a.train ? dotp * invstd * invstd / static_cast<double>(m) : 0,
                     grad_mean = a.train ? sum / static_cast<double>(m) : 0;
        for (int64_t n = 0; n < pl.batch; ++n) {
          const char* xr = xb + pl.run(n, c) * es;
          const char* gr = gob + pl.run(n, c) * es;
          char* ir = gib + pl.run(n, c) * es;
          for (int64_t i = 0; i < len; ++i) {
            const double dy = load<double>(gr + i * es, D);
            const double v =
                a.train ? (dy - grad_mean - (load<double>(xr + i * es, D) - mean) * k) * scale : dy * scale;
            store<double>(ir + i * es, D, v);
          }
        }
      }
      if (gw.defined()) gwv.set(c, dotp * invstd);
      if (gb.defined()) gbv.set(c, sum);
    }
  });
}

// aten::native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
//     save_invstd?, train, eps, bool[3] output_mask) -> (grad_input, grad_weight, grad_bias)
void native_batch_norm_backward(Call& call) {
  BackwardArgs a{call.tensor(0),          call.tensor(1),          call.optional_tensor(2),
                 call.optional_tensor(3), call.optional_tensor(4), call.optional_tensor(5),
                 call.optional_tensor(6), call.bool_arg(7),        call.double_arg(8)};
  const auto mask = call.int_list(9);
  if (mask.size() != 3)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "output_mask: expected 3 values but found " + std::to_string(mask.size()));
  for (size_t i = 0; i < 3; ++i) a.mask[i] = mask[i] != 0;
  const TensorRef& x = a.input;
  check_input(call, x, "input");
  if (a.grad_out.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_out: expected the input's shape " + shape_str(x.sizes()) +
                                             " but found " + shape_str(a.grad_out.sizes()));
  const DT d = dt_of(x.dtype());
  if (dt_of(a.grad_out.dtype()) != d)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("grad_out: expected the input's dtype ") + dt_name(d) +
                                             " but found " + dt_name(dt_of(a.grad_out.dtype())));
  const int64_t channels = x.size(1);
  check_channels(call, a.weight, channels, "weight");
  check_channels(call, a.running_mean, channels, "running_mean");
  check_channels(call, a.running_var, channels, "running_var");
  if (!a.train) {  // not read in eval (autograd passes the forward's empty ones)
    a.save_mean = TensorRef();
    a.save_invstd = TensorRef();
  }
  check_channels(call, a.save_mean, channels, "save_mean");
  check_channels(call, a.save_invstd, channels, "save_invstd");
  const DT pd = param_dtype(call, d,
                            {{&a.weight, "weight"},
                             {&a.running_mean, "running_mean"},
                             {&a.running_var, "running_var"},
                             {&a.save_mean, "save_mean"},
                             {&a.save_invstd, "save_invstd"}});
  if (a.train && (!a.save_mean.defined() || !a.save_invstd.defined()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "save_mean and save_invstd: expected both in training (train=True)");
  if (!a.train && (!a.running_mean.defined() || !a.running_var.defined()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "running_mean and running_var: expected both in evaluation (train=False)");
  TensorRef gi, gw, gb;
  if (a.mask[0]) gi = call.output(0, x.sizes(), x.dtype());
  if (a.mask[1]) gw = call.output(1, {channels}, to_dl(pd));
  if (a.mask[2]) gb = call.output(2, {channels}, to_dl(pd));
  if (call.is_meta() || (!a.mask[0] && !a.mask[1] && !a.mask[2])) return;
  with_floating_input(
      call, d, [&](auto tag) { batch_norm_grads<decltype(tag)::value>(call, a, channels, pd, gi, gw, gb); });
}

// native_batch_norm's running statistics, when given, are contiguous
// (Note [BatchNorm writes the running statistics in place]).
int32_t running_stats_contiguous(void*, const NpubValue* args, int32_t num_args) {
  for (int32_t i = 3; i <= 4 && i < num_args; ++i) {
    if (args[i].tag != NPUB_VALUE_TENSOR) continue;
    const DLTensor* t = args[i].u.tensor;
    if (t->ndim == 1 && t->shape[0] > 1 && t->strides != nullptr && t->strides[0] != 1) return 0;
  }
  return 1;
}

}  // namespace

void register_batch_norm(npub::sdk::Registrar& r) {
  // Note [BatchNorm writes the running statistics in place]: native dtypes
  // and mixed per-channel dtypes (no conversion), contiguous-only with
  // contiguous running statistics.
  const auto floating = dtypes_floating();
  r.op("aten::native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? "
       "running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
       &native_batch_norm)
      .dtypes(floating)
      .mixed_dtypes()
      .contiguous_only()
      .supports(&running_stats_contiguous);
  r.op("aten::_native_batch_norm_legit(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!) running_mean, "
       "Tensor(b!) running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
       &native_batch_norm)
      .dtypes(floating)
      .mixed_dtypes()
      .contiguous_only();
  r.op("aten::_native_batch_norm_legit.no_stats(Tensor input, Tensor? weight, Tensor? bias, bool training, "
       "float momentum, float eps) -> (Tensor, Tensor, Tensor)",
       &batch_norm_no_stats)
      .dtypes(floating)
      .mixed_dtypes()
      .contiguous_only();
  r.op("aten::_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor "
       "running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
       &batch_norm_no_training)
      .dtypes(floating)
      .mixed_dtypes()
      .contiguous_only();
  r.op("aten::native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? "
       "running_mean, "
       "Tensor? running_var, Tensor? save_mean, Tensor? save_invstd, bool train, float eps, bool[3] "
       "output_mask) -> (Tensor, Tensor, Tensor)",
       &native_batch_norm_backward)
      .dtypes(floating)
      .mixed_dtypes()
      .contiguous_only();
}

}  // namespace cann_like
