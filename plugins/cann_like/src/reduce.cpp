// Reductions over dim lists (sum, mean, prod, amax, amin, max.dim, min.dim,
// argmax, argmin, var, std, norm, all, any), cumsum, and softmax /
// log_softmax with their backward.
//
// Floating sums accumulate in double (more accurate than the inputs need);
// half types accumulate in float at least, as ATen does.
#include "elementwise.h"
#include "ops.h"

#include <cmath>
#include <limits>
#include <optional>

namespace cann_like {

namespace {

// ---------------------------------------------------------------------------
// the plan
// ---------------------------------------------------------------------------

// For each output element: where its reduced elements are. The reduced dims
// are merged where contiguous; the last one is walked as a run of run_len
// elements spaced run_stride bytes; the others are enumerated in run_offsets.
struct Plan {
  int64_t outputs = 1;
  std::vector<int64_t> out_offsets;  // byte offsets into the input
  std::vector<int64_t> run_offsets;  // byte offsets of runs within one reduction
  int64_t run_len = 1;
  int64_t run_stride = 0;
  int64_t count() const { return static_cast<int64_t>(run_offsets.size()) * run_len; }
};

std::vector<int64_t> enumerate_offsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<int64_t> offs{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offs.size() * static_cast<size_t>(std::max<int64_t>(sizes[d], 0)));
    for (int64_t o : offs)
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(o + i * strides[d]);
    offs.swap(next);
  }
  return offs;
}

Plan make_plan(const TensorRef& t, const std::vector<bool>& mask) {
  Plan p;
  const int64_t es = dt_size(dt_of(t.dtype()));
  std::vector<int64_t> ks, kst, rs, rst;
  for (int32_t d = 0; d < t.dim(); ++d) {
    if (mask[static_cast<size_t>(d)]) {
      // Merge with the previous reduced dim when memory-adjacent.
      if (!rs.empty() && rst.back() == t.size(d) * t.stride(d) * es && t.size(d) != 0) {
        rs.back() *= t.size(d);
        rst.back() = t.stride(d) * es;
      } else if (t.size(d) != 1 || rs.empty()) {
        rs.push_back(t.size(d));
        rst.push_back(t.stride(d) * es);
      }
    } else {
      ks.push_back(t.size(d));
      kst.push_back(t.stride(d) * es);
    }
  }
  if (!rs.empty()) {
    p.run_len = rs.back();
    p.run_stride = rst.back();
    rs.pop_back();
    rst.pop_back();
  }
  p.run_offsets = enumerate_offsets(rs, rst);
  p.out_offsets = enumerate_offsets(ks, kst);
  p.outputs = static_cast<int64_t>(p.out_offsets.size());
  return p;
}

// Byte offsets of a tensor's elements in row-major order.
std::vector<int64_t> element_offsets(const TensorRef& t) {
  const int64_t es = dt_size(dt_of(t.dtype()));
  std::vector<int64_t> strides;
  for (int32_t d = 0; d < t.dim(); ++d) strides.push_back(t.stride(d) * es);
  return enumerate_offsets(t.sizes(), strides);
}

