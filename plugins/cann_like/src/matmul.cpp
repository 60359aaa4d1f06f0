// Matrix products: mm, bmm, addmm, baddbmm (.out overloads).
//
// float32, bfloat16 and float16 run on gemm_on_this_thread (gemm.h: oneDNN,
// fp32 accumulation for the half types, one rounding to the output type),
// one call per block of rows on each of the device's compute threads, so the
// device's thread count is what the GEMM uses; half types are registered
// only where oneDNN has a kernel for them on this CPU, and reach the float32
// kernel through the dispatcher's conversion elsewhere. float64 and integer
// dtypes use the built-in blocked kernel. Transposed operands (x.t() in every
// linear layer, k^T in attention) go to the GEMM as they are: a second,
// higher-priority registration whose predicate accepts exactly those
// layouts, so nothing is staged; products below 2^18 multiply-adds run on
// one thread.
#include "common.h"
#include "elementwise.h"
#include "ops.h"

#include <cstring>

#include <plugin_kernels/gemm.h>

namespace cann_like {

namespace {

using plugin_kernels::gemm_blocked;
using plugin_kernels::gemm_on_this_thread;
using plugin_kernels::gemm_supports;
using plugin_kernels::GemmArgs;
using plugin_kernels::GemmType;

struct Gemm {
  // C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C per batch, C
  // row-major contiguous; op(X) is X, or X stored transposed (column-major)
  // when trans_x is set.
  int64_t m, n, k;
  double alpha, beta;
  bool trans_a = false, trans_b = false;
  int64_t lda() const { return std::max<int64_t>(trans_a ? m : k, 1); }
  int64_t ldb() const { return std::max<int64_t>(trans_b ? k : n, 1); }
  int64_t ldc() const { return std::max<int64_t>(n, 1); }
  // Offset (in elements) of row r of op(A): a row of A, or a column of A
  // stored transposed.
  int64_t a_row(int64_t r) const { return trans_a ? r : r * lda(); }
};

// Below this many multiply-adds a product runs on one thread: waking the
// device's other threads costs more than they would save (the small
// projections of a transformer layer are 10^4 to 10^5).
constexpr int64_t kParallelMinMacs = int64_t{1} << 18;

int64_t macs(const Gemm& g) { return g.m * g.n * std::max<int64_t>(g.k, 1); }

// B products, rows(batch, r0, r1) computing rows [r0, r1) of one: each
// product split over the device's threads in blocks of rows when large, or
// whole products spread over the threads when small.
template <typename Rows>
void gemm_batched(const Call& call, const Gemm& g, int64_t batches, Rows&& rows) {
  if (g.m == 0 || g.n == 0 || batches == 0) return;
  if (batches == 1 || macs(g) >= kParallelMinMacs) {
    for (int64_t bi = 0; bi < batches; ++bi) {
      if (macs(g) < kParallelMinMacs) {
        rows(bi, 0, g.m);
        continue;
      }
      const int64_t threads = std::max<int32_t>(1, call.num_threads());
      // Rows per block: enough work per call, at least one block per thread.
      const int64_t grain = std::max<int64_t>(1, std::min<int64_t>((g.m + threads - 1) / threads, 256));
      call.parallel_for(0, g.m, grain, [&](int64_t r0, int64_t r1) { rows(bi, r0, r1); });
    }
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelMinMacs / macs(g));
  call.parallel_for(0, batches, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi) rows(bi, 0, g.m);
  });
}

// float32 and the half types: the library GEMM (gemm.h).
void gemm_library(const Call& call, const Gemm& g, int64_t batches, GemmType type, int64_t elem_size,
                  const void* a, const void* b, void* c, const float* bias = nullptr) {
  const auto* ab = static_cast<const char*>(a);
  const auto* bb = static_cast<const char*>(b);
  auto* cb = static_cast<char*>(c);
  gemm_batched(call, g, batches, [&](int64_t bi, int64_t r0, int64_t r1) {
    GemmArgs args;
    args.type = type;
    args.trans_a = g.trans_a;
    args.trans_b = g.trans_b;
    args.m = r1 - r0;
    args.n = g.n;
    args.k = g.k;
    args.lda = g.lda();
    args.ldb = g.ldb();
    args.ldc = g.ldc();
    args.alpha = static_cast<float>(g.alpha);
    args.beta = static_cast<float>(g.beta);
    args.a = ab + (bi * g.m * g.k + g.a_row(r0)) * elem_size;
    args.b = bb + bi * g.k * g.n * elem_size;
    args.c = cb + (bi * g.m * g.n + r0 * g.n) * elem_size;
    args.bias = bias;
    gemm_on_this_thread(args);
  });
}

