// mindspeed_like::npu_swiglu and its backward: silu(a) * b with a, b the two
// halves of self along dim, in one pass (the composite chunk + silu + mul
// reads and writes the tensor three times, and its backward five).
#include <algorithm>
#include <string>
#include <vector>

#include "float_access.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// self seen as [outer, 2, len]: len = (size(dim) / 2) * (the sizes after
// dim), so that a is the first len elements of each outer row and b the
// next len.
struct SwigluShape {
  int64_t outer, len;
  std::vector<int64_t> half_shape;  // self's shape with size(dim) halved
};

SwigluShape swiglu_shape(const Call& call, const TensorRef& x, int64_t dim) {
  const int64_t nd = x.dim();
  if (nd == 0 || dim < -nd || dim >= nd)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "dim: expected a dimension of the " + std::to_string(nd) +
                                             "-d self (in [" + std::to_string(-std::max<int64_t>(nd, 1)) +
                                             ", " + std::to_string(std::max<int64_t>(nd, 1) - 1) +
                                             "]) but found " + std::to_string(dim));
  const auto d = static_cast<size_t>(dim < 0 ? dim + nd : dim);
  std::vector<int64_t> shape = x.sizes();
  if (shape[d] % 2 != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "self: expected an even size along dim " + std::to_string(dim) +
                                             " but found " + std::to_string(shape[d]) + " (shape " +
                                             Call::shape_str(shape) + ")");
  shape[d] /= 2;
  int64_t outer = 1, len = 1;
  for (size_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d; i < shape.size(); ++i) len *= shape[i];
  return {outer, len, shape};
}

// Runs f(o, r0, r1) over every outer row o and its [r0, r1) stretch of the
// half-length index space, split over the compute threads.
template <typename F>
void for_each_stretch(const Call& call, int64_t outer, int64_t len, F&& f) {
  call.parallel_for(0, outer * len, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t o = b / len; o * len < e; ++o) {
      const int64_t r0 = std::max(b, o * len) - o * len, r1 = std::min(e, (o + 1) * len) - o * len;
      f(o, r0, r1);
    }
  });
}

// --- forward ---

// Compiled for AVX2 and baseline x86-64 (Note [One ISA layer for the in-tree plugins]).
template <typename S>
struct SwigluElements {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const typename S::E* __restrict a, const typename S::E* __restrict b,
                                        typename S::E* __restrict y, int64_t n) {
    using T = typename S::T;
    for (int64_t i = 0; i < n; ++i) {
      const T av = S::load(a[i]);
      y[i] = S::store(av * sigmoid(av) * S::load(b[i]));
    }
  }
};

// mindspeed_like::npu_swiglu(Tensor self, int dim=-1) -> Tensor
// Checks the arguments and declares the return; on its own it is the op's
// meta function.
struct SwigluOutputs {
  TensorRef y;
  SwigluShape shape;
};
SwigluOutputs swiglu_outputs(Call& call) {
  TensorRef x = call.tensor(0);
  SwigluShape s = swiglu_shape(call, x, call.int_arg(1));
  TensorRef y = call.output(0, s.half_shape, x.dtype());
  return {y, std::move(s)};
}

void swiglu_meta(Call& call) { swiglu_outputs(call); }

void swiglu(Call& call) {
  TensorRef x = call.tensor(0);
  const SwigluOutputs o = swiglu_outputs(call);
  const int64_t len = o.shape.len;
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const typename S::E* px = elements<S>(x);
    typename S::E* py = elements<S>(o.y);
    for_each_stretch(call, o.shape.outer, len, [&](int64_t row, int64_t r0, int64_t r1) {
      const typename S::E* a = px + row * 2 * len + r0;
      run_at_kernel_isa<SwigluElements<S>, Isa::kAvx2>(a, a + len, py + row * len + r0, r1 - r0);
    });
  });
}

// --- backward ---
// y = silu(a) * b, silu(a) = a * s, s = sigmoid(a):
//   da = g * b * s * (1 + a * (1 - s)),  db = g * silu(a)

template <typename S>
struct SwigluBackwardElements {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const typename S::E* __restrict g, const typename S::E* __restrict a,
                                        const typename S::E* __restrict b, typename S::E* __restrict da,
                                        typename S::E* __restrict db, int64_t n) {
    using T = typename S::T;
    for (int64_t i = 0; i < n; ++i) {
      const T gv = S::load(g[i]), av = S::load(a[i]), bv = S::load(b[i]);
      const T s = sigmoid(av);
      da[i] = S::store(gv * bv * s * (T(1) + av * (T(1) - s)));
      db[i] = S::store(gv * av * s);
    }
  }
};

// mindspeed_like::npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor
struct SwigluBackwardOutputs {
  TensorRef dx;
  SwigluShape shape;
};
SwigluBackwardOutputs swiglu_backward_outputs(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1);
  SwigluShape s = swiglu_shape(call, x, call.int_arg(2));
  if (g.sizes() != s.half_shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output: expected the shape of the forward's result " +
                                             Call::shape_str(s.half_shape) + " but found " +
                                             Call::shape_str(g.sizes()));
  if (!g.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad_output: expected the dtype of self (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(g.dtype()));
  TensorRef dx = call.output(0, x.sizes(), x.dtype());
  return {dx, std::move(s)};
}

void swiglu_backward_meta(Call& call) { swiglu_backward_outputs(call); }

void swiglu_backward(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1);
  const SwigluBackwardOutputs o = swiglu_backward_outputs(call);
  const int64_t len = o.shape.len;
  with_float_types(call, x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const typename S::E* pg = elements<S>(g);
    const typename S::E* px = elements<S>(x);
    typename S::E* pdx = elements<S>(o.dx);
    for_each_stretch(call, o.shape.outer, len, [&](int64_t row, int64_t r0, int64_t r1) {
      const int64_t off = row * 2 * len + r0;
      run_at_kernel_isa<SwigluBackwardElements<S>, Isa::kAvx2>(pg + row * len + r0, px + off, px + off + len,
                                                               pdx + off, pdx + off + len, r1 - r0);
    });
  });
}

}  // namespace

void register_swiglu(npub::sdk::Registrar& r) {
  const auto dtypes = {npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16, npub::sdk::kFloat64};
  r.def("mindspeed_like::npu_swiglu(Tensor self, int dim=-1) -> Tensor");
  r.kernel("mindspeed_like::npu_swiglu", &swiglu).dtypes(dtypes).contiguous_only().opt_level(2);
  r.meta<&swiglu_meta>("mindspeed_like::npu_swiglu");
  r.def("mindspeed_like::npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor");
  r.kernel("mindspeed_like::npu_swiglu_backward", &swiglu_backward)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&swiglu_backward_meta>("mindspeed_like::npu_swiglu_backward");
  r.derivative("mindspeed_like::npu_swiglu", "self: mindspeed_like::npu_swiglu_backward(grad, self, dim)");
}

}  // namespace mindspeed_like