// Runs a reducer over every output. R provides: using Acc; Acc init();
// void step(Acc&, V value, int64_t index); void combine(Acc&, const Acc&)
// (partials of lower indices first); and a finish handled by `emit(o, acc)`.
template <typename V, typename R, typename Emit>
void run_reduce(const Call& call, const TensorRef& in, const Plan& p, R& red, Emit&& emit) {
  const DT d = dt_of(in.dtype());
  const char* base = in.data<char>();
  const int64_t count = p.count();
  auto reduce_range = [&](int64_t o, int64_t begin, int64_t end) {
    auto acc = red.init();
    const char* ob = base + p.out_offsets[static_cast<size_t>(o)];
    for (int64_t i = begin; i < end;) {
      const int64_t run = i / p.run_len;
      const int64_t j0 = i % p.run_len;
      const int64_t j1 = std::min(p.run_len, j0 + (end - i));
      const char* rb = ob + p.run_offsets[static_cast<size_t>(run)];
      for (int64_t j = j0; j < j1; ++j) red.step(acc, load<V>(rb + j * p.run_stride, d), run * p.run_len + j);
      i += j1 - j0;
    }
    return acc;
  };
  const int64_t threads = std::max<int32_t>(1, call.num_threads());
  if (p.outputs >= threads || count < (1 << 15)) {
    call.parallel_for(0, p.outputs, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(count, 1)),
                      [&](int64_t b, int64_t e) {
                        for (int64_t o = b; o < e; ++o) emit(o, reduce_range(o, 0, count));
                      });
    return;
  }
  // Few outputs, long reductions: split each reduction and combine in order.
  for (int64_t o = 0; o < p.outputs; ++o) {
    const int64_t chunks = threads * 4;
    const int64_t chunk = (count + chunks - 1) / chunks;
    std::vector<decltype(red.init())> partial(static_cast<size_t>(chunks), red.init());
    call.parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        partial[static_cast<size_t>(c)] = reduce_range(o, std::min(count, c * chunk), std::min(count, (c + 1) * chunk));
    });
    auto acc = red.init();
    for (auto& part : partial) red.combine(acc, part);
    emit(o, acc);
  }
}

// ---------------------------------------------------------------------------
// argument helpers
// ---------------------------------------------------------------------------

// int[1]? dim / int[1] dim / int dim / int? dim as a list (empty = all).
std::vector<int64_t> dims_arg(const Call& call, int32_t i) {
  const NpubValue& v = call.arg(i);
  if (v.tag == NPUB_VALUE_NONE) return {};
  if (v.tag == NPUB_VALUE_INT) return {v.u.i};
  return call.int_list(i);
}

DT dtype_arg(const Call& call, int32_t i, DT fallback) {
  if (call.is_none(i)) return fallback;
  const DT d = from_scalar_type(call.int_arg(i));
  if (d == DT::unknown) call.fail(NPUB_ERR_UNSUPPORTED, "unsupported dtype argument " + std::to_string(call.int_arg(i)));
  return d;
}

struct Reduction {
  TensorRef in, out;
  std::vector<bool> mask;
  Shape out_shape;
  Plan plan;
  std::vector<int64_t> out_pos;  // byte offsets of output elements
};

Reduction prepare(const Call& call, const TensorRef& in, const std::vector<int64_t>& dims, bool keepdim,
                  const TensorRef& out, bool empty_means_none = false) {
  Reduction r;
  r.in = in;
  r.out = out;
  r.mask = reduce_mask(call, dims, in.dim());
  if (empty_means_none && dims.empty()) r.mask.assign(r.mask.size(), false);
  r.out_shape = reduced_shape(in.sizes(), r.mask, keepdim);
  check_out(call, out, r.out_shape);
  r.plan = make_plan(in, r.mask);
  r.out_pos = element_offsets(out);
  return r;
}

template <typename T>
void put(const Reduction& r, const TensorRef& out, const std::vector<int64_t>& pos, int64_t o, T v) {
  (void)r;
  store<T>(out.data<char>() + pos[static_cast<size_t>(o)], dt_of(out.dtype()), v);
}

// ---------------------------------------------------------------------------
// reducers
// ---------------------------------------------------------------------------

