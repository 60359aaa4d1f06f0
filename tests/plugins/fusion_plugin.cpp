// A third-party plugin that contributes a fusion pattern through the C ABI
// (ABI 1.5, NpubHostApi.register_fusion_pattern) for a fused op of its own:
// testfuse::gelu_mul(a, b) = gelu(a) * b (exact, erf form, as PyTorch's
// approximate="none"), computed here, with a meta function and a backward,
// so npubridge's graph compiler rewrites `gelu(a) * b` to it in forward and
// training graphs (tests/python/graph/test_patterns.py).
#include <npubridge/plugin_sdk.hpp>

#include <cmath>
#include <cstdint>

namespace {

using namespace npub::sdk;

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// Same-shape operands only: a broadcast call gets the meta function's error
// and the matcher skips the rewrite.
void check_same_shape(Call& call, const TensorRef& a, const TensorRef& b, const char* name) {
  if (a.sizes() != b.sizes())
    call.fail(NPUB_ERR_UNSUPPORTED, std::string(name) + ": expected the shape of a " +
                                        Call::shape_str(a.sizes()) + " but found " +
                                        Call::shape_str(b.sizes()) + " (no broadcasting)");
  if (!same_dtype(a.dtype(), b.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the dtype of a");
}

template <typename T>
void gelu_mul_loop(const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i];
    y[i] = static_cast<T>(x * static_cast<T>(0.5) *
                          (static_cast<T>(1) + std::erf(x * static_cast<T>(kInvSqrt2)))) *
           b[i];
  }
}

// testfuse::gelu_mul(Tensor a, Tensor b) -> Tensor (also its meta function:
// the body stops at the first data access in a meta call).
void gelu_mul(Call& call) {
  TensorRef a = call.tensor(0), b = call.tensor(1);
  check_same_shape(call, a, b, "b");
  TensorRef y = call.output(0, a.sizes(), a.dtype());
  if (a.is(kFloat64))
    gelu_mul_loop(a.data<double>(), b.data<double>(), y.data<double>(), a.numel());
  else
    gelu_mul_loop(a.data<float>(), b.data<float>(), y.data<float>(), a.numel());
}

// d/da = grad * b * gelu'(a), gelu'(x) = Phi(x) + x * phi(x); d/db = grad * gelu(a).
template <typename T>
void gelu_mul_backward_loop(const T* g, const T* a, const T* b, T* da, T* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T x = a[i];
    const T cdf = static_cast<T>(0.5) * (static_cast<T>(1) + std::erf(x * static_cast<T>(kInvSqrt2)));
    const T pdf = static_cast<T>(kInvSqrt2Pi) * std::exp(static_cast<T>(-0.5) * x * x);
    da[i] = g[i] * b[i] * (cdf + x * pdf);
    db[i] = g[i] * x * cdf;
  }
}

// testfuse::gelu_mul_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)
void gelu_mul_backward(Call& call) {
  TensorRef g = call.tensor(0), a = call.tensor(1), b = call.tensor(2);
  check_same_shape(call, a, b, "b");
  check_same_shape(call, a, g, "grad");
  TensorRef da = call.output(0, a.sizes(), a.dtype()), db = call.output(1, a.sizes(), a.dtype());
  if (a.is(kFloat64))
    gelu_mul_backward_loop(g.data<double>(), a.data<double>(), b.data<double>(), da.data<double>(),
                           db.data<double>(), a.numel());
  else
    gelu_mul_backward_loop(g.data<float>(), a.data<float>(), b.data<float>(), da.data<float>(),
                           db.data<float>(), a.numel());
}

constexpr const char* kPattern = R"(
# gelu(a) * b, either operand order (mul.Tensor is commutative)
pattern testfuse_gelu_mul priority 5
  %g = aten::gelu(%a)
  %y = aten::mul.Tensor(%g, %b)
  => testfuse::gelu_mul(%a, %b)
end
)";

void init(Registrar& r) {
  r.op("testfuse::gelu_mul(Tensor a, Tensor b) -> Tensor", &gelu_mul)
      .dtypes({kFloat32, kFloat64})
      .contiguous_only()
      .opt_level(2);
  r.meta<&gelu_mul>("testfuse::gelu_mul");
  r.op("testfuse::gelu_mul_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)", &gelu_mul_backward)
      .dtypes({kFloat32, kFloat64})
      .contiguous_only()
      .opt_level(2);
  r.meta<&gelu_mul_backward>("testfuse::gelu_mul_backward");
  r.derivative("testfuse::gelu_mul", "a, b: testfuse::gelu_mul_backward(grad, a, b)");
  r.fusion_pattern(kPattern);
}

}  // namespace

NPUB_DEFINE_PLUGIN(testfuse, "0.0.1", init)
