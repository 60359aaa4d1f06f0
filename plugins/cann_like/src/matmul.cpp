// Matrix products: mm, bmm, addmm, baddbmm (.out overloads).
//
// float32/float64 run on OpenBLAS (Debian's serial build, one BLAS call per
// block of rows, the blocks spread over the device's compute threads, so the
// device's thread count is what the GEMM uses); without OpenBLAS a
// cache-blocked kernel of our own runs instead. Integer dtypes use a plain
// kernel. Half types reach the float32 kernel through the dispatcher's
// conversion (fp32 accumulation, as CANN's matmul on fp16 inputs).
// Transposed float operands (x.t() in every linear layer, k^T in attention)
// go to BLAS as they are: a second, higher-priority registration whose
// predicate accepts exactly those layouts, so nothing is staged; products
// below 2^18 multiply-adds run on one thread.
#include "common.h"
#include "elementwise.h"
#include "ops.h"

#if defined(NPUB_CANN_HAVE_OPENBLAS)
#include <cblas.h>
#endif

namespace cann_like {

namespace {

struct Gemm {
  // C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, C row-major
  // contiguous; op(X) is X, or X stored transposed (column-major) when
  // trans_x is set (BLAS only: the predicate routes nothing else here).
  int64_t m, n, k;
  double alpha, beta;
  bool trans_a = false, trans_b = false;
};

template <typename T>
void gemm_block_fallback(const Gemm& g, const T* a, const T* b, T* c, int64_t r0, int64_t r1) {
  constexpr int64_t kBlockK = 256;
  for (int64_t i = r0; i < r1; ++i) {
    T* ci = c + i * g.n;
    if (g.beta == 0) {
      for (int64_t j = 0; j < g.n; ++j) ci[j] = T(0);
    } else if (g.beta != 1) {
      for (int64_t j = 0; j < g.n; ++j) ci[j] = static_cast<T>(ci[j] * g.beta);
    }
  }
  for (int64_t kb = 0; kb < g.k; kb += kBlockK) {
    const int64_t ke = std::min(g.k, kb + kBlockK);
    for (int64_t i = r0; i < r1; ++i) {
      T* ci = c + i * g.n;
      const T* ai = a + i * g.k;
      for (int64_t p = kb; p < ke; ++p) {
        const T av = static_cast<T>(ai[p] * g.alpha);
        const T* bp = b + p * g.n;
        for (int64_t j = 0; j < g.n; ++j) ci[j] += av * bp[j];
      }
    }
  }
}

// Rows [r0, r1) of C on the calling thread: OpenBLAS (serial build) for
// float and double, the blocked loop otherwise.
template <typename T>
void gemm_rows(const Gemm& g, const T* a, const T* b, T* c, int64_t r0, int64_t r1) {
#if defined(NPUB_CANN_HAVE_OPENBLAS)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // Rows r0.. of op(A): rows of A, or columns of A stored transposed.
    const T* ar = g.trans_a ? a + r0 : a + r0 * g.k;
    const int lda = static_cast<int>(std::max<int64_t>(g.trans_a ? g.m : g.k, 1));
    const int ldb = static_cast<int>(std::max<int64_t>(g.trans_b ? g.k : g.n, 1));
    const int ldc = static_cast<int>(std::max<int64_t>(g.n, 1));
    const auto ta = g.trans_a ? CblasTrans : CblasNoTrans, tb = g.trans_b ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(r1 - r0), static_cast<int>(g.n), static_cast<int>(g.k),
                  static_cast<float>(g.alpha), ar, lda, b, ldb, static_cast<float>(g.beta), c + r0 * g.n, ldc);
    else
      cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(r1 - r0), static_cast<int>(g.n), static_cast<int>(g.k), g.alpha, ar,
                  lda, b, ldb, g.beta, c + r0 * g.n, ldc);
    return;
  }
#endif
  gemm_block_fallback<T>(g, a, b, c, r0, r1);
}

// Below this many multiply-adds a product runs on one thread: waking the
// device's other threads costs more than they would save (the small
// projections of a transformer layer are 10^4 to 10^5).
constexpr int64_t kParallelMinMacs = int64_t{1} << 18;

int64_t macs(const Gemm& g) { return g.m * g.n * std::max<int64_t>(g.k, 1); }

template <typename T>
void gemm(const Call& call, const Gemm& g, const T* a, const T* b, T* c) {
  if (g.m == 0 || g.n == 0) return;
  if (macs(g) < kParallelMinMacs) {
    gemm_rows<T>(g, a, b, c, 0, g.m);
    return;
  }
  const int64_t threads = std::max<int32_t>(1, call.num_threads());
  // Rows per block: enough work per BLAS call, at least one block per thread.
  const int64_t grain = std::max<int64_t>(1, std::min<int64_t>((g.m + threads - 1) / threads, 256));
  call.parallel_for(0, g.m, grain, [&](int64_t r0, int64_t r1) { gemm_rows<T>(g, a, b, c, r0, r1); });
}

// B products: each split over the threads when large, or whole products
// spread over the threads when small.
template <typename T>
void gemm_batched(const Call& call, const Gemm& g, int64_t batches, const T* a, const T* b, T* c) {
  if (g.m == 0 || g.n == 0 || batches == 0) return;
  if (batches == 1 || macs(g) >= kParallelMinMacs) {
    for (int64_t bi = 0; bi < batches; ++bi) gemm<T>(call, g, a + bi * g.m * g.k, b + bi * g.k * g.n, c + bi * g.m * g.n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelMinMacs / macs(g));
  call.parallel_for(0, batches, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi)
      gemm_rows<T>(g, a + bi * g.m * g.k, b + bi * g.k * g.n, c + bi * g.m * g.n, 0, g.m);
  });
}