template <typename A>
struct SumR {
  using Acc = A;
  A init() const { return A(0); }
  template <typename V>
  void step(A& a, V v, int64_t) const { a += static_cast<A>(v); }
  void combine(A& a, const A& b) const { a += b; }
};
template <typename A>
struct ProdR {
  A init() const { return A(1); }
  template <typename V>
  void step(A& a, V v, int64_t) const { a *= static_cast<A>(v); }
  void combine(A& a, const A& b) const { a *= b; }
};
// max/min with NaN propagation and the first index of the extreme value.
template <typename V, bool kMax>
struct ExtremeR {
  struct Acc {
    V value;
    int64_t index;
    bool nan;
  };
  Acc init() const {
    return {kMax ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max(), -1, false};
  }
  void step(Acc& a, V v, int64_t i) const {
    if (a.nan) return;
    if constexpr (std::is_floating_point_v<V>) {
      if (std::isnan(v)) {
        a = {v, i, true};
        return;
      }
    }
    if (a.index < 0 || (kMax ? v > a.value : v < a.value)) a = {v, i, false};
  }
  void combine(Acc& a, const Acc& b) const {
    if (b.index < 0 || a.nan) return;
    if (b.nan || a.index < 0 || (kMax ? b.value > a.value : b.value < a.value)) a = b;
  }
};
struct MomentsR {  // Welford-free two-accumulator (sum, sum of squares around a shift)
  struct Acc {
    double n, mean, m2;
  };
  Acc init() const { return {0, 0, 0}; }
  template <typename V>
  void step(Acc& a, V v, int64_t) const {
    const double x = static_cast<double>(v);
    a.n += 1;
    const double d = x - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (x - a.mean);
  }
  void combine(Acc& a, const Acc& b) const {
    if (b.n == 0) return;
    if (a.n == 0) {
      a = b;
      return;
    }
    const double n = a.n + b.n;
    const double d = b.mean - a.mean;
    a.m2 += b.m2 + d * d * a.n * b.n / n;
    a.mean += d * b.n / n;
    a.n = n;
  }
};
struct NormR {
  double p;
  struct Acc {
    double v;
  };
  Acc init() const { return {0}; }
  template <typename V>
  void step(Acc& a, V x, int64_t) const {
    const double ax = std::fabs(static_cast<double>(x));
    if (std::isinf(p)) a.v = (std::isnan(ax) || ax > a.v) ? ax : a.v;
    else if (p == 0) a.v += ax != 0;
    else if (p == 1) a.v += ax;
    else if (p == 2) a.v += ax * ax;
    else a.v += std::pow(ax, p);
  }
  void combine(Acc& a, const Acc& b) const {
    if (std::isinf(p)) a.v = (std::isnan(b.v) || b.v > a.v) ? b.v : a.v;
    else a.v += b.v;
  }
};
template <bool kAll>
struct BoolR {
  struct Acc {  // not a bare bool: partials live in a std::vector
    bool v;
  };
  Acc init() const { return {kAll}; }
  template <typename V>
  void step(Acc& a, V v, int64_t) const {
    if (kAll) a.v = a.v && (v != V(0));
    else a.v = a.v || (v != V(0));
  }
  void combine(Acc& a, const Acc& b) const { a.v = kAll ? (a.v && b.v) : (a.v || b.v); }
};

// Reads in as V = the input's compute type (float for halves).
template <typename F>
void visit_input(DT d, F&& f) {
  visit_compute(d, std::forward<F>(f));
}

// ---------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------

// aten::sum.IntList_out(self, int[1]? dim, keepdim, *, ScalarType? dtype, out)
// aten::mean.out(self, int[1]? dim, keepdim, *, ScalarType? dtype, out)
template <bool kMean>
void sum_mean(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  const DT def = is_integral(d, true) ? (kMean ? DT::unknown : DT::i64) : d;
  const DT od = dtype_arg(call, 3, def);
  if (kMean && !is_floating(od))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("mean(): could not infer output dtype. Input dtype must be either a "
                                                     "floating point or complex dtype. Got: ") + dt_name(od == DT::unknown ? d : od));
  if (dt_of(out.dtype()) != od)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") + dt_name(od) + " but found " + dt_name(dt_of(out.dtype())));
  Reduction r = prepare(call, in, dims_arg(call, 1), call.bool_arg(2), out);
  const int64_t count = r.plan.count();
  visit_input(d, [&](auto tag) {
    using V = decltype(tag);
    if constexpr (std::is_floating_point_v<V> || kMean) {
      SumR<double> red;
      run_reduce<double>(call, in, r.plan, red, [&](int64_t o, double acc) {
        put<double>(r, out, r.out_pos, o, kMean ? (count == 0 ? std::nan("") : acc / static_cast<double>(count)) : acc);
      });
    } else {
      SumR<int64_t> red;
      run_reduce<int64_t>(call, in, r.plan, red, [&](int64_t o, int64_t acc) { put<int64_t>(r, out, r.out_pos, o, acc); });
    }
  });
}

