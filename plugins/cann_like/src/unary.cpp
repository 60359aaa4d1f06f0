// Unary elementwise ops. Floating functions of integer inputs compute in
// float32 (ATen's promotion to the default dtype); sign/abs/neg/rounding keep
// integer dtypes; logical_not and isnan produce bool.
#include "elementwise.h"
#include "ops.h"

#include <limits>

#include <cmath>

namespace cann_like {

namespace {

enum class U {
  neg,
  abs,
  exp,
  log,
  log1p,
  sqrt,
  rsqrt,
  reciprocal,
  sin,
  cos,
  tanh,
  sigmoid,
  relu,
  gelu,
  gelu_tanh,
  silu,
  erf,
  sign,
  floor,
  ceil,
  round,
  logical_not,
  isnan
};

constexpr bool is_float_fn(U op) {
  switch (op) {
    case U::exp:
    case U::log:
    case U::log1p:
    case U::sqrt:
    case U::rsqrt:
    case U::reciprocal:
    case U::sin:
    case U::cos:
    case U::tanh:
    case U::sigmoid:
    case U::gelu:
    case U::gelu_tanh:
    case U::silu:
    case U::erf:
      return true;
    default:
      return false;
  }
}

// float: vec_math.h's (Note [Vectorised float32 functions]); double: libm.
template <typename T>
PLUGIN_KERNELS_INLINE T m_tanh(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_tanh(x);
  else
    return std::tanh(x);
}
template <typename T>
PLUGIN_KERNELS_INLINE T m_erf(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_erf(x);
  else
    return std::erf(x);
}

template <U kOp, typename T>
PLUGIN_KERNELS_INLINE auto apply(T x) {
  if constexpr (kOp == U::logical_not)
    return !static_cast<bool>(x);
  else if constexpr (kOp == U::isnan) {
    if constexpr (std::is_floating_point_v<T>)
      return static_cast<bool>(std::isnan(x));
    else
      return false;
  } else if constexpr (kOp == U::neg)
    return static_cast<T>(-x);
  else if constexpr (kOp == U::abs) {
    if constexpr (std::is_same_v<T, bool> || std::is_unsigned_v<T>)
      return x;
    else
      return static_cast<T>(x < 0 ? -x : x);
  } else if constexpr (kOp == U::sign) {
    if constexpr (std::is_same_v<T, bool>)
      return x;
    else if constexpr (std::is_floating_point_v<T>)
      return std::isnan(x) ? T(0) : static_cast<T>((T(0) < x) - (x < T(0)));
    else
      return static_cast<T>((T(0) < x) - (x < T(0)));
  } else if constexpr (kOp == U::relu) {
    if constexpr (std::is_same_v<T, bool>)
      return x;
    else if constexpr (std::is_floating_point_v<T>)
      return std::isnan(x) ? x : (x > T(0) ? x : T(0));
    else
      return x > T(0) ? x : T(0);
  } else if constexpr (kOp == U::floor) {
    if constexpr (std::is_floating_point_v<T>)
      return std::floor(x);
    else
      return x;
  } else if constexpr (kOp == U::ceil) {
    if constexpr (std::is_floating_point_v<T>)
      return std::ceil(x);
    else
      return x;
  } else if constexpr (kOp == U::round) {
    if constexpr (std::is_floating_point_v<T>)
      return std::nearbyint(x);  // half to even
    else
      return x;
  } else if constexpr (kOp == U::exp)
    return fast_exp(x);
  else if constexpr (kOp == U::log)
    return std::log(x);
  else if constexpr (kOp == U::log1p)
    return std::log1p(x);
  else if constexpr (kOp == U::sqrt)
    return std::sqrt(x);
  else if constexpr (kOp == U::rsqrt)
    return T(1) / std::sqrt(x);
  else if constexpr (kOp == U::reciprocal)
    return T(1) / x;
  else if constexpr (kOp == U::sin)
    return std::sin(x);
  else if constexpr (kOp == U::cos)
    return std::cos(x);
  else if constexpr (kOp == U::tanh)
    return m_tanh(x);
  else if constexpr (kOp == U::sigmoid)
    return sigmoid(x);
  else if constexpr (kOp == U::silu)
    return x * sigmoid(x);
  else if constexpr (kOp == U::erf)
    return m_erf(x);
  else if constexpr (kOp == U::gelu) {
    if constexpr (std::is_same_v<T, float>)
      return fast_gelu(x);
    else
      return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
  } else {                                  // gelu_tanh
    const T k = T(0.79788456080286535588);  // sqrt(2/pi)
    return T(0.5) * x * (T(1) + m_tanh(k * (x + T(0.044715) * x * x * x)));
  }
}

// Note [Vectorised float32 functions]
// libm's expf/tanhf/erff are scalar calls (tanh ran at 12 ns an element, 4x
// ATen's whole op): float32 (and float16/bfloat16, computed in float32) use
// plugin_kernels' vec_math.h instead, and a contiguous float32 row runs
// run_elementwise's loop compiled per ISA level (Note [float32 elementwise
// loops per ISA level]), 4, 8 or 16 lanes wide. float64 keeps libm.

// The dtype a unary op computes in for an input of dtype d.
template <U kOp>
DT compute_dtype(DT d) {
  if constexpr (kOp == U::logical_not) return DT::b8;
  if (is_float_fn(kOp) && !is_floating(d)) return DT::f32;
  return d;
}

template <U kOp>
void run_unary(Call& call, const TensorRef& self, const TensorRef& out) {
  const DT d = dt_of(self.dtype());
  const DT compute = compute_dtype<kOp>(d);
  if constexpr (kOp != U::logical_not && kOp != U::isnan) check_castable(call, compute, out);
  if constexpr (kOp == U::neg) {
    if (d == DT::b8)
      call.fail(NPUB_ERR_INVALID_ARGUMENT,
                "Negation, the `-` operator, on a bool tensor is not supported. "
                "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  }
  check_out(call, out, self.sizes());
  Iter it = make_iter(out, {self});
  visit_compute(compute, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_float_fn(kOp) && !std::is_floating_point_v<T>) {
      call.fail(NPUB_ERR_INTERNAL, "unreachable: integer compute type for a floating function");
    } else {
      // Inlined into the per-ISA loops (a call would keep them scalar).
      run_elementwise<T>(
          call, it, [](T x) __attribute__((always_inline)) { return apply<kOp, T>(x); });
    }
  });
}

template <U kOp>
void unary_out(Call& call) {
  run_unary<kOp>(call, call.tensor(0), call.tensor(call.num_args() - 1));
}

// aten::gelu.out(self, *, approximate="none", out)
void gelu_out(Call& call) {
  const std::string approx = call.string_arg(1);
  if (approx == "none")
    run_unary<U::gelu>(call, call.tensor(0), call.tensor(2));
  else if (approx == "tanh")
    run_unary<U::gelu_tanh>(call, call.tensor(0), call.tensor(2));
  else
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "approximate argument must be either none or tanh but found '" + approx + "'");
}

// aten::relu (functional) / aten::relu_ (in place)
void relu_fn(Call& call) {
  TensorRef x = call.tensor(0);
  if (dt_of(x.dtype()) == DT::b8) call.fail(NPUB_ERR_UNSUPPORTED, "relu is not implemented for bool");
  run_unary<U::relu>(call, x, call.output(0, x.sizes(), x.dtype()));
}
void relu_inplace(Call& call) {
  TensorRef x = call.tensor(0);
  if (dt_of(x.dtype()) == DT::b8) call.fail(NPUB_ERR_UNSUPPORTED, "relu is not implemented for bool");
  run_unary<U::relu>(call, x, x);
}

// aten::isnan (functional, bool output)
void isnan_fn(Call& call) {
  TensorRef x = call.tensor(0);
  run_unary<U::isnan>(call, x, call.output(0, x.sizes(), npub::sdk::kBool));
}

// aten::isposinf.out / aten::isneginf.out(self, *, out): a bool out (ATen
// refuses another); integer and bool elements are never infinite.
template <bool kPositive>
void isinf_signed_out(Call& call) {
  const TensorRef x = call.tensor(0), out = call.tensor(1);
  const char* name = kPositive ? "isposinf" : "isneginf";
  if (!out.is(npub::sdk::kBool))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) +
                                             " does not support non-boolean outputs. (out: found " +
                                             dt_name(dt_of(out.dtype())) + ")");
  check_out(call, out, x.sizes());
  Iter it = make_iter(out, {x});
  visit_compute(dt_of(x.dtype()), [&](auto tag) {
    using T = decltype(tag);
    run_elementwise<T>(call, it, [](T v) -> bool {
      bool infinite = false;
      if constexpr (std::is_floating_point_v<T>)
        infinite =
            v == (kPositive ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
      return infinite;
    });
  });
}

