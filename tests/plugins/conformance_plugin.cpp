// Test plugins for `python3 -m npubridge conformance --plugin`
// (tests/python/test_plugin_conformance.py): one source, one library per
// CONF_MODE, each either correct or with one defect the tool must catch.
//
//   1 conf_good       aten::hardtanh.out {float32, float64} and conf_good::mul_add
//                     (x * y + x; meta function, derivative): all correct
//   2 conf_wrong      aten::hardtanh.out clamps at half the upper bound
//   3 conf_f64        aten::hardtanh.out declares float64 but reads every tensor as float
//   4 conf_typo       aten::hardtanh.outt: an overload ATen does not have
//   5 conf_meta       conf_meta::mul_add: its meta function declares [x.size(0)],
//                     the kernel returns x's shape
//   6 conf_grad       conf_grad::mul_add: its backward gives grad * y for y
//                     (should be grad * x)
//   7 conf_nosamples  conf_nosamples::mul_add, correct, with no tests file
//   8 conf_declines   aten::hardtanh.out declares float64 and declines every float64 call
//   9 conf_crash      aten::hardtanh.out segfaults (raises SIGSEGV), conf_crash::mul_add_backward
//                     never returns, conf_crash::mul_add is correct (no derivative): the
//                     tool reports the first two crashed and hung and still checks mul_add
//  10 conf_crash_aten for npub-conformance (ops its samples cover): aten::relu_
//                     segfaults, aten::isnan never returns, aten::relu {float32} is correct
#include <npubridge/plugin_sdk.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#ifndef CONF_MODE
#error "CONF_MODE must be defined (1 to 10)"
#endif

#if CONF_MODE == 1
#define CONF_NS "conf_good"
#define CONF_NAME conf_good
#elif CONF_MODE == 2
#define CONF_NS "conf_wrong"
#define CONF_NAME conf_wrong
#elif CONF_MODE == 3
#define CONF_NS "conf_f64"
#define CONF_NAME conf_f64
#elif CONF_MODE == 4
#define CONF_NS "conf_typo"
#define CONF_NAME conf_typo
#elif CONF_MODE == 5
#define CONF_NS "conf_meta"
#define CONF_NAME conf_meta
#elif CONF_MODE == 6
#define CONF_NS "conf_grad"
#define CONF_NAME conf_grad
#elif CONF_MODE == 7
#define CONF_NS "conf_nosamples"
#define CONF_NAME conf_nosamples
#elif CONF_MODE == 8
#define CONF_NS "conf_declines"
#define CONF_NAME conf_declines
#elif CONF_MODE == 9
#define CONF_NS "conf_crash"
#define CONF_NAME conf_crash
#else
#define CONF_NS "conf_crash_aten"
#define CONF_NAME conf_crash_aten
#endif

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

template <typename T>
void clamp_into(const TensorRef& in, const TensorRef& out, double lo, double hi) {
  const T* x = in.data<T>();
  T* y = out.data<T>();
  for (int64_t i = 0; i < in.numel(); ++i) {
    const T v = x[i];
    y[i] = v != v ? v : std::min<T>(std::max<T>(v, static_cast<T>(lo)), static_cast<T>(hi));
  }
}

// aten::hardtanh.out(Tensor self, Scalar min_val=-1, Scalar max_val=1, *, Tensor(a!) out) -> Tensor(a!)
void hardtanh_out(Call& call) {
  TensorRef self = call.tensor(0), out = call.tensor(3);
  const double lo = call.scalar_arg(1);
  double hi = call.scalar_arg(2);
  if (out.sizes() != self.sizes() || !out.is(self.dtype()))
    call.fail(NPUB_ERR_UNSUPPORTED, "out must have self's shape and dtype");
  if (CONF_MODE == 9) std::raise(SIGSEGV);  // conf_crash
  if (CONF_MODE == 2) hi *= 0.5;            // the defect of conf_wrong
  if (CONF_MODE == 8 && self.is(npub::sdk::kFloat64))
    call.fail(NPUB_ERR_UNSUPPORTED, "float64 is not implemented yet");  // conf_declines
  if (self.is(npub::sdk::kFloat64) && CONF_MODE != 3)
    clamp_into<double>(self, out, lo, hi);
  else if (self.is(npub::sdk::kFloat32) || self.is(npub::sdk::kFloat64))
    clamp_into<float>(self, out, lo, hi);  // conf_f64: float64 read as float, the defect
  else
    call.fail(NPUB_ERR_UNSUPPORTED, "float32 and float64 only");
}

// <ns>::mul_add(Tensor x, Tensor y) -> Tensor : x * y + x
std::vector<int64_t> mul_add_shape(Call& call) {
  TensorRef x = call.tensor(0), y = call.tensor(1);
  if (x.sizes() != y.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "y: expected the shape of x " + Call::shape_str(x.sizes()) +
                                             " but found " + Call::shape_str(y.sizes()));
  if (!y.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "y: expected the dtype of x (" + npub::sdk::dtype_name(x.dtype()) +
                                             ") but found " + npub::sdk::dtype_name(y.dtype()));
  return x.sizes();
}

void mul_add_meta(Call& call) {
  std::vector<int64_t> shape = mul_add_shape(call);
  if (CONF_MODE == 5 && !shape.empty()) shape.resize(1);  // the defect of conf_meta
  call.output(0, shape, call.tensor(0).dtype());
}