// aten::prod.int_out(self, int dim, keepdim, *, ScalarType? dtype, out)
void prod(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  const DT od = dtype_arg(call, 3, is_integral(d, true) ? DT::i64 : d);
  if (dt_of(out.dtype()) != od)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") + dt_name(od) + " but found " + dt_name(dt_of(out.dtype())));
  Reduction r = prepare(call, in, {call.int_arg(1)}, call.bool_arg(2), out);
  if (is_floating(d)) {
    ProdR<double> red;
    run_reduce<double>(call, in, r.plan, red, [&](int64_t o, double acc) { put<double>(r, out, r.out_pos, o, acc); });
  } else {
    ProdR<int64_t> red;
    run_reduce<int64_t>(call, in, r.plan, red, [&](int64_t o, int64_t acc) { put<int64_t>(r, out, r.out_pos, o, acc); });
  }
}

void check_nonempty(const Call& call, const Reduction& r, const char* what) {
  if (r.plan.count() == 0 && r.plan.outputs > 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(what) + "(): Expected reduction dim to be specified for input.numel() == 0. "
                                                             "Specify the reduction dim with the 'dim' argument.");
}

// aten::amax.out / aten::amin.out(self, int[1] dim=[], keepdim, *, out)
template <bool kMax>
void amax_amin(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  if (dt_of(out.dtype()) != dt_of(in.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("Expected the dtype for input and out to match, but got ") +
                                             dt_name(dt_of(in.dtype())) + " for input's dtype and " + dt_name(dt_of(out.dtype())) +
                                             " for out's dtype.");
  Reduction r = prepare(call, in, call.int_list(1), call.bool_arg(2), out);
  check_nonempty(call, r, kMax ? "amax" : "amin");
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    ExtremeR<V, kMax> red;
    run_reduce<V>(call, in, r.plan, red, [&](int64_t o, const auto& acc) { put<V>(r, out, r.out_pos, o, acc.value); });
  });
}

// aten::max.dim_max / aten::min.dim_min(self, int dim, keepdim, *, values!, indices!)
template <bool kMax>
void max_min_dim(Call& call) {
  TensorRef in = call.tensor(0), values = call.tensor(3), indices = call.tensor(4);
  const int64_t dim = wrap_dim(call, call.int_arg(1), in.dim());
  if (in.dim() > 0 && in.size(static_cast<int32_t>(dim)) == 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kMax ? "max" : "min") + "(): Expected reduction dim " + std::to_string(dim) +
                                             " to have non-zero size.");
  if (dt_of(indices.dtype()) != DT::i64) call.fail(NPUB_ERR_INVALID_ARGUMENT, "indices: expected dtype int64");
  Reduction r = prepare(call, in, {dim}, call.bool_arg(2), values);
  check_out(call, indices, r.out_shape, "indices");
  const std::vector<int64_t> ipos = element_offsets(indices);
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    ExtremeR<V, kMax> red;
    run_reduce<V>(call, in, r.plan, red, [&](int64_t o, const auto& acc) {
      put<V>(r, values, r.out_pos, o, acc.value);
      put<int64_t>(r, indices, ipos, o, std::max<int64_t>(acc.index, 0));
    });
  });
}

// aten::argmax.out / aten::argmin.out(self, int? dim, keepdim, *, out)
template <bool kMax>
void arg_extreme(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  if (dt_of(out.dtype()) != DT::i64) call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected dtype int64");
  const bool flat = call.is_none(1);
  const bool keepdim = call.bool_arg(2);
  if (in.numel() == 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kMax ? "argmax" : "argmin") +
                                             "(): Expected reduction dim to be specified for input.numel() == 0.");
  Reduction r = prepare(call, in, flat ? std::vector<int64_t>{} : std::vector<int64_t>{call.int_arg(1)}, flat ? false : keepdim, out);
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    ExtremeR<V, kMax> red;
    run_reduce<V>(call, in, r.plan, red, [&](int64_t o, const auto& acc) { put<int64_t>(r, out, r.out_pos, o, acc.index); });
  });
}