// float64 and integers: the built-in blocked kernel.
template <typename T>
void gemm_builtin(const Call& call, const Gemm& g, int64_t batches, const T* a, const T* b, T* c) {
  gemm_batched(call, g, batches, [&](int64_t bi, int64_t r0, int64_t r1) {
    gemm_blocked<T>(g.trans_a, g.trans_b, r1 - r0, g.n, g.k, g.alpha, a + bi * g.m * g.k + g.a_row(r0),
                    g.lda(), b + bi * g.k * g.n, g.ldb(), g.beta, c + bi * g.m * g.n + r0 * g.n, g.ldc());
  });
}

void check_2d(const Call& call, const TensorRef& t, const char* name) {
  if (t.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(name) + " must be a matrix (2-d) but is " + std::to_string(t.dim()) + "-d");
}
void check_3d(const Call& call, const TensorRef& t, const char* name) {
  if (t.dim() != 3)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(name) + " must be a 3-d tensor but is " + std::to_string(t.dim()) + "-d");
}

void check_same_dtype(const Call& call, std::initializer_list<TensorRef> ts) {
  const DT d = dt_of(ts.begin()->dtype());
  for (const TensorRef& t : ts)
    if (t.defined() && dt_of(t.dtype()) != d)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("expected all operands to have the same dtype, but found ") + dt_name(d) +
                    " and " + dt_name(dt_of(t.dtype())));
}

// How a (batch of) matrix operand(s) is stored: row-major contiguous,
// transposed (each matrix column-major, batches contiguous one after
// another; what x.t() and k.transpose(-1, -2) give), or otherwise.
enum class Layout { kRowMajor, kTransposed, kOther };
Layout layout_of(const TensorRef& t, bool batch) {
  if (t.is_contiguous()) return Layout::kRowMajor;
  const int32_t r = batch ? 1 : 0;
  const int64_t rows = t.size(r), cols = t.size(r + 1);
  const bool transposed = (cols <= 1 || t.stride(r + 1) == rows) && (rows <= 1 || t.stride(r) == 1) &&
                          (!batch || t.size(0) <= 1 || t.stride(0) == rows * cols);
  return transposed ? Layout::kTransposed : Layout::kOther;
}