void check_2d(const Call& call, const TensorRef& t, const char* name) {
  if (t.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + " must be a matrix (2-d) but is " + std::to_string(t.dim()) + "-d");
}
void check_3d(const Call& call, const TensorRef& t, const char* name) {
  if (t.dim() != 3)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + " must be a 3-d tensor but is " + std::to_string(t.dim()) + "-d");
}

void check_same_dtype(const Call& call, std::initializer_list<TensorRef> ts) {
  const DT d = dt_of(ts.begin()->dtype());
  for (const TensorRef& t : ts)
    if (t.defined() && dt_of(t.dtype()) != d)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("expected all operands to have the same dtype, but found ") +
                                               dt_name(d) + " and " + dt_name(dt_of(t.dtype())));
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
void batched(Call& call, const TensorRef& self, const TensorRef& m1, const TensorRef& m2, const TensorRef& out,
             double beta, double alpha, bool batch) {
  const int64_t B = batch ? m1.size(0) : 1;
  const int32_t o = batch ? 1 : 0;
  const int64_t m = m1.size(o), k = m1.size(o + 1), n = m2.size(o + 1);
  if (m2.size(o) != k)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(batch ? "Expected size for first two dimensions of batch2 tensor to be: [" +
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
    call.fail(NPUB_ERR_INTERNAL, "operands must be contiguous or transposed (the strided kernel's predicate checks this)");
  const DT d = dt_of(out.dtype());
  // C starts as beta * self (broadcast) or is overwritten (beta == 0 ignores
  // self, NaNs included, as BLAS and ATen do).
  const bool use_self = self.defined() && beta != 0;
  if (use_self) {
    const Shape b = broadcast(call, self.sizes(), shape);
    if (b != shape)
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "self of shape " + shape_str(self.sizes()) +
                                               " cannot be broadcast to the result's shape " + shape_str(shape));
    Iter it = make_iter(out, {self});
    visit_compute(d, [&](auto tag) {
      using T = decltype(tag);
      for_each_row(call, it, [&](char** p, const int64_t* s, int64_t cnt) {
        for (int64_t j = 0; j < cnt; ++j) store<T>(p[0] + j * s[0], it.dt[0], load<T>(p[1] + j * s[1], it.dt[1]));
      });
    });
  }
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_UNSUPPORTED, "matrix products of bool tensors are not supported");
    } else {
      const T* a = m1.data<T>();
      const T* bm = m2.data<T>();
      T* c = out.data<T>();
      gemm_batched<T>(call, Gemm{m, n, k, alpha, use_self ? beta : 0.0, la == Layout::kTransposed, lb == Layout::kTransposed},
                      B, a, bm, c);
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

}  // namespace

void gemm_serial_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#if defined(NPUB_CANN_HAVE_OPENBLAS)
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(std::max<int64_t>(lda, 1)), b,
              static_cast<int>(std::max<int64_t>(ldb, 1)), beta, c, static_cast<int>(std::max<int64_t>(ldc, 1)));
#else
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t p = 0; p < k; ++p) s += (trans_a ? a[p * lda + i] : a[i * lda + p]) * (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * s + (beta == 0 ? 0.0f : beta * c[i * ldc + j]);
    }
#endif
}

#if defined(NPUB_CANN_HAVE_OPENBLAS)
namespace {
// Predicate of the strided kernels: BLAS takes transposed operands as they
// are (no staging copy of x.t() for every linear layer); anything else
// declines to the contiguous-only kernel. Arguments: the two matrix
// operands and out, by index.
template <int32_t A, int32_t B, int32_t Out, bool kBatch>
int32_t blas_layouts(void*, const NpubValue* args, int32_t num_args) {
  if (num_args <= Out) return 0;
  for (int32_t i : {A, B, Out})
    if (args[i].tag != NPUB_VALUE_TENSOR || args[i].u.tensor->ndim != (kBatch ? 3 : 2)) return 0;
  const TensorRef a(args[A].u.tensor), b(args[B].u.tensor), out(args[Out].u.tensor);
  if (!out.is_contiguous()) return 0;
  const Layout la = layout_of(a, kBatch), lb = layout_of(b, kBatch);
  return la != Layout::kOther && lb != Layout::kOther && (la == Layout::kTransposed || lb == Layout::kTransposed);
}
}  // namespace
#endif

void register_matmul(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const std::vector<DLDataType> dts = {kFloat32, kFloat64, kInt64, kInt32, kInt16, kInt8, kUInt8};
  r.def("aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::mm.out", &mm).dtypes(dts).contiguous_only();
  r.def("aten::bmm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::bmm.out", &bmm).dtypes(dts).contiguous_only();
  r.def("aten::addmm.out(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::addmm.out", &addmm).dtypes(dts).contiguous_only();
  r.def("aten::baddbmm.out(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::baddbmm.out", &baddbmm).dtypes(dts).contiguous_only();
#if defined(NPUB_CANN_HAVE_OPENBLAS)
  // float32/float64 with a transposed operand: the same kernels, preferred
  // when their predicate accepts the layouts.
  const std::vector<DLDataType> blas = {kFloat32, kFloat64};
  r.kernel("aten::mm.out", &mm).dtypes(blas).priority(1).supports(&blas_layouts<0, 1, 2, false>);
  r.kernel("aten::bmm.out", &bmm).dtypes(blas).priority(1).supports(&blas_layouts<0, 1, 2, true>);
  r.kernel("aten::addmm.out", &addmm).dtypes(blas).priority(1).supports(&blas_layouts<1, 2, 5, false>);
  r.kernel("aten::baddbmm.out", &baddbmm).dtypes(blas).priority(1).supports(&blas_layouts<1, 2, 5, true>);
#endif
}

}  // namespace cann_like