// aten::var.correction_out / aten::std.correction_out(self, int[1]? dim, *, Scalar? correction, keepdim, out)
template <bool kStd>
void var_std(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kStd ? "std" : "var") + " only supports floating-point dtypes, but found " + dt_name(d));
  const double correction = call.is_none(2) ? 1.0 : call.scalar_arg(2);
  Reduction r = prepare(call, in, dims_arg(call, 1), call.bool_arg(3), out);
  MomentsR red;
  run_reduce<double>(call, in, r.plan, red, [&](int64_t o, const MomentsR::Acc& acc) {
    const double denom = std::max(0.0, acc.n - correction);
    double v = acc.m2 / denom;
    if (acc.n == 0) v = std::nan("");
    put<double>(r, out, r.out_pos, o, kStd ? std::sqrt(v) : v);
  });
}

// aten::norm.out(self, Scalar? p, int[1] dim, keepdim, *, out)
void norm(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  if (!is_floating(dt_of(in.dtype())))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("norm(): input dtype should be floating point, but got ") + dt_name(dt_of(in.dtype())));
  const double p = call.is_none(1) ? 2.0 : call.scalar_arg(1);
  Reduction r = prepare(call, in, call.int_list(2), call.bool_arg(3), out);
  NormR red{p};
  run_reduce<double>(call, in, r.plan, red, [&](int64_t o, const NormR::Acc& acc) {
    double v = acc.v;
    if (!std::isinf(p) && p != 0 && p != 1) v = p == 2 ? std::sqrt(v) : std::pow(v, 1.0 / p);
    put<double>(r, out, r.out_pos, o, v);
  });
}

// aten::all.dims_out / aten::any.dims_out(self, int[]? dim, keepdim, *, out)
// aten::all.out / aten::any.out(self, int dim, keepdim, *, out)
template <bool kAll>
void all_any(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  const DT od = dt_of(out.dtype());
  if (od != DT::b8 && !(od == DT::u8 && dt_of(in.dtype()) == DT::u8))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kAll ? "all" : "any") + " only supports bool tensor for result, got: " + dt_name(od));
  // all.dims_out: None reduces every dim, [] none (ATen's int[]? semantics).
  const bool explicit_empty = call.arg(1).tag == NPUB_VALUE_INT_LIST && call.arg(1).count == 0;
  Reduction r = prepare(call, in, dims_arg(call, 1), call.bool_arg(2), out, explicit_empty);
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    BoolR<kAll> red;
    run_reduce<V>(call, in, r.plan, red, [&](int64_t o, const auto& acc) { put<bool>(r, out, r.out_pos, o, acc.v); });
  });
}

