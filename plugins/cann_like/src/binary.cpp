// Binary and ternary elementwise ops with broadcasting and type promotion:
// add, sub, mul, div (rounding modes), remainder, pow, maximum, minimum,
// comparisons, logical_and/or, where, masked_fill, clamp, addcmul, addcdiv,
// lerp.
#include "elementwise.h"
#include "ops.h"
#include "scalar_range.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <string_view>

namespace cann_like {

namespace {

// Operands of a binary op: `other` may be a tensor or a Scalar argument.
struct Binary {
  TensorRef a, b, out;
  std::unique_ptr<ScalarTensor> scalar, scalar_a;  // what b (a) refers to when it was made a scalar here
  DT common = DT::unknown;
};

Binary binary_args(Call& call, int32_t a_index, int32_t b_index, int32_t out_index) {
  Binary x;
  x.a = call.tensor(a_index);
  ResultType rt;
  rt.tensor(x.a);
  const NpubValue& bv = call.arg(b_index);
  if (bv.tag == NPUB_VALUE_TENSOR) {
    x.b = call.tensor(b_index);
    rt.tensor(x.b);
  } else {
    x.scalar = std::make_unique<ScalarTensor>(bv);
    x.b = x.scalar->ref();
    rt.scalar_value(bv);
  }
  x.out = call.tensor(out_index);
  x.common = rt.result();
  check_out(call, x.out, broadcast(call, x.a.sizes(), x.b.sizes()));
  // Note [A float32 op reads its scalar operand as a float]
  // A scalar `other` of a float32 op (a Scalar argument; a Python number,
  // which reaches an op as a 0-d float64 tensor; a 0-d tensor of another
  // dtype) is read once as the float ATen's kernel makes of it (its opmath
  // value: one rounding from the original value), so that every operand is
  // float32 and run_elementwise's typed loop with the scalar broadcast along
  // the row serves the call, not the per-element converting loop.
  // The same holds for a 0-d `self` (x.mul_(s) reaches mul.out as (s, x)
  // from the foreach optimizers' per-tensor path).
  if (x.common == DT::f32 && x.a.dim() == 0 && x.b.dim() != 0 && !x.a.is(npub::sdk::kFloat32)) {
    const float f = load<float>(x.a.data<char>(), dt_of(x.a.dtype()));
    x.scalar_a = std::make_unique<ScalarTensor>(f);
    x.a = x.scalar_a->ref();
  }
  if (x.common == DT::f32 && x.b.dim() == 0 && !x.b.is(npub::sdk::kFloat32)) {
    const float f = load<float>(x.b.data<char>(), dt_of(x.b.dtype()));
    x.scalar = std::make_unique<ScalarTensor>(f);
    x.b = x.scalar->ref();
  } else if (!x.scalar && x.b.dim() == 0 && is_floating(x.common) && is_floating(dt_of(x.b.dtype())) &&
             dt_of(x.b.dtype()) != x.common) {
    // A 0-d `other` of another floating dtype (x * torch.tensor(0.1,
    // dtype=float64)) takes part as ATen's type promotion makes it: cast to
    // the common dtype first, not at the compute type's precision.
    char rounded[8];
    store<double>(rounded, x.common, load<double>(x.b.data<char>(), dt_of(x.b.dtype())));
    NpubValue v{};
    v.tag = NPUB_VALUE_DOUBLE;
    v.u.d = load<double>(rounded, x.common);
    x.scalar = std::make_unique<ScalarTensor>(v);
    x.b = x.scalar->ref();
  }
  return x;
}

// The common case, recognised without building an iterator (no
// allocation): tensors `a`, `b` and `out` all float32, contiguous and of one
// shape, as activations in a model mostly are.
bool same_shape_as(const Call& call, int32_t a, int32_t b, int32_t out, DLDataType dtype) {
  if (call.arg(b).tag != NPUB_VALUE_TENSOR) return false;
  const TensorRef ta = call.tensor(a), tb = call.tensor(b), to = call.tensor(out);
  for (const TensorRef* t : {&ta, &tb, &to})
    if (!t->is(dtype) || !t->is_contiguous() || t->dim() != ta.dim()) return false;
  for (int32_t d = 0; d < ta.dim(); ++d)
    if (tb.size(d) != ta.size(d) || to.size(d) != ta.size(d)) return false;
  return true;
}
bool same_shape_f32(const Call& call, int32_t a, int32_t b, int32_t out) {
  return same_shape_as(call, a, b, out, npub::sdk::kFloat32);
}

// The bfloat16 counterpart; false (nothing done) when the operands don't fit.
bool try_same_shape_bf16(Call& call, int32_t a, int32_t b, int32_t out, HalfBinaryOp op, float alpha) {
  if (!same_shape_as(call, a, b, out, npub::sdk::kBFloat16)) return false;
  const uint16_t* pa = call.tensor(a).data<uint16_t>();
  const uint16_t* pb = call.tensor(b).data<uint16_t>();
  uint16_t* po = call.tensor(out).data<uint16_t>();
  call.parallel_for(0, call.tensor(out).numel(), 1 << 14, [&](int64_t s, int64_t e) {
    bf16_binary_contiguous(op, alpha, pa + s, pb + s, po + s, e - s);
  });
  return true;
}

// out[i] = fn(a[i], b[i]) for operands same_shape_f32 accepted (out may be
// a or b itself: each element is read before it is written).
template <typename Fn>
void run_same_shape_f32(Call& call, int32_t a, int32_t b, int32_t out, Fn fn) {
  const float* pa = call.tensor(a).data<float>();
  const float* pb = call.tensor(b).data<float>();
  float* po = call.tensor(out).data<float>();
  call.parallel_for(0, call.tensor(out).numel(), 1 << 14, [&](int64_t s, int64_t e) {
    // Note [float32 elementwise loops per ISA level]
    run_at_kernel_isa<F32Loop2>(po + s, pa + s, pb + s, e - s, fn);
  });
}

template <typename Fn>
void run_binary_as(Call& call, Binary& x, DT compute, Fn&& make_fn) {
  Iter it = make_iter(x.out, {x.a, x.b});
  visit_compute(compute, [&](auto tag) {
    using T = decltype(tag);
    run_elementwise<T>(call, it, make_fn(tag));
  });
}

template <typename T>
T scalar_as(const Call& call, int32_t i) {
  const NpubValue& v = call.arg(i);
  if (v.tag == NPUB_VALUE_DOUBLE) return static_cast<T>(v.u.d);
  return static_cast<T>(v.u.i);
}

// The scalar ATen range-checks for alpha: sub passes -alpha to add's kernel.
NpubValue checked_alpha(const NpubValue& v, bool negate) {
  NpubValue n = v;
  if (!negate) return n;
  if (n.tag == NPUB_VALUE_DOUBLE) n.u.d = -n.u.d;
  if (n.tag == NPUB_VALUE_INT && n.u.i != INT64_MIN) n.u.i = -n.u.i;
  return n;
}

void check_alpha(Call& call, DT common, int32_t alpha_index, bool negate = false) {
  const NpubValue& v = call.arg(alpha_index);
  if (is_integral(common, true) && v.tag == NPUB_VALUE_DOUBLE)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "for integral input tensors, argument alpha must not be a floating point number");
  if (common == DT::b8 && v.tag == NPUB_VALUE_INT && v.u.i != 0 && v.u.i != 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "boolean alpha only supported for Boolean results");
  check_scalar_fits(call, checked_alpha(v, negate), common);
}

// aten::add.out / aten::sub.out (self, other, *, alpha, out); alpha == 1
// gets its own loop (no multiply).
template <bool kSub>
void add_sub_fast(Call& call) {
  const NpubValue& alpha = call.arg(2);
  const bool unit_alpha =
      (alpha.tag == NPUB_VALUE_INT && alpha.u.i == 1) || (alpha.tag == NPUB_VALUE_DOUBLE && alpha.u.d == 1.0);
  if (same_shape_f32(call, 0, 1, 3)) {  // the same loops as below, without the iterator
    if (!unit_alpha) check_scalar_fits(call, checked_alpha(alpha, kSub), DT::f32);
    if (unit_alpha && !kSub) {
      run_same_shape_f32(call, 0, 1, 3, [](float a, float b) { return a + b; });
    } else if (unit_alpha && kSub) {
      run_same_shape_f32(call, 0, 1, 3, [](float a, float b) { return a - b; });
    } else {
      const float al = kSub ? -scalar_as<float>(call, 2) : scalar_as<float>(call, 2);
      run_same_shape_f32(call, 0, 1, 3, [al](float a, float b) { return a + al * b; });
    }
    return;
  }
  if (alpha.tag == NPUB_VALUE_DOUBLE || alpha.tag == NPUB_VALUE_INT) {
    const float al = kSub ? -scalar_as<float>(call, 2) : scalar_as<float>(call, 2);
    const HalfBinaryOp op = unit_alpha && !kSub ? HalfBinaryOp::kAdd : HalfBinaryOp::kAddScaled;
    if (dt_of(call.tensor(0).dtype()) == DT::bf16 && !unit_alpha)
      check_scalar_fits(call, checked_alpha(alpha, kSub), DT::bf16);
    if (try_same_shape_bf16(call, 0, 1, 3, op, al)) return;
  }
  // ATen's sub_check, before the operands' shapes as in ATen.
  if (kSub) {
    const bool a_bool = dt_of(call.tensor(0).dtype()) == DT::b8;
    const bool b_bool = call.arg(1).tag == NPUB_VALUE_TENSOR ? dt_of(call.tensor(1).dtype()) == DT::b8
                                                             : call.arg(1).tag == NPUB_VALUE_BOOL;
    if (a_bool && b_bool)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                "`logical_xor()` operator instead.");
    if (a_bool || b_bool)
      call.fail(
          NPUB_ERR_INVALID_ARGUMENT,
          "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
          "mask, use the `~` or `logical_not()` operator instead.");
  }
  Binary x = binary_args(call, 0, 1, 3);
  check_alpha(call, x.common, 2, kSub);
  check_castable(call, x.common, x.out);
  if (x.common == DT::b8) {
    const bool a = scalar_as<bool>(call, 2);
    run_binary_as(call, x, x.common,
                  [a](auto) { return [a](bool p, bool q) -> bool { return p || (a && q); }; });
    return;
  }
  visit_compute(x.common, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      Iter it = make_iter(x.out, {x.a, x.b});
      if (unit_alpha && !kSub) {
        run_elementwise<T>(call, it, [](T a, T b) { return static_cast<T>(a + b); });
      } else if (unit_alpha && kSub) {
        run_elementwise<T>(call, it, [](T a, T b) { return static_cast<T>(a - b); });
      } else {
        const T al = static_cast<T>(kSub ? -scalar_as<T>(call, 2) : scalar_as<T>(call, 2));
        run_elementwise<T>(call, it, [al](T a, T b) { return static_cast<T>(a + al * b); });
      }
    }
  });
}

