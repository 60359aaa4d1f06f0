// aten::_grouped_mm: one matrix product per group, the groups of a 2-d
// operand delimited by `offs` (int32 end offsets), as mixture-of-experts
// layers call it (transformers' grouped_mm experts path):
//
//   self [M, K]    x mat2 [G, K, N] -> [M, N]     rows offs[g-1]..offs[g] use mat2[g]
//   self [G, M, K] x mat2 [K, N]    -> [M, N]     columns offs[g-1]..offs[g] use self[g]
//   self [M, K]    x mat2 [K, N]    -> [G, M, N]  the K range offs[g-1]..offs[g] (weight gradients)
//   self [G, M, K] x mat2 [G, K, N] -> [G, M, N]  a batched product, no offs
//
// Each group's product runs on the shared GEMM (gemm.h, as matmul.cpp's),
// with transposed operands taken as they are (the experts' weights arrive
// as weight.transpose(-2, -1)); the groups' blocks of rows spread over the
// device's compute threads.
#include "common.h"
#include "ops.h"

#include <plugin_kernels/gemm.h>

namespace cann_like {

namespace {

using plugin_kernels::GemmArgs;
using plugin_kernels::GemmType;

// One matrix of an operand as the GEMM reads it: row-major with leading
// dimension ld, or column-major (transposed) with leading dimension ld.
struct MatrixView {
  const char* data = nullptr;
  bool transposed = false;
  int64_t ld = 1;
  int64_t row_stride = 0, col_stride = 0;  // in bytes: to move the start to another row or column
};

// The layout of the last two dims of `t`: row-major, column-major, or
// neither (nullopt-like: ok = false).
bool matrix_layout(const TensorRef& t, bool& transposed, int64_t& ld) {
  const int32_t r = t.dim() - 2;
  const int64_t rows = t.size(r), cols = t.size(r + 1), s0 = t.stride(r), s1 = t.stride(r + 1);
  if ((cols <= 1 || s1 == 1) && (rows <= 1 || s0 >= cols)) {
    transposed = false;
    ld = rows <= 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(s0, 1);
    return true;
  }
  if ((rows <= 1 || s0 == 1) && (cols <= 1 || s1 >= rows)) {
    transposed = true;
    ld = cols <= 1 ? std::max<int64_t>(rows, 1) : std::max<int64_t>(s1, 1);
    return true;
  }
  return false;
}

MatrixView view_of(const Call& call, const TensorRef& t, const char* name) {
  MatrixView v;
  if (!matrix_layout(t, v.transposed, v.ld))
    call.fail(NPUB_ERR_INTERNAL, std::string(name) +
                                     ": expected a row- or column-major layout (the predicate "
                                     "checks this)");
  const int64_t es = dt_size(dt_of(t.dtype()));
  const int32_t r = t.dim() - 2;
  v.data = t.data<char>();
  v.row_stride = t.stride(r) * es;
  v.col_stride = t.stride(r + 1) * es;
  return v;
}

// One product: C[m, n] (row-major, leading dimension ldc) = A[m, k] @ B[k, n].
struct Product {
  const char* a;
  bool ta;
  int64_t lda;
  const char* b;
  bool tb;
  int64_t ldb;
  char* c;
  int64_t ldc;
  int64_t m, n, k;
};

// Note [Half-type groups the library refuses]
// oneDNN's half-type matmuls take only some leading dimensions (a group of
// columns of a wider matrix may have none, and where PyTorch's own oneDNN
// is loaded in the same process fewer still: Note [Two oneDNN copies in one
// process], gemm.cpp). Such a product runs in float32 on copies of its
// operands and is rounded once to the half type: the result the library
// would give (it accumulates half types in float32 too).
void half_product_in_float32(const GemmArgs& g, DT d) {
  const int64_t es = dt_size(d);
  std::vector<float> a(static_cast<size_t>(g.m * g.k)), b(static_cast<size_t>(g.k * g.n)),
      c(static_cast<size_t>(g.m * g.n));
  const char* pa = static_cast<const char*>(g.a);
  const char* pb = static_cast<const char*>(g.b);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t p = 0; p < g.k; ++p)
      a[static_cast<size_t>(i * g.k + p)] =
          load<float>(pa + (g.trans_a ? p * g.lda + i : i * g.lda + p) * es, d);
  for (int64_t p = 0; p < g.k; ++p)
    for (int64_t j = 0; j < g.n; ++j)
      b[static_cast<size_t>(p * g.n + j)] =
          load<float>(pb + (g.trans_b ? j * g.ldb + p : p * g.ldb + j) * es, d);
  GemmArgs f = g;
  f.type = GemmType::f32;
  f.trans_a = f.trans_b = false;
  f.lda = std::max<int64_t>(g.k, 1);
  f.ldb = f.ldc = std::max<int64_t>(g.n, 1);
  f.a = a.data();
  f.b = b.data();
  f.c = c.data();
  plugin_kernels::gemm_on_this_thread(f);
  char* pc = static_cast<char*>(g.c);
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j)
      store<float>(pc + (i * g.ldc + j) * es, d, c[static_cast<size_t>(i * g.n + j)]);
}

