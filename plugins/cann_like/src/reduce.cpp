// Reductions over dim lists (sum, mean, prod, amax, amin, max.dim, min.dim,
// argmax, argmin, var, std, all, any): the reducers and the engine
// that runs them over a Plan (common.h). cumsum is in scan.cpp, softmax in
// softmax.cpp, the vector norms in norm.cpp.
//
// Floating sums accumulate in double (more accurate than the inputs need);
// half types accumulate in float at least, as ATen does.
#include "elementwise.h"
#include "ops.h"
#include "scalar_range.h"

#include <cmath>
#include <limits>
#include <optional>

namespace cann_like {

namespace {

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
        partial[static_cast<size_t>(c)] =
            reduce_range(o, std::min(count, c * chunk), std::min(count, (c + 1) * chunk));
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

struct Reduction {
  TensorRef in, out;
  std::vector<bool> mask;
  Shape out_shape;
  Plan plan;
  std::vector<int64_t> out_pos;  // byte offsets of output elements
};

// with_plan false: the checks and the shapes only (a caller with a fast path
// makes the plan when it does not take it).
Reduction prepare(const Call& call, const TensorRef& in, const std::vector<int64_t>& dims, bool keepdim,
                  const TensorRef& out, bool empty_means_none = false, bool with_plan = true) {
  Reduction r;
  r.in = in;
  r.out = out;
  r.mask = reduce_mask(call, dims, in.dim());
  if (empty_means_none && dims.empty()) r.mask.assign(r.mask.size(), false);
  r.out_shape = reduced_shape(in.sizes(), r.mask, keepdim);
  check_out(call, out, r.out_shape);
  if (with_plan) {
    r.plan = make_plan(in, r.mask);
    r.out_pos = element_offsets(out);
  }
  return r;
}

// Note [Sums over the leading dims]
// A bias's gradient sums a contiguous [R, K] view over R (dim 0 of
// [512, 1024], dims 0 and 1 of [4, 128, 256]). The Plan walks each output's
// column with a stride of K elements and a generic load per element, which
// cache and vectoriser both dislike (9x slower than ATen on GPT-2's bias
// gradients). Here the rows are added into a row of K double accumulators
// instead: each thread takes a block of columns (a tile of kTile at a time,
// so that its accumulators stay in L1) and adds the rows in order. Every
// output still sums its R elements from row 0 on, one double accumulator,
// the order of the Plan's walk, whatever the thread count.
// Returns false (nothing done) where it does not apply: a strided input or
// out, a kept dim before a reduced one, few columns (the Plan splits long
// reductions over the threads), integer sums (int64 accumulators).
//
// The same holds with kept dims before the reduced block ([512, 2, 256] over
// dim 1, Mixtral's top-k combine): each of the `outer` blocks adds its own
// rows. And a reduced block at the end (a sum over the last dim, or over
// everything) is a contiguous run per output: float32 runs are added in 32
// double partial sums (four vectors' lanes), in a fixed order per output; runs
// of at most 32 into a float32 out (a global average pool over small
// planes) in one double sum, in order, inline.
template <bool kMean>
bool sum_leading_dims(const Call& call, const Reduction& r) {
  const TensorRef& in = r.in;
  const DT d = dt_of(in.dtype());
  if ((!is_floating(d) && !kMean) || in.numel() == 0 || !in.is_contiguous() || !r.out.is_contiguous())
    return false;
  int64_t outer = 1, rows = 1, cols = 1;
  int phase = 0;  // 0: kept dims before the reduced block, 1: in it, 2: kept dims after it
  for (int32_t i = 0; i < in.dim(); ++i) {
    if (in.size(i) == 1) continue;
    if (r.mask[static_cast<size_t>(i)]) {
      if (phase == 2) return false;
      phase = 1;
      rows *= in.size(i);
    } else if (phase == 0) {
      outer *= in.size(i);
    } else {
      phase = 2;
      cols *= in.size(i);
    }
  }
  if (phase == 0) return false;
  const DT od = dt_of(r.out.dtype());
  const int64_t es = dt_size(d), oes = dt_size(od);
  const char* x = in.data<char>();
  char* o = r.out.data<char>();
  auto emit = [&](int64_t at, double acc) {
    store<double>(o + at * oes, od, kMean ? acc / static_cast<double>(rows) : acc);
  };
  if (cols == 1) {
    if (d != DT::f32) return false;
    const float* xf = reinterpret_cast<const float*>(x);
    if (outer >= call.num_threads() || rows < (1 << 15)) {
      call.parallel_for(0, outer, std::max<int64_t>(1, (1 << 14) / rows), [&](int64_t b, int64_t e) {
        if (rows <= 32 && od == DT::f32) {
          // Short runs (a ResNet's global average pool over 2x2 or 4x4
          // planes): one inline double sum per run, in order, and a float
          // store, not a call per run and a store through the dtype switch.
          float* of = reinterpret_cast<float*>(o);
          for (int64_t i = b; i < e; ++i) {
            const float* xr = xf + i * rows;
            double acc = 0;
            for (int64_t j = 0; j < rows; ++j) acc += xr[j];
            of[i] = static_cast<float>(kMean ? acc / static_cast<double>(rows) : acc);
          }
          return;
        }
        // Blocks of rows: one call and, into a float32 out, typed stores.
        constexpr int64_t kBlock = 64;
        double sums[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t m = std::min(kBlock, e - i);
          row_sums_f32_to_f64(xf + i * rows, m, rows, rows, sums);
          if (od == DT::f32) {
            float* of = reinterpret_cast<float*>(o) + i;
            for (int64_t j = 0; j < m; ++j)
              of[j] = static_cast<float>(kMean ? sums[j] / static_cast<double>(rows) : sums[j]);
          } else {
            for (int64_t j = 0; j < m; ++j) emit(i + j, sums[j]);
          }
        }
      });
      return true;
    }
    // Few long runs: each split in fixed pieces, added in piece order.
    constexpr int64_t kPiece = 1 << 14;
    const int64_t pieces = (rows + kPiece - 1) / kPiece;
    std::vector<double> part(static_cast<size_t>(pieces));
    for (int64_t i = 0; i < outer; ++i) {
      call.parallel_for(0, pieces, 1, [&](int64_t b, int64_t e) {
        for (int64_t k = b; k < e; ++k)
          part[static_cast<size_t>(k)] =
              sum_f32_to_f64(xf + i * rows + k * kPiece, std::min(kPiece, rows - k * kPiece));
      });
      double acc = 0;
      for (double v : part) acc += v;
      emit(i, acc);
    }
    return true;
  }
  if (cols < 16) return false;
  constexpr int64_t kTile = 1024;
  // (outer block, column) pairs, split over the threads; each thread walks
  // its pairs a block at a time, a tile of columns at a time.
  call.parallel_for(0, outer * cols, std::max<int64_t>(16, (1 << 15) / rows), [&](int64_t b, int64_t e) {
    double acc[kTile];
    for (int64_t i = b; i < e;) {
      const int64_t blk = i / cols, c0 = i % cols, c1 = std::min(cols, c0 + (e - i));
      for (int64_t t0 = c0; t0 < c1; t0 += kTile) {
        const int64_t m = std::min(kTile, c1 - t0);
        std::fill(acc, acc + m, 0.0);
        add_rows_to_f64(acc, x + (blk * rows * cols + t0) * es, d, rows, cols, m);
        if (od == DT::f32) {  // typed stores, not a dtype switch per element
          float* of = reinterpret_cast<float*>(o) + blk * cols + t0;
          // A mean by the reciprocal (within one double ulp of the quotient,
          // far below float32's rounding; a division per element took 1.8x
          // the sum's time).
          const double scale = kMean ? 1.0 / static_cast<double>(rows) : 1.0;
          for (int64_t j = 0; j < m; ++j) of[j] = static_cast<float>(acc[j] * scale);
        } else {
          for (int64_t j = 0; j < m; ++j) emit(blk * cols + t0 + j, acc[j]);
        }
      }
      i += c1 - c0;
    }
  });
  return true;
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
  void step(A& a, V v, int64_t) const {
    a += static_cast<A>(v);
  }
  void combine(A& a, const A& b) const { a += b; }
};
template <typename A>
struct ProdR {
  A init() const { return A(1); }
  template <typename V>
  void step(A& a, V v, int64_t) const {
    a *= static_cast<A>(v);
  }
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
template <bool kAll>
struct BoolR {
  struct Acc {  // not a bare bool: partials live in a std::vector
    bool v;
  };
  Acc init() const { return {kAll}; }
  template <typename V>
  void step(Acc& a, V v, int64_t) const {
    if (kAll)
      a.v = a.v && (v != V(0));
    else
      a.v = a.v || (v != V(0));
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

// An out= of another dtype than the reduction's, with no dtype argument:
// ATen then reduces in out's dtype (the input cast first), which these
// kernels do not; decline, and the host's implementation serves it. With a
// dtype argument, out must have it.
void check_reduction_out_dtype(const Call& call, int32_t dtype_index, DT expected, const TensorRef& out) {
  const DT found = dt_of(out.dtype());
  if (found == expected) return;
  if (call.is_none(dtype_index))
    call.fail(NPUB_ERR_UNSUPPORTED,
              std::string("out= of dtype ") + dt_name(found) + " for a " + dt_name(expected) + " reduction");
  call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("Expected out tensor to have dtype ") +
                                           demangled_type_name(expected) + ", but got " +
                                           demangled_type_name(found) + " instead");
}

// aten::sum.IntList_out(self, int[1]? dim, keepdim, *, ScalarType? dtype, out)
// aten::mean.out(self, int[1]? dim, keepdim, *, ScalarType? dtype, out)
template <bool kMean>
void sum_mean(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  const DT def = is_integral(d, true) ? (kMean ? DT::unknown : DT::i64) : d;
  const DT od = dtype_arg(call, 3, def);
  if (kMean && !is_floating(od))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("mean(): could not infer output dtype. Input dtype must be either a "
                          "floating point or complex dtype. Got: ") +
                  dt_name(od == DT::unknown ? d : od));
  check_reduction_out_dtype(call, 3, od, out);
  Reduction r = prepare(call, in, dims_arg(call, 1), call.bool_arg(2), out, false, false);
  if (sum_leading_dims<kMean>(call, r)) return;
  r.plan = make_plan(in, r.mask);
  r.out_pos = element_offsets(out);
  const int64_t count = r.plan.count();
  visit_input(d, [&](auto tag) {
    using V = decltype(tag);
    if constexpr (std::is_floating_point_v<V> || kMean) {
      SumR<double> red;
      run_reduce<double>(call, in, r.plan, red, [&](int64_t o, double acc) {
        put<double>(r, out, r.out_pos, o,
                    kMean ? (count == 0 ? std::nan("") : acc / static_cast<double>(count)) : acc);
      });
    } else {
      SumR<int64_t> red;
      run_reduce<int64_t>(call, in, r.plan, red,
                          [&](int64_t o, int64_t acc) { put<int64_t>(r, out, r.out_pos, o, acc); });
    }
  });
}

// aten::prod.int_out(self, int dim, keepdim, *, ScalarType? dtype, out)
void prod(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  const DT od = dtype_arg(call, 3, is_integral(d, true) ? DT::i64 : d);
  check_reduction_out_dtype(call, 3, od, out);
  Reduction r = prepare(call, in, {call.int_arg(1)}, call.bool_arg(2), out);
  if (is_floating(d)) {
    ProdR<double> red;
    run_reduce<double>(call, in, r.plan, red,
                       [&](int64_t o, double acc) { put<double>(r, out, r.out_pos, o, acc); });
  } else {
    ProdR<int64_t> red;
    run_reduce<int64_t>(call, in, r.plan, red,
                        [&](int64_t o, int64_t acc) { put<int64_t>(r, out, r.out_pos, o, acc); });
  }
}

void check_nonempty(const Call& call, const Reduction& r, const char* what) {
  if (r.plan.count() == 0 && r.plan.outputs > 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(what) +
                  "(): Expected reduction dim to be specified for input.numel() == 0. "
                  "Specify the reduction dim with the 'dim' argument.");
}

// aten::amax.out / aten::amin.out(self, int[1] dim=[], keepdim, *, out)
template <bool kMax>
void amax_amin(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(3);
  if (dt_of(out.dtype()) != dt_of(in.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("Expected the dtype for input and out to match, but got ") +
                  dt_name(dt_of(in.dtype())) + " for input's dtype and " + dt_name(dt_of(out.dtype())) +
                  " for out's dtype.");
  Reduction r = prepare(call, in, call.int_list(1), call.bool_arg(2), out);
  check_nonempty(call, r, kMax ? "amax" : "amin");
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    ExtremeR<V, kMax> red;
    run_reduce<V>(call, in, r.plan, red,
                  [&](int64_t o, const auto& acc) { put<V>(r, out, r.out_pos, o, acc.value); });
  });
}

// aten::max.dim_max / aten::min.dim_min(self, int dim, keepdim, *, values!, indices!)
template <bool kMax>
void max_min_dim(Call& call) {
  TensorRef in = call.tensor(0), values = call.tensor(3), indices = call.tensor(4);
  const int64_t dim = wrap_dim(call, call.int_arg(1), in.dim());
  if (in.dim() > 0 && in.size(static_cast<int32_t>(dim)) == 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kMax ? "max" : "min") + "(): Expected reduction dim " +
                                             std::to_string(dim) + " to have non-zero size.");
  if (dt_of(indices.dtype()) != DT::i64)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "indices: expected dtype int64");
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
  if (in.numel() == 0 && flat)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(kMax ? "argmax" : "argmin") +
                  "(): Expected reduction dim to be specified for input.numel() == 0.");
  if (!flat && in.dim() > 0) {
    // An empty reduced dimension has no extreme; other empty dimensions
    // give an empty result.
    const int64_t dim = wrap_dim(call, call.int_arg(1), in.dim());
    if (in.size(static_cast<int32_t>(dim)) == 0)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kMax ? "argmax" : "argmin") +
                                               "(): Expected reduction dim " + std::to_string(dim) +
                                               " to have non-zero size.");
  }
  Reduction r = prepare(call, in, flat ? std::vector<int64_t>{} : std::vector<int64_t>{call.int_arg(1)},
                        flat ? false : keepdim, out);
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    ExtremeR<V, kMax> red;
    run_reduce<V>(call, in, r.plan, red,
                  [&](int64_t o, const auto& acc) { put<int64_t>(r, out, r.out_pos, o, acc.index); });
  });
}