// aten::mul.out
void mul(Call& call) {
  if (same_shape_f32(call, 0, 1, 2)) {
    run_same_shape_f32(call, 0, 1, 2, [](float a, float b) { return a * b; });
    return;
  }
  if (try_same_shape_bf16(call, 0, 1, 2, HalfBinaryOp::kMul, 1.0f)) return;
  Binary x = binary_args(call, 0, 1, 2);
  check_castable(call, x.common, x.out);
  run_binary_as(call, x, x.common, [](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>)
      return [](T a, T b) -> T { return a && b; };
    else
      return [](T a, T b) { return static_cast<T>(a * b); };
  });
}

// Whether any element of the iterator's operand `op` (as int64) satisfies
// `pred`: scanned before computing, for checks ATen makes up front.
template <typename Pred>
bool any_element(const Call& call, const Iter& it, int op, Pred pred) {
  Iter probe;
  probe.shape = it.shape;
  probe.nops = 1;
  probe.data[0] = it.data[op];
  probe.dt[0] = it.dt[op];
  probe.strides[0] = it.strides[op];
  std::atomic<bool> found{false};
  for_each_row(call, probe, [&](char** p, const int64_t* s, int64_t n) {
    for (int64_t j = 0; j < n && !found.load(std::memory_order_relaxed); ++j)
      if (pred(load<int64_t>(p[0] + j * s[0], probe.dt[0]))) found = true;
  });
  return found.load();
}

