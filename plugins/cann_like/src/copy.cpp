// Copy and fill: copy_ (any dtype to any, strided, broadcasting src), fill_,
// zero_, clone.
#include "elementwise.h"
#include "ops.h"

#include <cmath>

namespace cann_like {

namespace {

void copy_into(const Call& call, const TensorRef& dst, const TensorRef& src) {
  const Shape b = broadcast(call, dst.sizes(), src.sizes());
  if (b != dst.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "src of shape " + shape_str(src.sizes()) +
                                             " cannot be broadcast to self of shape " + shape_str(dst.sizes()));
  Iter it = make_iter(dst, {src});
  const DT sd = dt_of(src.dtype());
  if (it.contiguous() && it.dt[0] == sd) {  // a plain memory copy
    const int64_t es = dt_size(sd);
    for_each_row(call, it, [&](char** p, const int64_t*, int64_t n) { std::memmove(p[0], p[1], static_cast<size_t>(n * es)); });
    return;
  }
  // Convert through the source's compute type (exact for every pair but
  // int64 -> float, where ATen also rounds).
  visit_compute(sd == DT::f16 || sd == DT::bf16 ? DT::f32 : sd, [&](auto tag) {
    using T = decltype(tag);
    run_elementwise<T>(call, it, [](T v) { return v; });
  });
}

// aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False)
void copy_(Call& call) { copy_into(call, call.tensor(0), call.tensor(1)); }

// Whether a scalar converts to dtype d without overflow (ATen's check).
bool fits(const NpubValue& v, DT d) {
  if (d == DT::b8 || v.tag == NPUB_VALUE_BOOL) return true;
  const double x = v.tag == NPUB_VALUE_DOUBLE ? v.u.d : static_cast<double>(v.u.i);
  if (std::isnan(x) || std::isinf(x)) return is_floating(d);
  switch (d) {
    case DT::u8: return x > -1.0 && x < 256.0;
    case DT::i8: return x > -129.0 && x < 128.0;
    case DT::i16: return x > -32769.0 && x < 32768.0;
    case DT::i32: return x > -2147483649.0 && x < 2147483648.0;
    case DT::f16: return std::fabs(x) <= 65504.0;
    default: return true;
  }
}

// aten::fill_.Scalar(Tensor(a!) self, Scalar value)
void fill_(Call& call) {
  TensorRef self = call.tensor(0);
  if (!fits(call.arg(1), dt_of(self.dtype())))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("value cannot be converted to type ") + dt_name(dt_of(self.dtype())) +
                                             " without overflow");
  ScalarTensor v(call.arg(1));
  copy_into(call, self, v.ref());
}

// aten::zero_(Tensor(a!) self)
void zero_(Call& call) {
  TensorRef self = call.tensor(0);
  if (self.is_contiguous()) {
    std::memset(self.data<char>(), 0, static_cast<size_t>(self.numel() * dt_size(dt_of(self.dtype()))));
    return;
  }
  NpubValue zero{};
  zero.tag = NPUB_VALUE_INT;
  ScalarTensor v(zero);
  copy_into(call, self, v.ref());
}

// aten::clone(Tensor self, *, MemoryFormat? memory_format=None): contiguous
void clone(Call& call) {
  TensorRef self = call.tensor(0);
  copy_into(call, call.output(0, self.sizes(), self.dtype()), self);
}

}  // namespace

void register_copy(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  r.def("aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)");
  r.kernel("aten::copy_", &copy_).dtypes(all);
  r.def("aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)");
  r.kernel("aten::fill_.Scalar", &fill_).dtypes(all);
  r.def("aten::zero_(Tensor(a!) self) -> Tensor(a!)");
  r.kernel("aten::zero_", &zero_).dtypes(all);
  r.def("aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor");
  r.kernel("aten::clone", &clone).dtypes(all);
}

}  // namespace cann_like