// ---------------------------------------------------------------------------
// activation gradients: grad_input = f(grad_output, input or output)
// ---------------------------------------------------------------------------

enum class G { gelu, gelu_tanh, threshold, sigmoid, tanh, silu };

// grad_input of one element: go * f'(v) (v the input, or the output y for
// sigmoid and tanh).
template <G kOp, typename T>
PLUGIN_KERNELS_INLINE T activation_grad(T go, T v) {
  if constexpr (kOp == G::gelu) {
    T cdf;
    if constexpr (std::is_same_v<T, float>)
      cdf = gelu_cdf(v);  // one erfc, no erf polynomial (vec_math.h)
    else
      cdf = T(0.5) * (T(1) + std::erf(v * T(0.70710678118654752440)));
    const T pdf = fast_exp(T(-0.5) * v * v) * T(0.39894228040143267794);  // 1/sqrt(2 pi)
    return go * (cdf + v * pdf);
  } else if constexpr (kOp == G::gelu_tanh) {
    const T k = T(0.79788456080286535588), c = T(0.044715);
    const T inner = k * (v + c * v * v * v);
    const T t = m_tanh(inner);
    const T dinner = k * (T(1) + T(3) * c * v * v);
    return go * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * dinner);
  } else if constexpr (kOp == G::sigmoid) {
    return go * (T(1) - v) * v;
  } else if constexpr (kOp == G::tanh) {
    return go * (T(1) - v * v);
  } else {  // silu
    const T s = sigmoid(v);
    return go * s * (T(1) + v * (T(1) - s));
  }
}