// out[b] = beta * self[b] + alpha * (m1[b] @ m2[b]) for each batch b.
// `self` (may be undefined) broadcasts to out's shape.
void batched(Call& call, const TensorRef& self, const TensorRef& m1, const TensorRef& m2,
             const TensorRef& out, double beta, double alpha, bool batch) {
  const int64_t B = batch ? m1.size(0) : 1;
  const int32_t o = batch ? 1 : 0;
  const int64_t m = m1.size(o), k = m1.size(o + 1), n = m2.size(o + 1);
  if (m2.size(o) != k)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(batch ? "Expected size for first two dimensions of batch2 tensor to be: [" +
                                      std::to_string(B) + ", " + std::to_string(k) + "] but got: [" +
                                      std::to_string(m2.size(0)) + ", " + std::to_string(m2.size(1)) + "]."
                                : "mat1 and mat2 shapes cannot be multiplied (" + std::to_string(m) + "x" +
                                      std::to_string(k) + " and " + std::to_string(m2.size(0)) + "x" +
                                      std::to_string(n) + ")"));
  if (batch && m2.size(0) != B)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "batch1 and batch2 must have the same number of batches, got " +
                                             std::to_string(B) + " and " + std::to_string(m2.size(0)));
  const Shape shape = batch ? Shape{B, m, n} : Shape{m, n};
  check_out(call, out, shape);
  check_same_dtype(call, {m1, m2, out, self});
  const Layout la = layout_of(m1, batch), lb = layout_of(m2, batch);
  if (!out.is_contiguous() || la == Layout::kOther || lb == Layout::kOther)
    call.fail(NPUB_ERR_INTERNAL,
              "operands must be contiguous or transposed (the strided kernel's predicate checks this)");
  // Note [addmm_ runs in place]
  // addmm/baddbmm are registered alias-safe: `out` may be `self` itself
  // (x.addmm_(a, b), TRL's chunked log-probabilities), which is GEMM's own
  // C = alpha * A @ B + beta * C. An `out` that shares memory with an operand
  // of the product would be read while written: that call goes to the
  // fallback.
  auto span = [](const TensorRef& t) {
    const char* lo = t.data<char>();
    int64_t extent = 1;
    for (int32_t i = 0; i < t.dim(); ++i) extent += (t.size(i) - 1) * t.stride(i);
    return std::pair<const char*, const char*>{lo, lo + extent * dt_size(dt_of(t.dtype()))};
  };
  auto shares_memory = [&](const TensorRef& a, const TensorRef& b) {
    const auto [alo, ahi] = span(a);
    const auto [blo, bhi] = span(b);
    return a.numel() > 0 && b.numel() > 0 && alo < bhi && blo < ahi;
  };
  for (const TensorRef* operand : {&m1, &m2})
    if (shares_memory(out, *operand))
      call.fail(NPUB_ERR_UNSUPPORTED, "out shares memory with an operand of the product");
  const DT d = dt_of(out.dtype());
  // C starts as beta * self (broadcast) or is overwritten (beta == 0 ignores
  // self, NaNs included, as BLAS and ATen do).
  const bool use_self = self.defined() && beta != 0;
  // A float32 linear layer's bias (self a contiguous row of n, beta and
  // alpha 1, not out's own memory) goes to the GEMM, which adds it to its
  // accumulator: no pass copying it down C's rows, no read of C.
  const bool bias_row = use_self && !batch && d == DT::f32 && beta == 1 && alpha == 1 && self.numel() == n &&
                        n > 0 && self.dim() >= 1 && self.sizes().back() == n && self.is_contiguous() &&
                        !shares_memory(out, self);
  if (bias_row) {
    const Gemm g{m, n, k, 1.0, 0.0, la == Layout::kTransposed, lb == Layout::kTransposed};
    gemm_library(call, g, 1, GemmType::f32, 4, m1.data<char>(), m2.data<char>(), out.data<char>(),
                 self.data<float>());
    return;
  }
  if (use_self) {
    const Shape b = broadcast(call, self.sizes(), shape);
    if (b != shape)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "self of shape " + shape_str(self.sizes()) +
                                               " cannot be broadcast to the result's shape " +
                                               shape_str(shape));
    Iter it = make_iter(out, {self});
    // self has out's dtype (checked above): C's rows are byte copies of
    // self's (a bias row, broadcast down the rows, is one memcpy a row).
    const int64_t es = dt_size(d);
    for_each_row(call, it, [&](char** p, const int64_t* s, int64_t cnt) {
      if (s[0] == es && s[1] == es) {
        std::memcpy(p[0], p[1], static_cast<size_t>(cnt * es));
        return;
      }
      for (int64_t j = 0; j < cnt; ++j)
        std::memcpy(p[0] + j * s[0], p[1] + j * s[1], static_cast<size_t>(es));
    });
  }
  if (alpha == 0) {
    // alpha == 0 leaves the product out, NaNs included, as BLAS and ATen do
    // (a library GEMM would compute 0 * NaN): out = beta * self, or zeros.
    const int64_t es = dt_size(d), numel = out.numel();
    char* c = out.data<char>();
    for (int64_t i = 0; i < numel; ++i)
      store<double>(c + i * es, d, use_self ? beta * load<double>(c + i * es, d) : 0.0);
    return;
  }
  const Gemm g{m, n, k, alpha, use_self ? beta : 0.0, la == Layout::kTransposed, lb == Layout::kTransposed};
  if (d == DT::f32 || d == DT::bf16 || d == DT::f16) {
    const GemmType type = d == DT::f32 ? GemmType::f32 : d == DT::bf16 ? GemmType::bf16 : GemmType::f16;
    gemm_library(call, g, B, type, dt_size(d), m1.data<char>(), m2.data<char>(), out.data<char>());
    return;
  }
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_UNSUPPORTED, "matrix products of bool tensors are not supported");
    } else {
      gemm_builtin<T>(call, g, B, m1.data<T>(), m2.data<T>(), out.data<T>());
    }
  });
}

double scalar(const Call& call, int32_t i) { return call.scalar_arg(i); }