std::string shape_of(const TensorRef& t) { return shape_str(t.sizes()); }

// The group boundaries: offs read from the device, checked to be
// non-decreasing within [0, limit] (a bad offset would read outside the
// operands).
std::vector<int64_t> group_bounds(const Call& call, const TensorRef& offs, int64_t groups, int64_t limit,
                                  const char* dim_name) {
  if (offs.size(0) != groups)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "offs: expected " + std::to_string(groups) +
                                             " entries (one per group) but found " +
                                             std::to_string(offs.size(0)));
  std::vector<int64_t> bounds{0};
  const char* p = offs.data<char>();
  for (int64_t g = 0; g < groups; ++g) {
    int32_t v;
    std::memcpy(&v, p + g * offs.stride(0) * 4, 4);
    if (v < bounds.back() || v > limit)
      call.fail(
          NPUB_ERR_INVALID_ARGUMENT,
          "offs: expected non-decreasing offsets within [0, " + std::to_string(limit) + "] (" + dim_name +
              ") but found offs[" + std::to_string(g) + "] = " + std::to_string(v) +
              (g > 0 ? " after offs[" + std::to_string(g - 1) + "] = " + std::to_string(bounds.back()) : ""));
    bounds.push_back(v);
  }
  return bounds;
}

void zero_rows(char* c, int64_t rows, int64_t cols, int64_t ldc, int64_t es) {
  for (int64_t i = 0; i < rows; ++i) std::memset(c + i * ldc * es, 0, static_cast<size_t>(cols * es));
}

// Note [Rows past the last offset are zeros]
// Rows (2-d self) or columns (2-d mat2) past offs[-1] belong to no group.
// ATen's kernels leave them as the allocator gave them (transformers masks
// them when it uses them, for expert parallelism); here they are zeros, so
// that a result never depends on what the memory held before.