template <typename T>
void check_int_divisor(const Call& call, const Iter& it) {
  if (any_element(call, it, 2, [](int64_t v) { return v == 0; }))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "ZeroDivisionError: integer division by zero");
}

// a / b and a % b for integers without the trap of the one quotient that
// overflows: x86's idiv raises SIGFPE for INT_MIN / -1 (and INT_MIN % -1);
// ATen returns the wrapped quotient (INT_MIN) and 0.
template <typename T>
T int_quotient(T a, T b) {
  if constexpr (std::is_signed_v<T>)
    if (b == T(-1))
      return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(a));
  return static_cast<T>(a / b);
}
template <typename T>
T int_remainder(T a, T b) {
  if constexpr (std::is_signed_v<T>)
    if (b == T(-1)) return T(0);
  return static_cast<T>(a % b);
}

// aten::div.out / aten::div.out_mode (rounding_mode None, "trunc", "floor");
// aten::floor_divide.out is div with rounding_mode "floor" (as in ATen).
void div(Call& call) {
  const bool has_mode = call.num_args() == 4;
  std::string mode;
  if (has_mode && !call.is_none(2)) mode = call.string_arg(2);
  if (std::string_view(call.op()) == "aten::floor_divide.out") mode = "floor";
  if (!mode.empty() && mode != "trunc" && mode != "floor")
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '" + mode + "'");
  Binary x = binary_args(call, 0, 1, has_mode ? 3 : 2);
  DT compute = x.common;
  if (mode.empty() && is_integral(compute, true)) compute = DT::f32;  // true division
  check_castable(call, compute, x.out);
  Iter it = make_iter(x.out, {x.a, x.b});
  visit_compute(compute, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_INVALID_ARGUMENT, "div with rounding_mode on bool tensors is not supported");
    } else if constexpr (std::is_floating_point_v<T>) {
      // Half types divide in float32 and round once (ATen's vectorised CPU
      // path rounds the quotient first and can be off by one).
      if (mode == "trunc")
        run_elementwise<T>(call, it, [](T a, T b) { return std::trunc(a / b); });
      else if (mode == "floor")
        run_elementwise<T>(call, it, [](T a, T b) {
          // Python's floor division, as ATen's div_floor_floating.
          if (b == 0) return a / b;
          T mod = std::fmod(a, b);
          T q = (a - mod) / b;
          if (mod != 0 && ((b < 0) != (mod < 0))) q -= 1;
          T fq;
          if (q != 0) {
            fq = std::floor(q);
            if (q - fq > T(0.5)) fq += 1;
          } else {
            fq = std::copysign(T(0), a / b);
          }
          return fq;
        });
      else
        run_elementwise<T>(call, it, [](T a, T b) { return a / b; });
    } else {
      check_int_divisor<T>(call, it);
      if (mode == "trunc")
        run_elementwise<T>(call, it, [](T a, T b) { return int_quotient(a, b); });
      else
        run_elementwise<T>(call, it, [](T a, T b) {
          T q = int_quotient(a, b);
          if ((int_remainder(a, b) != 0) && ((a < 0) != (b < 0))) q = static_cast<T>(q - 1);
          return q;
        });
    }
  });
}

