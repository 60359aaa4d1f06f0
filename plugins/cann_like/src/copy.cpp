// Copy and fill: copy_ (any dtype to any, strided, broadcasting src), fill_,
// zero_, clone.
#include "elementwise.h"
#include "ops.h"
#include "scalar_range.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace cann_like {

void copy_into(const Call& call, const TensorRef& dst, const TensorRef& src) {
  const Shape b = broadcast(call, dst.sizes(), src.sizes());
  if (b != dst.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "src of shape " + shape_str(src.sizes()) +
                                             " cannot be broadcast to self of shape " +
                                             shape_str(dst.sizes()));
  Iter it = make_iter(dst, {src});
  const DT sd = dt_of(src.dtype());
  if (it.contiguous() && it.dt[0] == sd) {  // a plain memory copy
    const int64_t es = dt_size(sd);
    for_each_row(call, it, [&](char** p, const int64_t*, int64_t n) {
      std::memmove(p[0], p[1], static_cast<size_t>(n * es));
    });
    return;
  }
  // float32 <-> bfloat16 / float16 (autocast's casts, a model's .half()):
  // dense rows go through the block converters; the generic loop took 2 ns
  // an element, 17x ATen's vectorised cast.
  const DT dd = it.dt[0];
  const bool to_half = sd == DT::f32 && (dd == DT::bf16 || dd == DT::f16);
  if (to_half || (dd == DT::f32 && (sd == DT::bf16 || sd == DT::f16))) {
    const int64_t des = dt_size(dd), ses = dt_size(sd);
    for_each_row(call, it, [&](char** p, const int64_t* s, int64_t n) {
      if (s[0] == des && s[1] == ses) {
        if (to_half)
          float_block_to_half(reinterpret_cast<const float*>(p[1]), p[0], dd, n);
        else
          half_block_to_float(p[1], sd, reinterpret_cast<float*>(p[0]), n);
        return;
      }
      for (int64_t j = 0; j < n; ++j) store<float>(p[0] + j * s[0], dd, load<float>(p[1] + j * s[1], sd));
    });
    return;
  }
  // Convert through the source's compute type (exact for every pair but
  // int64 -> float, where ATen also rounds).
  visit_compute(sd == DT::f16 || sd == DT::bf16 ? DT::f32 : sd, [&](auto tag) {
    using T = decltype(tag);
    run_elementwise<T>(call, it, [](T v) { return v; });
  });
}

namespace {

// aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False)
void copy_(Call& call) { copy_into(call, call.tensor(0), call.tensor(1)); }

// Writes the element at `elem` (es bytes, self's dtype) to every element of
// self: unit-stride runs as a typed std::fill_n, or a memset when the
// element's bytes are all one byte (zero_, fill_(0): 3.4x faster than the
// typed fill on a [4, 128, 688] float32), strided ones element by element.
template <typename U>
void fill_runs(const Call& call, const Iter& it, const char* elem) {
  U bits;
  std::memcpy(&bits, elem, sizeof(U));
  const bool one_byte = std::all_of(elem, elem + sizeof(U), [&](char b) { return b == elem[0]; });
  for_each_row(call, it, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == static_cast<int64_t>(sizeof(U))) {
      if (one_byte)
        std::memset(p[0], elem[0], static_cast<size_t>(n) * sizeof(U));
      else
        std::fill_n(reinterpret_cast<U*>(p[0]), n, bits);
      return;
    }
    for (int64_t j = 0; j < n; ++j) std::memcpy(p[0] + j * s[0], &bits, sizeof(U));
  });
}

// Note [A fill converts its value once]
// fill_ converts the scalar to self's dtype once (copy_into a one-element
// tensor: ATen's conversion rules, as a copy_ has them) and writes that
// element's bytes everywhere. Converting per element through the 0-d
// scalar's broadcast took 1 ns an element: a [4, 4, 128, 128] fill_(1.0)
// ran 35x ATen's time.
void fill_with(const Call& call, const TensorRef& self, const NpubValue& value) {
  if (self.numel() == 0) return;
  alignas(16) unsigned char elem[16] = {};
  DLTensor one{};
  one.data = elem;
  one.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_CPU), 0};
  one.ndim = 0;
  one.dtype = self.dtype();
  // An integer 0 is all zero bytes in every dtype (elem already is).
  if (value.tag != NPUB_VALUE_INT || value.u.i != 0) {
    ScalarTensor v(value);
    copy_into(call, TensorRef(&one), v.ref());
  }
  const int64_t es = dt_size(dt_of(self.dtype()));
  const Iter it = make_iter(self, {});
  const char* e = reinterpret_cast<const char*>(elem);
  switch (es) {
    case 1:
      return fill_runs<uint8_t>(call, it, e);
    case 2:
      return fill_runs<uint16_t>(call, it, e);
    case 4:
      return fill_runs<uint32_t>(call, it, e);
    case 8:
      return fill_runs<uint64_t>(call, it, e);
    default:
      for_each_row(call, it, [&](char** p, const int64_t* s, int64_t n) {
        for (int64_t j = 0; j < n; ++j) std::memcpy(p[0] + j * s[0], elem, static_cast<size_t>(es));
      });
  }
}