// aten::_grouped_mm(self, mat2, Tensor? offs, Tensor? bias, ScalarType? out_dtype) -> Tensor
void grouped_mm(Call& call) {
  TensorRef a = call.tensor(0), b = call.tensor(1);
  TensorRef offs = call.optional_tensor(2);
  const DT d = dt_of(a.dtype());
  if (dt_of(b.dtype()) != d)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("expected mat2 of self's dtype ") + dt_name(d) +
                                             " but found " + dt_name(dt_of(b.dtype())));
  if ((a.dim() != 2 && a.dim() != 3) || (b.dim() != 2 && b.dim() != 3))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "expected self and mat2 to be 2-d or 3-d but found self " +
                                             shape_of(a) + " and mat2 " + shape_of(b));
  if (call.optional_tensor(3).defined())
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "bias: expected None (ATen's _grouped_mm does not support a bias yet)");
  if (!call.is_none(4) && from_scalar_type(call.int_arg(4)) != d)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("out_dtype: expected None or self's dtype ") +
                                             dt_name(d) + " but found " +
                                             dt_name(from_scalar_type(call.int_arg(4))));
  const bool a2 = a.dim() == 2, b2 = b.dim() == 2;
  if (offs.defined() != (a2 || b2))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(offs.defined() ? "offs: expected None for a 3-d self and a 3-d mat2"
                                         : "offs: expected group offsets for a 2-d self or mat2") +
                  " but found " + (offs.defined() ? "a tensor" : "None") + " (self " + shape_of(a) +
                  ", mat2 " + shape_of(b) + ")");
  if (offs.defined() && (offs.dim() != 1 || dt_of(offs.dtype()) != DT::i32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("offs: expected a 1-d int32 tensor but found a ") +
                                             std::to_string(offs.dim()) + "-d " +
                                             dt_name(dt_of(offs.dtype())) + " tensor");
  const int64_t k_a = a.size(a.dim() - 1), k_b = b.size(b.dim() - 2);
  if (k_a != k_b)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "expected the contraction dimensions to match: self " + shape_of(a) +
                                             " and mat2 " + shape_of(b) + " (" + std::to_string(k_a) +
                                             " vs " + std::to_string(k_b) + ")");
  if (!a2 && !b2 && a.size(0) != b.size(0))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "expected self and mat2 to have the same number of groups but found " + shape_of(a) + " and " +
                  shape_of(b));
  const int64_t groups = a2 && b2 ? offs.size(0) : (a2 ? b.size(0) : a.size(0));
  const int64_t M = a.size(a.dim() - 2), N = b.size(b.dim() - 1);
  const Shape shape = a2 && b2 ? Shape{groups, M, N} : (a2 != b2 ? Shape{M, N} : Shape{groups, M, N});
  TensorRef out = call.output(0, shape, a.dtype());
  if (call.is_meta()) return;
  const int64_t es = dt_size(d);
  const MatrixView va = view_of(call, a, "self"), vb = view_of(call, b, "mat2");
  char* c = out.data<char>();
  std::vector<Product> products;
  auto product = [&](const char* pa, const char* pb, char* pc, int64_t ldc, int64_t m, int64_t n, int64_t k) {
    products.push_back({pa, va.transposed, va.ld, pb, vb.transposed, vb.ld, pc, ldc, m, n, k});
  };
  const int64_t a_batch = a2 ? 0 : a.stride(0) * es, b_batch = b2 ? 0 : b.stride(0) * es;
  if (a2 && !b2) {
    const std::vector<int64_t> g = group_bounds(call, offs, groups, M, "self's rows");
    for (int64_t i = 0; i < groups; ++i)
      product(va.data + g[i] * va.row_stride, vb.data + i * b_batch, c + g[i] * N * es, N, g[i + 1] - g[i], N,
              k_a);
    zero_rows(c + g.back() * N * es, M - g.back(), N, N, es);  // Note [Rows past the last offset are zeros]
  } else if (!a2 && b2) {
    const std::vector<int64_t> g = group_bounds(call, offs, groups, N, "mat2's columns");
    for (int64_t i = 0; i < groups; ++i)
      product(va.data + i * a_batch, vb.data + g[i] * vb.col_stride, c + g[i] * es, N, M, g[i + 1] - g[i],
              k_a);
    for (int64_t r = 0; r < M; ++r)
      std::memset(c + (r * N + g.back()) * es, 0, static_cast<size_t>((N - g.back()) * es));
  } else if (a2 && b2) {
    const std::vector<int64_t> g = group_bounds(call, offs, groups, k_a, "the contraction dimension");
    for (int64_t i = 0; i < groups; ++i) {
      char* ci = c + i * M * N * es;
      if (g[i + 1] == g[i])
        zero_rows(ci, M, N, N, es);  // an empty sum
      else
        product(va.data + g[i] * va.col_stride, vb.data + g[i] * vb.row_stride, ci, N, M, N, g[i + 1] - g[i]);
    }
  } else {
    for (int64_t i = 0; i < groups; ++i)
      product(va.data + i * a_batch, vb.data + i * b_batch, c + i * M * N * es, N, M, N, k_a);
  }
  // Blocks of rows: at least one per compute thread in a large product, at
  // most 256 rows (what the GEMM keeps in cache), at least 32 (a GEMM call
  // per row would cost more than it computes).
  struct Block {
    size_t product;
    int64_t r0, r1;
  };
  std::vector<Block> blocks;
  int64_t total = 0;
  const int64_t threads = std::max<int32_t>(1, call.num_threads());
  for (size_t i = 0; i < products.size(); ++i) {
    const Product& p = products[i];
    if (p.m == 0 || p.n == 0) continue;
    if (p.k == 0) {
      zero_rows(p.c, p.m, p.n, p.ldc, es);
      continue;
    }
    const int64_t rows = std::clamp<int64_t>((p.m + threads - 1) / threads, 32, 256);
    for (int64_t r = 0; r < p.m; r += rows) blocks.push_back({i, r, std::min(p.m, r + rows)});
    total += p.m * p.n * p.k;
  }
  const GemmType type = d == DT::bf16 ? GemmType::bf16 : d == DT::f16 ? GemmType::f16 : GemmType::f32;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t bi = b0; bi < b1; ++bi) {
      const Block& blk = blocks[static_cast<size_t>(bi)];
      const Product& p = products[blk.product];
      GemmArgs g;
      g.type = type;
      g.trans_a = p.ta;
      g.trans_b = p.tb;
      g.m = blk.r1 - blk.r0;
      g.n = p.n;
      g.k = p.k;
      g.lda = p.lda;
      g.ldb = p.ldb;
      g.ldc = p.ldc;
      // Row r of op(A): a row of A, or a column of A stored transposed.
      g.a = p.a + (p.ta ? blk.r0 : blk.r0 * p.lda) * es;
      g.b = p.b;
      g.c = p.c + blk.r0 * p.ldc * es;
      if (type == GemmType::f32) {
        plugin_kernels::gemm_on_this_thread(g);
        continue;
      }
      try {
        plugin_kernels::gemm_on_this_thread(g);
      } catch (const npub::sdk::Error&) {
        half_product_in_float32(g, d);  // Note [Half-type groups the library refuses]
      }
    }
  };
  const int64_t nblocks = static_cast<int64_t>(blocks.size());
  if (total < (int64_t{1} << 18))
    run(0, nblocks);  // small: waking the other threads costs more than they save
  else
    call.parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) { run(b0, b1); });
}