// aten::var.correction_out / aten::std.correction_out(self, int[1]? dim, *, Scalar? correction, keepdim, out)
template <bool kStd>
void var_std(Call& call) {
  TensorRef in = call.tensor(0), out = call.tensor(4);
  const DT d = dt_of(in.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kStd ? "std" : "var") +
                                             " only supports floating-point dtypes, but found " + dt_name(d));
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

// aten::all.dims_out / aten::any.dims_out(self, int[]? dim, keepdim, *, out)
// aten::all.out / aten::any.out(self, int dim, keepdim, *, out)
// aten::all.all_out / aten::any.all_out(self, *, out): every dim
template <bool kAll>
void all_any(Call& call) {
  const bool full = call.num_args() == 2;
  TensorRef in = call.tensor(0), out = call.tensor(full ? 1 : 3);
  const DT od = dt_of(out.dtype());
  if (od != DT::b8 && !(od == DT::u8 && dt_of(in.dtype()) == DT::u8))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(kAll ? "all" : "any") +
                                             " only supports bool tensor for result, got: " + dt_name(od));
  // all.dims_out: None reduces every dim, [] none (ATen's int[]? semantics).
  const bool explicit_empty = !full && call.arg(1).tag == NPUB_VALUE_INT_LIST && call.arg(1).count == 0;
  Reduction r = full ? prepare(call, in, {}, false, out)
                     : prepare(call, in, dims_arg(call, 1), call.bool_arg(2), out, explicit_empty);
  visit_input(dt_of(in.dtype()), [&](auto tag) {
    using V = decltype(tag);
    BoolR<kAll> red;
    run_reduce<V>(call, in, r.plan, red,
                  [&](int64_t o, const auto& acc) { put<bool>(r, out, r.out_pos, o, acc.v); });
  });
}

}  // namespace