// aten::remainder.Tensor_out: Python's modulo (sign of the divisor).
void remainder(Call& call) {
  Binary x = binary_args(call, 0, 1, 2);
  check_castable(call, x.common, x.out);
  Iter it = make_iter(x.out, {x.a, x.b});
  visit_compute(x.common, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_UNSUPPORTED, "remainder is not implemented for bool");
    } else if constexpr (std::is_floating_point_v<T>) {
      run_elementwise<T>(call, it, [](T a, T b) {
        T m = std::fmod(a, b);
        if (m != 0 && ((b < 0) != (m < 0))) m += b;
        return m;
      });
    } else {
      check_int_divisor<T>(call, it);
      run_elementwise<T>(call, it, [](T a, T b) {
        T m = int_remainder(a, b);
        if (m != 0 && ((b < 0) != (m < 0))) m = static_cast<T>(m + b);
        return m;
      });
    }
  });
}

template <typename T>
T int_pow(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    // A negative integer power (tensor exponents only; ATen refuses a
    // negative Scalar one): 1 and -1 keep a magnitude of 1, all else is 0.
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp & 1) != 0 ? T(-1) : T(1);
      return 0;
    }
  }
  T result = 1;
  while (exp > 0) {
    if (exp & 1) result = static_cast<T>(result * base);
    base = static_cast<T>(base * base);
    exp = static_cast<T>(exp >> 1);
  }
  return result;
}