// The strided kernel's predicate: both operands row- or column-major in
// their last two dims (any group stride), offs (if any) and out as they
// come. Anything else goes to the contiguous-only registration.
int32_t gemm_layouts(void*, const NpubValue* args, int32_t num_args) {
  if (num_args < 2) return 0;
  for (int32_t i : {0, 1}) {
    if (args[i].tag != NPUB_VALUE_TENSOR) return 0;
    const TensorRef t(args[i].u.tensor);
    bool transposed;
    int64_t ld;
    if ((t.dim() != 2 && t.dim() != 3) || !matrix_layout(t, transposed, ld)) return 0;
  }
  return 1;
}

}  // namespace

void register_grouped_mm(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  std::vector<DLDataType> dts = {kFloat32};
  // Half types natively where the GEMM has a kernel for them; elsewhere the
  // dispatcher runs them on the float32 kernel.
  for (auto [type, dl] : {std::pair{GemmType::bf16, kBFloat16}, std::pair{GemmType::f16, kFloat16}})
    if (plugin_kernels::gemm_supports(type)) dts.push_back(dl);
  const char* schema =
      "aten::_grouped_mm(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None, ScalarType? "
      "out_dtype=None) -> Tensor";
  r.def(schema);
  r.kernel("aten::_grouped_mm", &grouped_mm).dtypes(dts).arg_dtypes("offs", {kInt32}).contiguous_only();
  r.kernel("aten::_grouped_mm", &grouped_mm)
      .dtypes(dts)
      .arg_dtypes("offs", {kInt32})
      .priority(1)
      .supports(&gemm_layouts);
}

}  // namespace cann_like