void register_reduce(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  const auto numeric = dtypes_numeric();
  const auto floating = dtypes_floating();
  // sum, mean, prod: the dtype= argument or integer promotion sets out's
  // dtype (any_dtype); the bodies check it.
  r.op("aten::sum.IntList_out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, "
       "Tensor(a!) out) -> Tensor(a!)",
       &sum_mean<false>)
      .dtypes(all)
      .any_dtype("out");
  r.op("aten::mean.out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, Tensor(a!) "
       "out) -> Tensor(a!)",
       &sum_mean<true>)
      .dtypes(all)
      .any_dtype("out");
  r.op("aten::prod.int_out(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None, Tensor(a!) "
       "out) -> Tensor(a!)",
       &prod)
      .dtypes(all)
      .any_dtype("out");
  r.op("aten::amax.out(Tensor self, int[1] dim=[], bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &amax_amin<true>)
      .dtypes(all);
  r.op("aten::amin.out(Tensor self, int[1] dim=[], bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &amax_amin<false>)
      .dtypes(all);
  r.op("aten::max.dim_max(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) max, Tensor(b!) "
       "max_values) -> (Tensor(a!) values, Tensor(b!) indices)",
       &max_min_dim<true>)
      .dtypes(all)
      .arg_dtypes("max_values", {npub::sdk::kInt64});
  r.op("aten::min.dim_min(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) min, Tensor(b!) "
       "min_indices) -> (Tensor(a!) values, Tensor(b!) indices)",
       &max_min_dim<false>)
      .dtypes(all)
      .arg_dtypes("min_indices", {npub::sdk::kInt64});
  r.op("aten::argmax.out(Tensor self, int? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &arg_extreme<true>)
      .dtypes(numeric)
      .arg_dtypes("out", {npub::sdk::kInt64});
  r.op("aten::argmin.out(Tensor self, int? dim=None, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &arg_extreme<false>)
      .dtypes(numeric)
      .arg_dtypes("out", {npub::sdk::kInt64});
  r.op("aten::var.correction_out(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool "
       "keepdim=False, Tensor(a!) out) -> Tensor(a!)",
       &var_std<false>)
      .dtypes(floating);
  r.op("aten::std.correction_out(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool "
       "keepdim=False, Tensor(a!) out) -> Tensor(a!)",
       &var_std<true>)
      .dtypes(floating);
  r.op("aten::all.dims_out(Tensor self, int[]? dim=None, bool keepdim=False, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &all_any<true>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
  r.op("aten::any.dims_out(Tensor self, int[]? dim=None, bool keepdim=False, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &all_any<false>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
  r.op("aten::all.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &all_any<true>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
  r.op("aten::any.out(Tensor self, int dim, bool keepdim=False, *, Tensor(a!) out) -> Tensor(a!)",
       &all_any<false>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
  r.op("aten::all.all_out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", &all_any<true>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
  r.op("aten::any.all_out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", &all_any<false>)
      .dtypes(all)
      .arg_dtypes("out", {npub::sdk::kBool, npub::sdk::kUInt8});
}

}  // namespace cann_like