// aten::pow.Tensor_Tensor_out / aten::pow.Tensor_Scalar_out
void pow_op(Call& call) {
  Binary x = binary_args(call, 0, 1, 2);
  check_castable(call, x.common, x.out);
  // A floating tensor to a Scalar power: the exponents ATen specialises get
  // the same arithmetic (x*x for 2, sqrt for 0.5, ...), the rest std::pow
  // with the exponent held in a register rather than read per element.
  if (x.scalar && (x.common == DT::f32 || x.common == DT::f64) && dt_of(x.a.dtype()) == x.common) {
    // The exponent: the Scalar argument, or a 0-d tensor's value (x.b).
    const double e = call.arg(1).tag == NPUB_VALUE_TENSOR ? load<double>(x.b.data<char>(), dt_of(x.b.dtype()))
                                                          : scalar_as<double>(call, 1);
    Iter it = make_iter(x.out, {x.a});
    visit_compute(x.common, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<T>) {
        const T et = static_cast<T>(e);
        // 0 and 1 as ATen's pow_out: fill with one, copy (NaN ** 0 is 1);
        // autograd's pow backward asks for x ** 1 on every x ** 2.
        if (e == 0)
          run_elementwise<T>(call, it, [](T) { return T(1); });
        else if (e == 1)
          run_elementwise<T>(call, it, [](T a) { return a; });
        else if (e == 2)
          run_elementwise<T>(call, it, [](T a) { return a * a; });
        else if (e == 3)
          run_elementwise<T>(call, it, [](T a) { return a * a * a; });
        else if (e == 0.5)
          run_elementwise<T>(call, it, [](T a) { return std::sqrt(a); });
        else if (e == -0.5)
          run_elementwise<T>(call, it, [](T a) { return T(1) / std::sqrt(a); });
        else if (e == -1)
          run_elementwise<T>(call, it, [](T a) { return T(1) / a; });
        else if (e == -2)
          run_elementwise<T>(call, it, [](T a) { return T(1) / (a * a); });
        else
          run_elementwise<T>(call, it, [et](T a) { return static_cast<T>(std::pow(a, et)); });
      }
    });
    return;
  }
  Iter it = make_iter(x.out, {x.a, x.b});
  visit_compute(x.common, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      run_elementwise<T>(call, it, [](T a, T b) -> T { return a || !b; });
    } else if constexpr (std::is_floating_point_v<T>) {
      run_elementwise<T>(call, it, [](T a, T b) { return static_cast<T>(std::pow(a, b)); });
    } else {
      if (x.scalar && any_element(call, it, 2, [](int64_t v) { return v < 0; }))
        call.fail(NPUB_ERR_INVALID_ARGUMENT, "Integers to negative integer powers are not allowed.");
      run_elementwise<T>(call, it, [](T a, T b) { return int_pow<T>(a, b); });
    }
  });
}