template <typename T, typename F>
void elementwise(const TensorRef& a, const TensorRef& b, const TensorRef& out, F f) {
  const T* x = a.data<T>();
  const T* y = b.data<T>();
  T* z = out.data<T>();
  for (int64_t i = 0; i < a.numel(); ++i) z[i] = f(x[i], y[i]);
}

void mul_add(Call& call) {
  TensorRef x = call.tensor(0), y = call.tensor(1);
  TensorRef out = call.output(0, mul_add_shape(call), x.dtype());
  if (x.is(npub::sdk::kFloat64))
    elementwise<double>(x, y, out, [](double a, double b) { return a * b + a; });
  else
    elementwise<float>(x, y, out, [](float a, float b) { return a * b + a; });
}

// <ns>::mul_add_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor, Tensor): (grad * (y + 1), grad * x)
void mul_add_backward_outputs(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1);
  call.output(0, x.sizes(), g.dtype());
  call.output(1, x.sizes(), g.dtype());
}

void mul_add_backward(Call& call) {
  TensorRef g = call.tensor(0), x = call.tensor(1), y = call.tensor(2);
  while (CONF_MODE == 9) std::this_thread::sleep_for(std::chrono::seconds(1));  // conf_crash: never returns
  if (g.sizes() != x.sizes() || y.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "grad, x and y must have one shape");
  TensorRef dx = call.output(0, x.sizes(), g.dtype());
  TensorRef dy = call.output(1, x.sizes(), g.dtype());
  // conf_grad's defect: grad * y where the derivative is grad * x.
  const TensorRef& dy_factor = CONF_MODE == 6 ? y : x;
  if (g.is(npub::sdk::kFloat64)) {
    elementwise<double>(g, y, dx, [](double a, double b) { return a * (b + 1); });
    elementwise<double>(g, dy_factor, dy, [](double a, double b) { return a * b; });
  } else {
    elementwise<float>(g, y, dx, [](float a, float b) { return a * (b + 1); });
    elementwise<float>(g, dy_factor, dy, [](float a, float b) { return a * b; });
  }
}

// conf_crash_aten: aten::relu (correct), aten::relu_ (segfaults), aten::isnan (never returns).
void relu(Call& call) {
  TensorRef x = call.tensor(0);
  if (!x.is(npub::sdk::kFloat32)) call.fail(NPUB_ERR_UNSUPPORTED, "float32 only");
  TensorRef y = call.output(0, x.sizes(), x.dtype());
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] != in[i] ? in[i] : (in[i] > 0 ? in[i] : 0.0f);
}

void relu_inplace(Call&) { std::raise(SIGSEGV); }

void isnan_hangs(Call&) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void init(npub::sdk::Registrar& r) {
  if (CONF_MODE == 10) {
    r.def("aten::relu(Tensor self) -> Tensor");
    r.kernel("aten::relu", &relu).dtypes({npub::sdk::kFloat32}).contiguous_only();
    r.def("aten::relu_(Tensor(a!) self) -> Tensor(a!)");
    r.kernel("aten::relu_", &relu_inplace).dtypes({npub::sdk::kFloat32});
    r.def("aten::isnan(Tensor self) -> Tensor");
    r.kernel("aten::isnan", &isnan_hangs).dtypes({npub::sdk::kFloat32});
    return;
  }
  if (CONF_MODE <= 4 || CONF_MODE == 8 || CONF_MODE == 9) {
    const std::string op = CONF_MODE == 4 ? "aten::hardtanh.outt" : "aten::hardtanh.out";
    r.def(
        (op + "(Tensor self, Scalar min_val=-1, Scalar max_val=1, *, Tensor(a!) out) -> Tensor(a!)").c_str());
    r.kernel(op, &hardtanh_out).dtypes({npub::sdk::kFloat32, npub::sdk::kFloat64}).contiguous_only();
  }
  if (CONF_MODE == 1 || (CONF_MODE >= 5 && CONF_MODE <= 7) || CONF_MODE == 9) {
    const std::string ns = CONF_NS;
    r.def((ns + "::mul_add(Tensor x, Tensor y) -> Tensor").c_str());
    r.kernel(ns + "::mul_add", &mul_add).dtypes({npub::sdk::kFloat32, npub::sdk::kFloat64}).contiguous_only();
    r.meta<&mul_add_meta>((ns + "::mul_add").c_str());
    r.def((ns + "::mul_add_backward(Tensor grad, Tensor x, Tensor y) -> (Tensor, Tensor)").c_str());
    r.kernel(ns + "::mul_add_backward", &mul_add_backward)
        .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat64})
        .contiguous_only();
    r.meta<&mul_add_backward_outputs>((ns + "::mul_add_backward").c_str());
    if (CONF_MODE != 9)
      r.derivative((ns + "::mul_add").c_str(), ("x, y: " + ns + "::mul_add_backward(grad, x, y)").c_str());
  }
}

}  // namespace

// One more expansion, so that the plugin is named after CONF_NAME's value.
#define CONF_DEFINE_PLUGIN(name) NPUB_DEFINE_PLUGIN(name, "0.0.1", init)
CONF_DEFINE_PLUGIN(CONF_NAME)
