// Elementwise ops with broadcasting: add, mul (.out overloads) and relu.
#include "ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace cann_like {

using npub::sdk::Call;
using npub::sdk::TensorRef;

namespace {

std::vector<int64_t> broadcast_shape(const Call& call, const TensorRef& a, const TensorRef& b) {
  const int32_t n = std::max(a.dim(), b.dim());
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t ia = a.dim() - n + i, ib = b.dim() - n + i;
    const int64_t sa = ia >= 0 ? a.size(ia) : 1, sb = ib >= 0 ? b.size(ib) : 1;
    if (sa != sb && sa != 1 && sb != 1)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "the size of tensor a (" + std::to_string(sa) + ") must match the size of tensor b (" +
                    std::to_string(sb) + ") at non-singleton dimension " + std::to_string(i));
    out[static_cast<size_t>(i)] = sa == 1 ? sb : sa;
  }
  return out;
}

// Strides of `t` broadcast to `shape` (0 along broadcast dims).
std::vector<int64_t> broadcast_strides(const TensorRef& t, const std::vector<int64_t>& shape) {
  const auto n = static_cast<int32_t>(shape.size());
  std::vector<int64_t> s(shape.size(), 0);
  for (int32_t i = 0; i < t.dim(); ++i) {
    const int32_t o = n - t.dim() + i;
    s[static_cast<size_t>(o)] = t.size(i) == 1 ? 0 : t.stride(i);
  }
  return s;
}

template <typename T, typename Op>
void binary_kernel(Call& call, const TensorRef& a, const TensorRef& b, const TensorRef& out, Op op) {
  const std::vector<int64_t> shape = out.sizes();
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  if (a.sizes() == shape && b.sizes() == shape && a.is_contiguous() && b.is_contiguous() &&
      out.is_contiguous()) {
    call.parallel_for(0, numel, 1 << 15, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) po[i] = op(pa[i], pb[i]);
    });
    return;
  }
  const auto sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  const auto so = out.strides();
  const auto nd = static_cast<int32_t>(shape.size());
  const int64_t inner = nd > 0 ? shape.back() : 1;
  const int64_t rows = numel / inner;
  call.parallel_for(0, rows, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t oa = 0, ob = 0, oo = 0, rem = r;
      for (int32_t d = nd - 2; d >= 0; --d) {
        const auto ud = static_cast<size_t>(d);
        const int64_t idx = rem % shape[ud];
        rem /= shape[ud];
        oa += idx * sa[ud];
        ob += idx * sb[ud];
        oo += idx * so[ud];
      }
      const int64_t ia = nd > 0 ? sa.back() : 0, ib = nd > 0 ? sb.back() : 0, io = nd > 0 ? so.back() : 1;
      for (int64_t i = 0; i < inner; ++i) po[oo + i * io] = op(pa[oa + i * ia], pb[ob + i * ib]);
    }
  });
}

template <typename Op>
void binary_out(Call& call, double alpha, Op op_factory) {
  TensorRef a = call.tensor(0), b = call.tensor(1);
  TensorRef out = call.tensor(call.num_args() - 1);
  if (!a.is(b.dtype()) || !a.is(out.dtype()))
    call.fail(NPUB_ERR_UNSUPPORTED, "mixed dtypes (" + npub::sdk::dtype_name(a.dtype()) + ", " +
                                        npub::sdk::dtype_name(b.dtype()) + " -> " +
                                        npub::sdk::dtype_name(out.dtype()) + ") are not served by this kernel");
  const std::vector<int64_t> shape = broadcast_shape(call, a, b);
  if (out.sizes() != shape)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected shape " + Call::shape_str(shape) + " but found " +
                                             Call::shape_str(out.sizes()));
  if (a.is(npub::sdk::kFloat32)) binary_kernel<float>(call, a, b, out, op_factory(float(alpha)));
  else if (a.is(npub::sdk::kFloat64)) binary_kernel<double>(call, a, b, out, op_factory(double(alpha)));
  else if (a.is(npub::sdk::kInt64)) binary_kernel<int64_t>(call, a, b, out, op_factory(int64_t(alpha)));
  else if (a.is(npub::sdk::kInt32)) binary_kernel<int32_t>(call, a, b, out, op_factory(int32_t(alpha)));
  else call.fail(NPUB_ERR_UNSUPPORTED, "dtype " + npub::sdk::dtype_name(a.dtype()));
}

// aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)
void add_out(Call& call) {
  const double alpha = call.scalar_arg(2);
  binary_out(call, alpha, [](auto al) {
    return [al](auto x, auto y) { return static_cast<decltype(x)>(x + al * y); };
  });
}

// aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)
void mul_out(Call& call) {
  binary_out(call, 1.0, [](auto) { return [](auto x, auto y) { return static_cast<decltype(x)>(x * y); }; });
}

// aten::relu(Tensor self) -> Tensor
void relu(Call& call) {
  TensorRef x = call.tensor(0);
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  const int64_t n = x.numel();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    call.parallel_for(0, n, 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) py[i] = px[i] > T(0) ? px[i] : T(0);
    });
  };
  if (x.is(npub::sdk::kFloat32)) run(float{});
  else if (x.is(npub::sdk::kFloat64)) run(double{});
  else if (x.is(npub::sdk::kInt64)) run(int64_t{});
  else run(int32_t{});
}

}  // namespace

void register_elementwise(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  r.def("aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)");
  r.def("aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)");
  r.def("aten::relu(Tensor self) -> Tensor");
  r.kernel("aten::add.out", &add_out).dtypes({kFloat32, kFloat64, kInt64, kInt32});
  r.kernel("aten::mul.out", &mul_out).dtypes({kFloat32, kFloat64, kInt64, kInt32});
  r.kernel("aten::relu", &relu).dtypes({kFloat32, kFloat64, kInt64, kInt32}).contiguous_only();
}

}  // namespace cann_like
