// Test plugin: the mistakes a plugin author makes that used to pass
// silently (issue #14), one op each, and the ABI 1.4 features that turn
// them into errors:
//   mistakes::axpy           alpha * x + y, float32 only, no per-argument rule:
//                            a float64 or int64 y must not reach it
//   mistakes::axpy_listed    the same body, y declared {float32} by name; and
//                            mistakes::axpy_any, y declared any (the body checks)
//   mistakes::forgets_return a functional kernel that never allocates its return
//   mistakes::wrong_shape    the kernel allocates [1]; the meta function says x's shape
//   mistakes::unguarded      one body as kernel and meta function, without
//                            `if (call.is_meta()) return;`
//   mistakes::declines       always NPUB_ERR_UNSUPPORTED (a plugin-only op has no CPU)
//   mistakes::head           reads the host table, user data and op name from
//                            the context head (NPUB_CONTEXT_HEAD, ABI 1.4)
//   aten::hardtanh.outt      a misspelt ATen overload
#include <npubridge/plugin_sdk.hpp>

#include <cstdint>

namespace {

using namespace npub::sdk;

void axpy_body(Call& call) {
  TensorRef x = call.tensor(0), y = call.tensor(1);
  const float alpha = static_cast<float>(call.double_arg(2));
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  if (call.is_meta()) return;
  if (!y.is(kFloat32))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "y: expected float32 but found " + dtype_name(y.dtype()));
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = alpha * px[i] + py[i];
}

// Reads y as float whatever it is: what the default rule keeps from running
// on a float64 y.
void axpy_unchecked(Call& call) {
  TensorRef x = call.tensor(0), y = call.tensor(1);
  const float alpha = static_cast<float>(call.double_arg(2));
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = alpha * px[i] + py[i];
}

void forgets_return(Call& call) { (void)call.tensor(0).numel(); }

void wrong_shape(Call& call) {
  TensorRef out = call.output(0, {1}, call.tensor(0).dtype());
  out.data<float>()[0] = 0.0f;
}

void like_self_meta(Call& call) { call.output(0, call.tensor(0).sizes(), call.tensor(0).dtype()); }

// x * factor: registered as its own meta function, with no is_meta() guard.
void unguarded(Call& call) {
  TensorRef x = call.tensor(0);
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  const float f = static_cast<float>(call.double_arg(1));
  const float* px = x.data<float>();
  float* po = out.data<float>();
  call.parallel_for(0, out.numel(), 1024,
                    [&](int64_t b, int64_t e) {  // out's metadata is there in a meta call
                      for (int64_t i = b; i < e; ++i) po[i] = f * px[i];
                    });
}

void declines(Call& call) { call.fail(NPUB_ERR_UNSUPPORTED, "this kernel declines every call"); }

int g_head_marker = 0;

// head(x) -> x + 1 where the context head has this plugin's host table,
// the kernel's user data and the op's name; x otherwise. Also its own meta
// function (registered with the same user data), which declares a [0]
// result when the head is wrong there.
void head(Call& call) {
  const NpubContextHead& h = call.head();
  const bool ok = h.struct_size >= NPUB_CONTEXT_HEAD_STRUCT_SIZE && h.host == &host() &&
                  h.user_data == &g_head_marker && std::string(h.op_name) == "mistakes::head" &&
                  call.kernel_user_data() == &g_head_marker;
  TensorRef x = call.tensor(0);
  TensorRef out = call.output(0, ok ? x.sizes() : std::vector<int64_t>{0}, x.dtype());
  const float* px = x.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] + (ok ? 1.0f : 0.0f);
}

void hardtanh_out(Call& call) { call.fail(NPUB_ERR_INTERNAL, "never reachable"); }

void init(Registrar& r) {
  if (r.host_api()->abi_minor < 4) throw Error(NPUB_ERR_ABI, "needs a host of plugin ABI 1.4");
  r.op("mistakes::axpy(Tensor x, Tensor y, float alpha) -> Tensor", &axpy_unchecked).dtypes({kFloat32});
  r.op("mistakes::axpy_listed(Tensor x, Tensor y, float alpha) -> Tensor", &axpy_body)
      .dtypes({kFloat32})
      .arg_dtypes("y", {kFloat32});
  r.op("mistakes::axpy_any(Tensor x, Tensor y, float alpha) -> Tensor", &axpy_body)
      .dtypes({kFloat32})
      .any_dtype("y");
  r.op("mistakes::forgets_return(Tensor x) -> Tensor", &forgets_return).dtypes({kFloat32});
  r.op("mistakes::wrong_shape(Tensor x) -> Tensor", &wrong_shape).dtypes({kFloat32});
  r.meta<&like_self_meta>("mistakes::wrong_shape");
  r.op("mistakes::unguarded(Tensor x, float factor) -> Tensor", &unguarded).dtypes({kFloat32});
  r.meta<&unguarded>("mistakes::unguarded");
  r.op("mistakes::declines(Tensor x) -> Tensor", &declines).dtypes({kFloat32});
  r.op("mistakes::head(Tensor x) -> Tensor", &head).dtypes({kFloat32}).user_data(&g_head_marker, nullptr);
  r.meta<&head>("mistakes::head", &g_head_marker);
  r.op("aten::hardtanh.outt(Tensor self, Scalar min_val=-1, Scalar max_val=1, *, Tensor(a!) out) -> "
       "Tensor(a!)",
       &hardtanh_out)
      .dtypes({kFloat32});
}

}  // namespace

NPUB_DEFINE_PLUGIN(mistakes, "1.0.0", init)
