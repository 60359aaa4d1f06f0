// mindspeed_like::npu_rotary_mul and npu_rotary_position_embedding (the same
// rotation under torch_npu's two names and argument orders) and their
// backwards.
//
// y = x * r1 + rotate(x) * r2 along the last dim D, r1 = cos and r2 = sin
// broadcast to x right-aligned (each of their dims 1 or x's, the last D),
// as torch_npu takes them: [1, S, 1, D] or [B, S, 1, D] for a [B, S, N, D]
// x, [S, D] or [1, 1, S, D] for a [B, N, S, D] one. rotate is NeoX's rotate-half (x1, x2 = the halves;
// (-x2, x1)) or GPT-J's interleaved pairs ((x0, x1) -> (-x1, x0)); either
// is a linear map R with R^T = -R, so the backward is
//   dx = g * r1 - rotate(g * r2),  dr1 = sum(g * x),  dr2 = sum(g * rotate(x))
// with the sums over the dims r1 and r2 are broadcast along.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "float_access.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

enum class Rotation { kHalf, kInterleave };

// Where each row (D elements) of x finds its row of a broadcast r: x's
// leading sizes and r's strides over them (0 along a broadcast dim).
struct Broadcast {
  std::vector<int64_t> lead_sizes, r_strides;
  int64_t row_offset(int64_t row) const {
    int64_t off = 0;
    for (size_t d = lead_sizes.size(); d-- > 0;) {
      off += (row % lead_sizes[d]) * r_strides[d];
      row /= lead_sizes[d];
    }
    return off;
  }
};

struct RotaryShape {
  int64_t rows, d;
  Broadcast b1, b2;
};

Broadcast broadcast_of(const Call& call, const TensorRef& r, const char* name, const TensorRef& x,
                       const char* x_name) {
  const int32_t nd = x.dim(), rd = r.dim();
  bool ok = rd >= 1 && rd <= nd && r.size(-1) == x.size(-1);
  Broadcast b;
  int64_t stride = r.dim() >= 1 ? r.size(-1) : 1;
  b.lead_sizes.assign(static_cast<size_t>(nd - 1), 1);
  b.r_strides.assign(static_cast<size_t>(nd - 1), 0);
  for (int32_t i = nd - 2; ok && i >= 0; --i) {
    const int32_t ri = i - (nd - rd);  // r's dim aligned with x's dim i
    b.lead_sizes[static_cast<size_t>(i)] = x.size(i);
    if (ri < 0) continue;
    const int64_t rs = r.size(ri);
    ok = rs == 1 || rs == x.size(i);
    if (rs != 1) b.r_strides[static_cast<size_t>(i)] = stride;
    stride *= rs;
  }
  if (!ok)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string(name) + ": expected a shape that broadcasts to " + x_name + " " +
                  Call::shape_str(x.sizes()) + " (right-aligned: at most " + std::to_string(nd) +
                  " dims, each 1 or " + x_name + "'s, the last " + std::to_string(nd ? x.size(-1) : 0) +
                  ") but found " + Call::shape_str(r.sizes()));
  if (!r.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the dtype of " + x_name + " (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(r.dtype()));
  return b;
}

RotaryShape rotary_shape(const Call& call, const TensorRef& x, const char* x_name, const TensorRef& r1,
                         const char* r1_name, const TensorRef& r2, const char* r2_name) {
  if (x.dim() < 1 || x.size(-1) % 2 != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(x_name) +
                                             ": expected at least 1 dim and an even last dim " +
                                             "but found shape " + Call::shape_str(x.sizes()));
  RotaryShape s{1, x.size(-1), broadcast_of(call, r1, r1_name, x, x_name),
                broadcast_of(call, r2, r2_name, x, x_name)};
  for (int32_t i = 0; i + 1 < x.dim(); ++i) s.rows *= x.size(i);
  return s;
}

Rotation rotation_of_mode_string(const Call& call, const std::string& mode) {
  if (mode == "half") return Rotation::kHalf;
  if (mode == "interleave") return Rotation::kInterleave;
  call.fail(NPUB_ERR_INVALID_ARGUMENT,
            "rotary_mode: expected 'half' or 'interleave' but found '" + mode + "'");
}