// aten::maximum.out / aten::minimum.out (NaN-propagating)
template <bool kMax>
void max_min(Call& call) {
  Binary x = binary_args(call, 0, 1, 2);
  check_castable(call, x.common, x.out);
  run_binary_as(call, x, x.common, [](auto tag) {
    using T = decltype(tag);
    return [](T a, T b) -> T {
      if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
      }
      if constexpr (kMax)
        return a > b ? a : b;
      else
        return a < b ? a : b;
    };
  });
}

enum class Cmp { eq, ne, lt, le, gt, ge };

template <Cmp kOp>
void compare(Call& call) {
  Binary x = binary_args(call, 0, 1, 2);
  run_binary_as(call, x, x.common, [](auto tag) {
    using T = decltype(tag);
    return [](T a, T b) -> bool {
      if constexpr (kOp == Cmp::eq)
        return a == b;
      else if constexpr (kOp == Cmp::ne)
        return a != b;
      else if constexpr (kOp == Cmp::lt)
        return a < b;
      else if constexpr (kOp == Cmp::le)
        return a <= b;
      else if constexpr (kOp == Cmp::gt)
        return a > b;
      else
        return a >= b;
    };
  });
}

template <bool kAnd>
void logical(Call& call) {
  Binary x = binary_args(call, 0, 1, 2);
  Iter it = make_iter(x.out, {x.a, x.b});
  run_elementwise<bool>(call, it, [](bool a, bool b) -> bool { return kAnd ? (a && b) : (a || b); });
}

// aten::where.self_out(condition, self, other, *, out)
void where(Call& call) {
  TensorRef cond = call.tensor(0), a = call.tensor(1), b = call.tensor(2), out = call.tensor(3);
  const DT cd = dt_of(cond.dtype());
  if (cd != DT::b8)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("where expected condition to be a boolean tensor, but got a tensor with dtype ") +
                  dt_name(cd));
  ResultType rt;
  rt.tensor(a);
  rt.tensor(b);
  const DT common = rt.result();
  check_castable(call, common, out);
  check_out(call, out, broadcast(call, cond.sizes(), broadcast(call, a.sizes(), b.sizes())));
  Iter it = make_iter(out, {cond, a, b});
  visit_compute(common, [&](auto tag) {
    using T = decltype(tag);
    // Both values and the result in T (the usual case: a score tensor, a
    // broadcast mask and a 0-d fill value): typed strided loads, no dtype
    // switch per element; a unit-stride row is a plain select loop.
    if (it.dt[0] == dt_for<T>() && it.dt[2] == dt_for<T>() && it.dt[3] == dt_for<T>()) {
      for_each_row(call, it, [&](char** p, const int64_t* st, int64_t n) {
        T* o = reinterpret_cast<T*>(p[0]);
        const uint8_t* c = reinterpret_cast<const uint8_t*>(p[1]);
        const T* x = reinterpret_cast<const T*>(p[2]);
        const T* y = reinterpret_cast<const T*>(p[3]);
        const int64_t so = st[0] / int64_t(sizeof(T)), sx = st[2] / int64_t(sizeof(T)),
                      sy = st[3] / int64_t(sizeof(T));
        if (so == 1 && st[1] == 1 && sx == 1 && sy == 0) {
          const T v = *y;
          for (int64_t j = 0; j < n; ++j) o[j] = c[j] != 0 ? x[j] : v;
          return;
        }
        for (int64_t j = 0; j < n; ++j) o[j * so] = c[j * st[1]] != 0 ? x[j * sx] : y[j * sy];
      });
      return;
    }
    // The condition is loaded as T too: non-zero means true.
    run_elementwise<T>(call, it, [](T c, T p, T q) -> T { return c != T(0) ? p : q; });
  });
}