// aten::fill_.Scalar(Tensor(a!) self, Scalar value)
void fill_(Call& call) {
  TensorRef self = call.tensor(0);
  // ATen's fill_ checks the value, except that it writes a one-element
  // half tensor through a scalar path that converts unchecked (1e40: inf).
  const DT d = dt_of(self.dtype());
  if (!((d == DT::f16 || d == DT::bf16) && self.numel() == 1)) check_scalar_fits(call, call.arg(1), d);
  fill_with(call, self, call.arg(1));
}

// aten::zero_(Tensor(a!) self): a fill with 0, memsets over the compute
// threads (one thread's memset of a 1.4 MB activation took 1.6x ATen's
// parallel fill).
void zero_(Call& call) {
  NpubValue zero{};
  zero.tag = NPUB_VALUE_INT;
  fill_with(call, call.tensor(0), zero);
}

// aten::clone(Tensor self, *, MemoryFormat? memory_format=None): contiguous
// Dense (no gaps, no overlap) in some order of the dimensions.
bool dense(const TensorRef& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that matter
  for (int32_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

// The result is contiguous. ATen lays a clone out otherwise for
// channels_last formats, and under `preserve` (the default) for an input
// that is dense but not contiguous (it keeps the strides) or a 4-d/5-d one
// (it may suggest channels_last): those are declined, and the host's clone
// lays them out.
void clone(Call& call) {
  TensorRef self = call.tensor(0);
  enum : int64_t { kContiguousFormat = 0, kPreserveFormat = 1 };
  const int64_t format = call.is_none(1) ? kPreserveFormat : call.int_arg(1);
  const bool contiguous_result =
      format == kContiguousFormat ||
      (format == kPreserveFormat && (self.is_contiguous() || (!dense(self) && self.dim() < 4)));
  if (!contiguous_result) call.fail(NPUB_ERR_UNSUPPORTED, "a clone laid out other than contiguously");
  copy_into(call, call.output(0, self.sizes(), self.dtype()), self);
}

// aten::arange.start_out(Scalar start, Scalar end, Scalar step=1, *, out):
// out[i] = start + i * step, computed in double (ATen's accumulate type on
// the CPU) and cast; out has ATen's length ceil((end - start) / step).
void arange(Call& call) {
  TensorRef out = call.tensor(3);
  const DT d = dt_of(out.dtype());
  if (d == DT::b8) call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: arange is not implemented for bool");
  const bool integral = !is_floating(d);
  const bool int_scalars = call.arg(0).tag == NPUB_VALUE_INT && call.arg(1).tag == NPUB_VALUE_INT &&
                           call.arg(2).tag == NPUB_VALUE_INT;
  // ATen truncates floating bounds to the integral dtype before sizing;
  // rather than mirror every corner of that, hand such calls to the host.
  if (integral && !int_scalars) call.fail(NPUB_ERR_UNSUPPORTED, "floating bounds with an integral out");
  auto value = [&](int32_t i) { return call.scalar_arg(i); };
  const double start = value(0), end = value(1), step = value(2);
  if (!std::isfinite(start) || !std::isfinite(end))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "unsupported range: " + std::to_string(start) + " -> " + std::to_string(end));
  if (step == 0) call.fail(NPUB_ERR_INVALID_ARGUMENT, "step must be nonzero");
  if (!((step > 0 && end >= start) || (step < 0 && end <= start)))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "upper bound and larger bound inconsistent with step sign");
  double size_d;
  if (integral) {
    const int64_t s = call.arg(0).u.i, e = call.arg(1).u.i, st = call.arg(2).u.i;
    const int64_t sgn = (st > 0) - (st < 0);
    size_d = static_cast<double>((e - s + st - sgn) / st);  // integer division, as ATen
  } else {
    size_d = std::ceil((end - start) / step);
  }
  if (!(size_d >= 0 && size_d <= static_cast<double>(std::numeric_limits<int64_t>::max())))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "invalid size, possible overflow?");
  const int64_t size = static_cast<int64_t>(size_d);
  if (out.numel() != size)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "out: expected " + std::to_string(size) + " elements but found " + std::to_string(out.numel()));
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    char* p = out.data<char>();
    const int64_t es = dt_size(d);
    call.parallel_for(0, size, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        store<T>(p + i * es, d, static_cast<T>(start + step * static_cast<double>(i)));
    });
  });
}

}  // namespace

void register_copy(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  r.op("aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)", &copy_)
      .dtypes(all)
      .any_dtype("src")  // copy_ converts
      .alias_safe();
  r.op("aten::fill_.Scalar(Tensor(a!) self, Scalar value) -> Tensor(a!)", &fill_).dtypes(all).alias_safe();
  r.op("aten::zero_(Tensor(a!) self) -> Tensor(a!)", &zero_).dtypes(all).alias_safe();
  r.op("aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", &clone).dtypes(all);
  r.op("aten::arange.start_out(Scalar start, Scalar end, Scalar step=1, *, Tensor(a!) out) -> Tensor(a!)",
       &arange)
      .dtypes(dtypes_numeric())
      .contiguous_only();
}

}  // namespace cann_like