Rotation rotation_of_mode_int(const Call& call, int64_t mode) {
  if (mode == 0) return Rotation::kHalf;
  if (mode == 1) return Rotation::kInterleave;
  call.fail(NPUB_ERR_INVALID_ARGUMENT,
            "mode: expected 0 (rotate-half) or 1 (interleaved) but found " + std::to_string(mode));
}

// --- rows ---

template <typename S>
struct RotaryRows {
  using E = typename S::E;
  const E *x, *r1, *r2, *g;  // g: the backward's incoming gradient
  E* y;                      // forward: y; backward: dx
  typename S::T *dr1, *dr2;  // backward: this block's partial sums, in r1's and r2's layouts
  const RotaryShape* shape;
};

// y = x * c + rotate(x) * s over one row of n.
template <typename S, Rotation R>
PLUGIN_KERNELS_INLINE void rotate_row(const typename S::E* __restrict x, const typename S::E* __restrict c,
                                      const typename S::E* __restrict s, typename S::E* __restrict y,
                                      int64_t n) {
  using T = typename S::T;
  const int64_t h = n / 2;
  if constexpr (R == Rotation::kHalf) {
    for (int64_t j = 0; j < h; ++j)
      y[j] = S::store(S::load(x[j]) * S::load(c[j]) - S::load(x[j + h]) * S::load(s[j]));
    for (int64_t j = h; j < n; ++j)
      y[j] = S::store(S::load(x[j]) * S::load(c[j]) + S::load(x[j - h]) * S::load(s[j]));
  } else {
    for (int64_t i = 0; i < h; ++i) {
      const T x0 = S::load(x[2 * i]), x1 = S::load(x[2 * i + 1]);
      y[2 * i] = S::store(x0 * S::load(c[2 * i]) - x1 * S::load(s[2 * i]));
      y[2 * i + 1] = S::store(x1 * S::load(c[2 * i + 1]) + x0 * S::load(s[2 * i + 1]));
    }
  }
}

// One row of the backward: dx = g * c - rotate(g * s); dc += g * x; ds += g * rotate(x).
template <typename S, Rotation R>
PLUGIN_KERNELS_INLINE void rotate_row_backward(const typename S::E* __restrict g,
                                               const typename S::E* __restrict x,
                                               const typename S::E* __restrict c,
                                               const typename S::E* __restrict s,
                                               typename S::E* __restrict dx, typename S::T* __restrict dc,
                                               typename S::T* __restrict ds, int64_t n) {
  using T = typename S::T;
  const int64_t h = n / 2;
  if constexpr (R == Rotation::kHalf) {
    for (int64_t j = 0; j < h; ++j) {
      const T gj = S::load(g[j]), gh = S::load(g[j + h]);
      dx[j] = S::store(gj * S::load(c[j]) + gh * S::load(s[j + h]));
      dc[j] += gj * S::load(x[j]);
      ds[j] -= gj * S::load(x[j + h]);
    }
    for (int64_t j = h; j < n; ++j) {
      const T gj = S::load(g[j]), gl = S::load(g[j - h]);
      dx[j] = S::store(gj * S::load(c[j]) - gl * S::load(s[j - h]));
      dc[j] += gj * S::load(x[j]);
      ds[j] += gj * S::load(x[j - h]);
    }
  } else {
    for (int64_t i = 0; i < h; ++i) {
      const T g0 = S::load(g[2 * i]), g1 = S::load(g[2 * i + 1]);
      const T x0 = S::load(x[2 * i]), x1 = S::load(x[2 * i + 1]);
      dx[2 * i] = S::store(g0 * S::load(c[2 * i]) + g1 * S::load(s[2 * i + 1]));
      dx[2 * i + 1] = S::store(g1 * S::load(c[2 * i + 1]) - g0 * S::load(s[2 * i]));
      dc[2 * i] += g0 * x0;
      dc[2 * i + 1] += g1 * x1;
      ds[2 * i] -= g0 * x1;
      ds[2 * i + 1] += g1 * x0;
    }
  }
}