// aten::masked_fill.Scalar (functional) and aten::masked_fill_.Scalar
template <bool kInPlace>
void masked_fill(Call& call) {
  TensorRef self = call.tensor(0), mask = call.tensor(1);
  if (dt_of(mask.dtype()) != DT::b8)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("masked_fill_ only supports boolean masks, but got mask with dtype ") +
                  dt_name(dt_of(mask.dtype())));
  // In place the mask broadcasts to self; the functional form broadcasts both.
  const Shape b = broadcast(call, self.sizes(), mask.sizes());
  if (kInPlace && b != self.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "mask of shape " + shape_str(mask.sizes()) +
                                             " is not broadcastable to self of shape " +
                                             shape_str(self.sizes()));
  check_scalar_fits(call, call.arg(2), dt_of(self.dtype()));
  TensorRef out = kInPlace ? self : call.output(0, b, self.dtype());
  ScalarTensor value(call.arg(2));
  const DT d = dt_of(self.dtype());  // the value is cast to self's dtype, as ATen does
  Iter it = make_iter(out, {self, mask, value.ref()});
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    run_elementwise<T>(call, it, [](T s, T m, T v) -> T { return m != T(0) ? v : s; });
  });
}

// aten::clamp.out(self, Scalar? min, Scalar? max, *, out)
void clamp(Call& call) {
  TensorRef self = call.tensor(0), out = call.tensor(3);
  const bool has_min = !call.is_none(1), has_max = !call.is_none(2);
  if (!has_min && !has_max)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "At least one of 'min' or 'max' must not be None");
  ResultType rt;
  rt.tensor(self);
  if (has_min) rt.scalar_value(call.arg(1));
  if (has_max) rt.scalar_value(call.arg(2));
  const DT common = rt.result();
  if (common == DT::b8) call.fail(NPUB_ERR_UNSUPPORTED, "clamp is not supported for bool tensors");
  check_castable(call, common, out);
  check_out(call, out, self.sizes());
  Iter it = make_iter(out, {self});
  visit_compute(common, [&](auto tag) {
    using T = decltype(tag);
    const T lo = has_min ? scalar_as<T>(call, 1) : T(0);
    const T hi = has_max ? scalar_as<T>(call, 2) : T(0);
    run_elementwise<T>(call, it, [=](T v) -> T {
      if constexpr (std::is_floating_point_v<T>) {
        // NaN propagates from the tensor and from either bound, as ATen's.
        if (std::isnan(v)) return v;
        if (has_min && std::isnan(lo)) return lo;
        if (has_max && std::isnan(hi)) return hi;
      }
      if (has_min && v < lo) v = lo;
      if (has_max && v > hi) v = hi;
      return v;
    });
  });
}

// aten::addcmul.out / aten::addcdiv.out (self, tensor1, tensor2, *, value, out)
template <bool kDiv>
void addc(Call& call) {
  TensorRef self = call.tensor(0), t1 = call.tensor(1), t2 = call.tensor(2), out = call.tensor(4);
  ResultType rt;
  rt.tensor(self);
  rt.tensor(t1);
  rt.tensor(t2);
  const DT common = rt.result();
  if (kDiv && is_integral(common, true))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "Integer division with addcdiv is no longer supported, and in a future release "
              "addcdiv will perform a true division of tensor1 and tensor2.");
  check_castable(call, common, out);
  check_out(call, out, broadcast(call, self.sizes(), broadcast(call, t1.sizes(), t2.sizes())));
  Iter it = make_iter(out, {self, t1, t2});
  visit_compute(common, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      call.fail(NPUB_ERR_UNSUPPORTED, "addcmul is not supported for bool tensors");
    } else {
      const T value = scalar_as<T>(call, 3);
      if constexpr (kDiv)
        run_elementwise<T>(call, it, [value](T s, T a, T b) { return static_cast<T>(s + value * (a / b)); });
      else
        run_elementwise<T>(call, it, [value](T s, T a, T b) { return static_cast<T>(s + value * a * b); });
    }
  });
}