// aten::cumsum.out(self, int dim, *, ScalarType? dtype, out)
void cumsum(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  const DT d = dt_of(in.dtype());
  const DT od = dtype_arg(call, 2, is_integral(d, true) ? DT::i64 : d);
  if (dt_of(out.dtype()) != od)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") + dt_name(od) + " but found " + dt_name(dt_of(out.dtype())));
  check_out(call, out, in.sizes());
  const int64_t dim = wrap_dim(call, call.int_arg(1), in.dim());
  std::vector<bool> mask(static_cast<size_t>(in.dim()), false);
  if (in.dim() > 0) mask[static_cast<size_t>(dim)] = true;
  const Plan pin = make_plan(in, mask), pout = make_plan(out, mask);
  const DT outd = dt_of(out.dtype());
  const bool floating = is_floating(od);
  call.parallel_for(0, pin.outputs, 16, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const char* ib = in.data<char>() + pin.out_offsets[static_cast<size_t>(o)];
      char* obp = out.data<char>() + pout.out_offsets[static_cast<size_t>(o)];
      double fs = 0;
      int64_t is = 0;
      for (int64_t j = 0; j < pin.run_len; ++j) {
        if (floating) {
          fs += load<double>(ib + j * pin.run_stride, d);
          store<double>(obp + j * pout.run_stride, outd, fs);
        } else {
          is += load<int64_t>(ib + j * pin.run_stride, d);
          store<int64_t>(obp + j * pout.run_stride, outd, is);
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------
// softmax family: tensors viewed as [outer, D, inner], contiguous
// ---------------------------------------------------------------------------

struct SoftmaxView {
  int64_t outer = 1, d = 1, inner = 1;
};
SoftmaxView softmax_view(const Call& call, const TensorRef& t, int64_t dim_arg) {
  SoftmaxView v;
  const int64_t dim = wrap_dim(call, dim_arg, t.dim());
  for (int32_t i = 0; i < t.dim(); ++i) {
    if (i < dim) v.outer *= t.size(i);
    else if (i == dim) v.d = t.size(i);
    else v.inner *= t.size(i);
  }
  return v;
}

// One contiguous fp32 softmax row, compiled for AVX-512, AVX2 and baseline
// x86-64 (picked at load time): 16 lanes so that max and sum vectorise,
// fast_exp for the exponentials.
__attribute__((target_clones("avx512f", "avx2", "default"))) void softmax_row_f32(const float* __restrict x,
                                                                                 float* __restrict y, int64_t d, bool log) {
  // A NaN in the row needs no special case: the max skips it, exp(NaN - mx)
  // is NaN, so the sum and every output become NaN, as in ATen.
  constexpr int64_t L = 16;
  float lane_max[L], lane_sum[L];
  for (int64_t k = 0; k < L; ++k) {
    lane_max[k] = -INFINITY;
    lane_sum[k] = 0;
  }
  int64_t j = 0;
  for (; j + L <= d; j += L)
    for (int64_t k = 0; k < L; ++k) lane_max[k] = x[j + k] > lane_max[k] ? x[j + k] : lane_max[k];
  for (; j < d; ++j) lane_max[0] = x[j] > lane_max[0] ? x[j] : lane_max[0];
  float mx = lane_max[0];
  for (int64_t k = 1; k < L; ++k) mx = lane_max[k] > mx ? lane_max[k] : mx;
  for (int64_t i = 0; i < d; ++i) y[i] = fast_exp(x[i] - mx);
  int64_t i = 0;
  for (; i + L <= d; i += L)
    for (int64_t k = 0; k < L; ++k) lane_sum[k] += y[i + k];
  for (; i < d; ++i) lane_sum[0] += y[i];
  float sum = 0;
  for (int64_t k = 0; k < L; ++k) sum += lane_sum[k];
  if (log) {
    const float lse = std::log(sum) + mx;
    for (int64_t t = 0; t < d; ++t) y[t] = x[t] - lse;
  } else {
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < d; ++t) y[t] *= inv;
  }
}

// Applies f(in_row, out_row, stride) to each of the outer*inner rows of D
// elements (row-local float buffers for half types).
template <bool kLog>
void softmax_fwd(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  const bool half_to_float = call.bool_arg(2);
  const DT d = dt_of(in.dtype()), od = dt_of(out.dtype());
  if (!is_floating(d)) call.fail(NPUB_ERR_UNSUPPORTED, std::string("softmax expects a floating tensor but found ") + dt_name(d));
  if (half_to_float && d != DT::f16 && d != DT::bf16)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "conversion from Half to Float is supported only for half inputs");
  if (od != (half_to_float ? DT::f32 : d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out: expected dtype ") + dt_name(half_to_float ? DT::f32 : d) + " but found " + dt_name(od));
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
        softmax_row_f32(reinterpret_cast<const float*>(ib) + base, reinterpret_cast<float*>(ob) + base, v.d, kLog);
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
      call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(v.d, 1)), [&](int64_t b, int64_t e) {
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
  if (!is_floating(gd) || !is_floating(yd)) call.fail(NPUB_ERR_UNSUPPORTED, "softmax backward expects floating tensors");
  if (g.sizes() != y.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output of shape " + shape_str(g.sizes()) + " does not match output of shape " +
                                             shape_str(y.sizes()));
  const DT expected = from_scalar_type(call.int_arg(3));
  if (expected != od && !(od == gd))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("grad_input: expected dtype ") + dt_name(expected) + " but found " + dt_name(od));
  check_out(call, gi, g.sizes());
  const SoftmaxView v = softmax_view(call, g, call.int_arg(2));
  const int64_t rows = v.outer * v.inner;
  const char* gb = g.data<char>();
  const char* yb = y.data<char>();
  char* ob = gi.data<char>();
  const int64_t ges = dt_size(gd), yes = dt_size(yd), oes = dt_size(od);
  call.parallel_for(0, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(v.d, 1)), [&](int64_t b, int64_t e) {
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

void register_reduce(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  const auto numeric = dtypes_numeric();
  const auto floating = dtypes_floating();
  r.def("aten::sum.IntList_out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::sum.IntList_out", &sum_mean<false>).dtypes(all);
  r.def("aten::mean.out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::mean.out", &sum_mean<true>).dtypes(all);
  r.def("aten::prod.int_out(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::prod.int_out", &prod).dtypes(all);
  r.def("aten::amax.out(Tensor self, int[1] dim=[], bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::amax.out", &amax_amin<true>).dtypes(all);
  r.def("aten::amin.out(Tensor self, int[1] dim=[], bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::amin.out", &amax_amin<false>).dtypes(all);
  r.def("aten::max.dim_max(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) max, Tensor(b!) max_values) -> (Tensor(a!) values, Tensor(b!) indices)");
  r.kernel("aten::max.dim_max", &max_min_dim<true>).dtypes(all);
  r.def("aten::min.dim_min(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) min, Tensor(b!) min_indices) -> (Tensor(a!) values, Tensor(b!) indices)");
  r.kernel("aten::min.dim_min", &max_min_dim<false>).dtypes(all);
  r.def("aten::argmax.out(Tensor self, int? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::argmax.out", &arg_extreme<true>).dtypes(numeric);
  r.def("aten::argmin.out(Tensor self, int? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::argmin.out", &arg_extreme<false>).dtypes(numeric);
  r.def("aten::var.correction_out(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::var.correction_out", &var_std<false>).dtypes(floating);
  r.def("aten::std.correction_out(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::std.correction_out", &var_std<true>).dtypes(floating);
  r.def("aten::norm.out(Tensor self, Scalar? p, int[1] dim, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::norm.out", &norm).dtypes(floating);
  r.def("aten::all.dims_out(Tensor self, int[]? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::all.dims_out", &all_any<true>).dtypes(all);
  r.def("aten::any.dims_out(Tensor self, int[]? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::any.dims_out", &all_any<false>).dtypes(all);
  r.def("aten::all.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::all.out", &all_any<true>).dtypes(all);
  r.def("aten::any.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::any.out", &all_any<false>).dtypes(all);
  r.def("aten::cumsum.out(Tensor self, int dim, *, ScalarType? dtype=None, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::cumsum.out", &cumsum).dtypes(all);
  r.def("aten::_softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::_softmax.out", &softmax_fwd<false>).dtypes(floating).contiguous_only();
  r.def("aten::_log_softmax.out(Tensor self, int dim, bool half_to_float, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::_log_softmax.out", &softmax_fwd<true>).dtypes(floating).contiguous_only();
  r.def("aten::_softmax_backward_data.out(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, *, Tensor(a!) grad_input) -> Tensor(a!)");
  r.kernel("aten::_softmax_backward_data.out", &softmax_bwd<false>).dtypes(floating).contiguous_only();
  r.def("aten::_log_softmax_backward_data.out(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::_log_softmax_backward_data.out", &softmax_bwd<true>).dtypes(floating).contiguous_only();
}

}  // namespace cann_like