// Compiled for AVX2 and baseline x86-64 (Note [One ISA layer for the in-tree plugins]).
template <typename S, Rotation R, bool Backward>
struct RotaryRowsBody {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const RotaryRows<S>& a, int64_t r0, int64_t r1) {
    const RotaryShape& sh = *a.shape;
    const int64_t n = sh.d;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o1 = sh.b1.row_offset(r), o2 = sh.b2.row_offset(r);
      if constexpr (Backward)
        rotate_row_backward<S, R>(a.g + r * n, a.x + r * n, a.r1 + o1, a.r2 + o2, a.y + r * n, a.dr1 + o1,
                                  a.dr2 + o2, n);
      else
        rotate_row<S, R>(a.x + r * n, a.r1 + o1, a.r2 + o2, a.y + r * n, n);
    }
  }
};
template <typename S, Rotation R, bool Backward>
void rotary_rows(const RotaryRows<S>& a, int64_t r0, int64_t r1) {
  run_at_kernel_isa<RotaryRowsBody<S, R, Backward>, Isa::kAvx2>(a, r0, r1);
}

template <typename S, bool Backward>
auto pick_rows(Rotation rot) {
  return rot == Rotation::kHalf ? &rotary_rows<S, Rotation::kHalf, Backward>
                                : &rotary_rows<S, Rotation::kInterleave, Backward>;
}

// --- the ops ---
// Both ops' forms share these bodies: `Form` gives the argument positions and
// names and how the mode arrives.

struct Form {
  int x, r1, r2, g;  // argument indices (g: the backward's gradient, -1 in the forward)
  const char *x_name, *r1_name, *r2_name;
  int mode;  // argument index of the mode
  bool mode_is_string;
};
// npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half')
constexpr Form kRotaryMul{0, 1, 2, -1, "self", "r1", "r2", 3, true};
// npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half')
constexpr Form kRotaryMulBackward{1, 2, 3, 0, "self", "r1", "r2", 4, true};
// npu_rotary_position_embedding(Tensor x, Tensor cos, Tensor sin, int mode=0)
constexpr Form kRope{0, 1, 2, -1, "x", "cos", "sin", 3, false};
// npu_rotary_position_embedding_backward(Tensor grad, Tensor cos, Tensor sin, Tensor x, int mode=0)
constexpr Form kRopeBackward{3, 1, 2, 0, "x", "cos", "sin", 4, false};

struct RotaryOutputs {
  TensorRef y, dr1, dr2;  // y: the forward's result or the backward's dx
  RotaryShape shape;
  Rotation rotation;
};

// Checks the arguments and declares the returns (y; or dx, dr1, dr2); on
// its own it is the op's meta function.
template <const Form& F>
RotaryOutputs rotary_outputs(Call& call) {
  TensorRef x = call.tensor(F.x), r1 = call.tensor(F.r1), r2 = call.tensor(F.r2);
  const Rotation rot = F.mode_is_string ? rotation_of_mode_string(call, call.string_arg(F.mode))
                                        : rotation_of_mode_int(call, call.int_arg(F.mode));
  RotaryShape s = rotary_shape(call, x, F.x_name, r1, F.r1_name, r2, F.r2_name);
  RotaryOutputs o{TensorRef(), TensorRef(), TensorRef(), std::move(s), rot};
  if (F.g >= 0) {
    TensorRef g = call.tensor(F.g);
    if (g.sizes() != x.sizes() || !g.is(x.dtype()))
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                std::string("grad: expected the shape and dtype of ") + F.x_name + " " +
                    Call::shape_str(x.sizes()) + " " + npub::sdk::dtype_name(x.dtype()) + " but found " +
                    Call::shape_str(g.sizes()) + " " + npub::sdk::dtype_name(g.dtype()));
    o.y = call.output(0, x.sizes(), x.dtype());
    o.dr1 = call.output(1, r1.sizes(), r1.dtype());
    o.dr2 = call.output(2, r2.sizes(), r2.dtype());
  } else {
    o.y = call.output(0, x.sizes(), x.dtype());
  }
  return o;
}

template <const Form& F>
void rotary_meta(Call& call) {
  rotary_outputs<F>(call);
}

template <const Form& F>
void rotary_forward(Call& call) {
  TensorRef x = call.tensor(F.x), r1 = call.tensor(F.r1), r2 = call.tensor(F.r2);
  const RotaryOutputs o = rotary_outputs<F>(call);
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const RotaryRows<S> a{elements<S>(x),   elements<S>(r1), elements<S>(r2), nullptr,
                          elements<S>(o.y), nullptr,         nullptr,         &o.shape};
    auto rows_fn = pick_rows<S, false>(o.rotation);
    call.parallel_for(0, o.shape.rows, std::max<int64_t>(1, 16384 / o.shape.d),
                      [&](int64_t b, int64_t e) { rows_fn(a, b, e); });
  });
}