template <G kOp>
void activation_backward(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1), out = call.tensor(call.num_args() - 1);
  const DT d = dt_of(g.dtype());
  if (!is_floating(d))
    call.fail(NPUB_ERR_UNSUPPORTED, std::string("expected floating tensors but found ") + dt_name(d));
  if (g.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "grad_output of shape " + shape_str(g.sizes()) + " does not match " + shape_str(x.sizes()));
  check_out(call, out, g.sizes(), "grad_input");
  Iter it = make_iter(out, {g, x});
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (kOp == G::threshold) {
        const T th = static_cast<T>(call.scalar_arg(2));
        run_elementwise<T>(call, it, [th](T go, T v) { return v <= th ? T(0) : go; });
      } else {
        run_elementwise<T>(
            call, it,
            [](T go, T v) __attribute__((always_inline)) { return activation_grad<kOp, T>(go, v); });
      }
    }
  });
}

void gelu_backward(Call& call) {
  const std::string approx = call.string_arg(2);
  if (approx == "none")
    activation_backward<G::gelu>(call);
  else if (approx == "tanh")
    activation_backward<G::gelu_tanh>(call);
  else
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "approximate argument must be either none or tanh but found '" + approx + "'");
}

}  // namespace

void register_unary(npub::sdk::Registrar& r) {
  const auto floating = dtypes_floating();
  r.op("aten::gelu_backward.grad_input(Tensor grad_output, Tensor self, *, str approximate=\"none\", "
       "Tensor(a!) grad_input) -> Tensor(a!)",
       &gelu_backward)
      .dtypes(floating)
      .alias_safe();
  r.op("aten::threshold_backward.grad_input(Tensor grad_output, Tensor self, Scalar threshold, *, Tensor(a!) "
       "grad_input) -> Tensor(a!)",
       &activation_backward<G::threshold>)
      .dtypes(floating)
      .alias_safe();
  r.op("aten::sigmoid_backward.grad_input(Tensor grad_output, Tensor output, *, Tensor(a!) grad_input) -> "
       "Tensor(a!)",
       &activation_backward<G::sigmoid>)
      .dtypes(floating)
      .alias_safe();
  r.op("aten::tanh_backward.grad_input(Tensor grad_output, Tensor output, *, Tensor(a!) grad_input) -> "
       "Tensor(a!)",
       &activation_backward<G::tanh>)
      .dtypes(floating)
      .alias_safe();
  r.op("aten::silu_backward.grad_input(Tensor grad_output, Tensor self, *, Tensor(a!) grad_input) -> "
       "Tensor(a!)",
       &activation_backward<G::silu>)
      .dtypes(floating)
      .alias_safe();
  const auto all = dtypes_all();
  const auto numeric = dtypes_numeric();
  struct Entry {
    const char* name;
    npub::sdk::KernelBody fn;
    bool with_bool;
  };
  const Entry entries[] = {
      {"neg", &unary_out<U::neg>, false},
      {"abs", &unary_out<U::abs>, false},
      {"exp", &unary_out<U::exp>, true},
      {"log", &unary_out<U::log>, true},
      {"log1p", &unary_out<U::log1p>, true},
      {"sqrt", &unary_out<U::sqrt>, true},
      {"rsqrt", &unary_out<U::rsqrt>, true},
      {"reciprocal", &unary_out<U::reciprocal>, true},
      {"sin", &unary_out<U::sin>, true},
      {"cos", &unary_out<U::cos>, true},
      {"tanh", &unary_out<U::tanh>, true},
      {"sigmoid", &unary_out<U::sigmoid>, true},
      {"silu", &unary_out<U::silu>, false},
      {"erf", &unary_out<U::erf>, true},
      {"sign", &unary_out<U::sign>, true},
      {"floor", &unary_out<U::floor>, false},
      {"ceil", &unary_out<U::ceil>, false},
      {"round", &unary_out<U::round>, false},
      {"logical_not", &unary_out<U::logical_not>, true},
  };
  for (const Entry& e : entries) {
    const std::string op = std::string("aten::") + e.name + ".out";
    // silu has no integer kernel in ATen either.
    r.op((op + "(Tensor self, *, Tensor(a!) out) -> Tensor(a!)").c_str(), e.fn)
        .dtypes(std::string(e.name) == "silu" ? dtypes_floating()
                : e.with_bool                 ? all
                                              : numeric)
        .any_dtype("out")  // integer inputs give a floating out, logical_not any; the body checks it
        .alias_safe();
  }
  r.op("aten::gelu.out(Tensor self, *, str approximate=\"none\", Tensor(a!) out) -> Tensor(a!)", &gelu_out)
      .dtypes(dtypes_floating())
      .alias_safe();
  r.op("aten::relu(Tensor self) -> Tensor", &relu_fn).dtypes(numeric).alias_safe();
  r.op("aten::relu_(Tensor(a!) self) -> Tensor(a!)", &relu_inplace).dtypes(numeric).alias_safe();
  r.op("aten::isnan(Tensor self) -> Tensor", &isnan_fn).dtypes(all).alias_safe();
  r.op("aten::isposinf.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", &isinf_signed_out<true>)
      .dtypes(all)
      .any_dtype("out")  // bool; the body checks it
      .alias_safe();
  r.op("aten::isneginf.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", &isinf_signed_out<false>)
      .dtypes(all)
      .any_dtype("out")
      .alias_safe();
}

}  // namespace cann_like