// aten::lerp.Scalar_out(self, end, weight, *, out)
void lerp(Call& call) {
  TensorRef self = call.tensor(0), end = call.tensor(1), out = call.tensor(3);
  const DT d = dt_of(self.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_UNSUPPORTED, std::string("lerp expects floating tensors but found ") + dt_name(d));
  if (dt_of(end.dtype()) != d)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("expected dtype ") + dt_name(d) +
                                             " for `end` but got dtype " + dt_name(dt_of(end.dtype())));
  check_out(call, out, broadcast(call, self.sizes(), end.sizes()));
  Iter it = make_iter(out, {self, end});
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    const T w = scalar_as<T>(call, 2);
    run_elementwise<T>(call, it, [w](T s, T e) -> T {
      return std::abs(w) < T(0.5) ? s + w * (e - s) : e - (e - s) * (T(1) - w);
    });
  });
}

}  // namespace

void register_binary(npub::sdk::Registrar& r) {
  const auto all = dtypes_all();
  const auto numeric = dtypes_numeric();
  r.op("aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
       &add_sub_fast<false>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::sub.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)",
       &add_sub_fast<true>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::mul.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &mul)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::div.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &div)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::div.out_mode(Tensor self, Tensor other, *, str? rounding_mode, Tensor(a!) out) -> Tensor(a!)",
       &div)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::floor_divide.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &div)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::remainder.Tensor_out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &remainder)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::pow.Tensor_Tensor_out(Tensor self, Tensor exponent, *, Tensor(a!) out) -> Tensor(a!)", &pow_op)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::pow.Tensor_Scalar_out(Tensor self, Scalar exponent, *, Tensor(a!) out) -> Tensor(a!)", &pow_op)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::maximum.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &max_min<true>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::minimum.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &max_min<false>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  const char* cmp_names[] = {"eq", "ne", "lt", "le", "gt", "ge"};
  npub::sdk::KernelBody cmp_fns[] = {&compare<Cmp::eq>, &compare<Cmp::ne>, &compare<Cmp::lt>,
                                     &compare<Cmp::le>, &compare<Cmp::gt>, &compare<Cmp::ge>};
  for (int i = 0; i < 6; ++i) {
    const std::string n = std::string("aten::") + cmp_names[i];
    r.op((n + ".Tensor_out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)").c_str(), cmp_fns[i])
        .dtypes(all)
        .mixed_dtypes()
        .alias_safe();
    r.op((n + ".Scalar_out(Tensor self, Scalar other, *, Tensor(a!) out) -> Tensor(a!)").c_str(), cmp_fns[i])
        .dtypes(all)
        .mixed_dtypes()
        .alias_safe();
  }
  r.op("aten::logical_and.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &logical<true>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::logical_or.out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)", &logical<false>)
      .dtypes(all)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::where.self_out(Tensor condition, Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)",
       &where)
      .dtypes({npub::sdk::kBool})
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor", &masked_fill<false>)
      .dtypes(all)
      .arg_dtypes("mask", {npub::sdk::kBool})
      .alias_safe();
  r.op("aten::masked_fill_.Scalar(Tensor(a!) self, Tensor mask, Scalar value) -> Tensor(a!)",
       &masked_fill<true>)
      .dtypes(all)
      .arg_dtypes("mask", {npub::sdk::kBool})
      .alias_safe();
  r.op("aten::clamp.out(Tensor self, Scalar? min=None, Scalar? max=None, *, Tensor(a!) out) -> Tensor(a!)",
       &clamp)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::addcmul.out(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1, Tensor(a!) out) -> "
       "Tensor(a!)",
       &addc<false>)
      .dtypes(numeric)
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::addcdiv.out(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1, Tensor(a!) out) -> "
       "Tensor(a!)",
       &addc<true>)
      .dtypes(dtypes_floating())
      .mixed_dtypes()
      .alias_safe();
  r.op("aten::lerp.Scalar_out(Tensor self, Tensor end, Scalar weight, *, Tensor(a!) out) -> Tensor(a!)",
       &lerp)
      .dtypes(dtypes_floating())
      .mixed_dtypes()
      .alias_safe();
}

}  // namespace cann_like