// dx row by row in one block of rows per compute thread; each block sums
// dr1 and dr2 into partial copies of r1 and r2 (one shared copy when r is
// not broadcast: then no two rows meet), which one pass adds up.
template <const Form& F>
void rotary_backward(Call& call) {
  TensorRef g = call.tensor(F.g), x = call.tensor(F.x), r1 = call.tensor(F.r1), r2 = call.tensor(F.r2);
  const RotaryOutputs o = rotary_outputs<F>(call);
  const int64_t rows = o.shape.rows;
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using T = typename S::T;
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(call.num_threads(), rows));
    const int64_t n1 = r1.numel(), n2 = r2.numel();
    const int64_t p1 = n1 < x.numel() ? blocks : 1, p2 = n2 < x.numel() ? blocks : 1;
    const int64_t total = p1 * n1 + p2 * n2;
    T* partial =
        static_cast<T*>(call.scratch(sizeof(T) * static_cast<uint64_t>(std::max<int64_t>(total, 1))));
    std::memset(partial, 0, sizeof(T) * static_cast<size_t>(total));
    T* part1 = partial;
    T* part2 = partial + p1 * n1;
    auto rows_fn = pick_rows<S, true>(o.rotation);
    call.parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const RotaryRows<S> a{elements<S>(x),
                              elements<S>(r1),
                              elements<S>(r2),
                              elements<S>(g),
                              elements<S>(o.y),
                              part1 + (p1 > 1 ? blk * n1 : 0),
                              part2 + (p2 > 1 ? blk * n2 : 0),
                              &o.shape};
        rows_fn(a, rows * blk / blocks, rows * (blk + 1) / blocks);
      }
    });
    auto finish = [&](const TensorRef& out, const T* part, int64_t n, int64_t copies) {
      typename S::E* po = elements<S>(out);
      call.parallel_for(0, n, 4096, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          T s = 0;
          for (int64_t c = 0; c < copies; ++c) s += part[c * n + k];
          po[k] = S::store(s);
        }
      });
    };
    finish(o.dr1, part1, n1, p1);
    finish(o.dr2, part2, n2, p2);
  });
}

}  // namespace

void register_rotary(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const auto dtypes = {kFloat32, kFloat16, kBFloat16, kFloat64};
  r.def(
      "mindspeed_like::npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor");
  r.kernel("mindspeed_like::npu_rotary_mul", &rotary_forward<kRotaryMul>)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&rotary_meta<kRotaryMul>>("mindspeed_like::npu_rotary_mul");
  r.def(
      "mindspeed_like::npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str "
      "rotary_mode='half') -> (Tensor, Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rotary_mul_backward", &rotary_backward<kRotaryMulBackward>)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&rotary_meta<kRotaryMulBackward>>("mindspeed_like::npu_rotary_mul_backward");
  r.derivative("mindspeed_like::npu_rotary_mul",
               "self, r1, r2: mindspeed_like::npu_rotary_mul_backward(grad, self, r1, r2, rotary_mode)");

  r.def(
      "mindspeed_like::npu_rotary_position_embedding(Tensor x, Tensor cos, Tensor sin, int mode=0) -> "
      "Tensor");
  r.kernel("mindspeed_like::npu_rotary_position_embedding", &rotary_forward<kRope>)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&rotary_meta<kRope>>("mindspeed_like::npu_rotary_position_embedding");
  r.def(
      "mindspeed_like::npu_rotary_position_embedding_backward(Tensor grad, Tensor cos, Tensor sin, Tensor x, "
      "int "
      "mode=0) -> (Tensor, Tensor, Tensor)");
  r.kernel("mindspeed_like::npu_rotary_position_embedding_backward", &rotary_backward<kRopeBackward>)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&rotary_meta<kRopeBackward>>("mindspeed_like::npu_rotary_position_embedding_backward");
  r.derivative(
      "mindspeed_like::npu_rotary_position_embedding",
      "x, cos, sin: mindspeed_like::npu_rotary_position_embedding_backward(grad, cos, sin, x, mode)");
}

}  // namespace mindspeed_like