// aten::mm.out(self, mat2, *, out)
void mm(Call& call) {
  TensorRef a = call.tensor(0), b = call.tensor(1);
  check_2d(call, a, "self");
  check_2d(call, b, "mat2");
  batched(call, TensorRef(), a, b, call.tensor(2), 0.0, 1.0, false);
}
// aten::bmm.out(self, mat2, *, out)
void bmm(Call& call) {
  TensorRef a = call.tensor(0), b = call.tensor(1);
  check_3d(call, a, "batch1");
  check_3d(call, b, "batch2");
  batched(call, TensorRef(), a, b, call.tensor(2), 0.0, 1.0, true);
}
// aten::addmm.out(self, mat1, mat2, *, beta, alpha, out)
void addmm(Call& call) {
  TensorRef a = call.tensor(1), b = call.tensor(2);
  check_2d(call, a, "mat1");
  check_2d(call, b, "mat2");
  batched(call, call.tensor(0), a, b, call.tensor(5), scalar(call, 3), scalar(call, 4), false);
}
// aten::baddbmm.out(self, batch1, batch2, *, beta, alpha, out)
void baddbmm(Call& call) {
  TensorRef a = call.tensor(1), b = call.tensor(2);
  check_3d(call, a, "batch1");
  check_3d(call, b, "batch2");
  batched(call, call.tensor(0), a, b, call.tensor(5), scalar(call, 3), scalar(call, 4), true);
}

// Predicate of the strided kernels: the GEMM takes transposed operands as they
// are (no staging copy of x.t() for every linear layer); anything else
// declines to the contiguous-only kernel. Arguments: the two matrix
// operands and out, by index.
template <int32_t A, int32_t B, int32_t Out, bool kBatch>
int32_t gemm_layouts(void*, const NpubValue* args, int32_t num_args) {
  if (num_args <= Out) return 0;
  for (int32_t i : {A, B, Out})
    if (args[i].tag != NPUB_VALUE_TENSOR || args[i].u.tensor->ndim != (kBatch ? 3 : 2)) return 0;
  const TensorRef a(args[A].u.tensor), b(args[B].u.tensor), out(args[Out].u.tensor);
  if (!out.is_contiguous()) return 0;
  const Layout la = layout_of(a, kBatch), lb = layout_of(b, kBatch);
  return la != Layout::kOther && lb != Layout::kOther &&
         (la == Layout::kTransposed || lb == Layout::kTransposed);
}
}  // namespace

void register_matmul(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  std::vector<DLDataType> dts = {kFloat32, kFloat64, kInt64, kInt32, kInt16, kInt8, kUInt8};
  std::vector<DLDataType> strided = {kFloat32, kFloat64};
  // Half types natively only where the library has a kernel for them;
  // elsewhere the dispatcher runs them on the float32 kernel.
  for (auto [type, dl] : {std::pair{GemmType::bf16, kBFloat16}, std::pair{GemmType::f16, kFloat16}})
    if (gemm_supports(type)) {
      dts.push_back(dl);
      strided.push_back(dl);
    }
  r.def("aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::mm.out", &mm).dtypes(dts).contiguous_only();
  r.def("aten::bmm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::bmm.out", &bmm).dtypes(dts).contiguous_only();
  r.def(
      "aten::addmm.out(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1, Tensor(a!) "
      "out) -> Tensor(a!)");
  r.kernel("aten::addmm.out", &addmm).dtypes(dts).contiguous_only().alias_safe();
  r.def(
      "aten::baddbmm.out(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1, "
      "Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::baddbmm.out", &baddbmm).dtypes(dts).contiguous_only().alias_safe();
  // Floating dtypes with a transposed operand: the same kernels, preferred
  // when their predicate accepts the layouts.
  r.kernel("aten::mm.out", &mm).dtypes(strided).priority(1).supports(&gemm_layouts<0, 1, 2, false>);
  r.kernel("aten::bmm.out", &bmm).dtypes(strided).priority(1).supports(&gemm_layouts<0, 1, 2, true>);
  r.kernel("aten::addmm.out", &addmm)
      .dtypes(strided)
      .priority(1)
      .supports(&gemm_layouts<1, 2, 5, false>)
      .alias_safe();
  r.kernel("aten::baddbmm.out", &baddbmm)
      .dtypes(strided)
      .priority(1)
      .supports(&gemm_layouts<1, 2, 5, true>)
      .alias_safe();
}

}  // namespace cann_like
