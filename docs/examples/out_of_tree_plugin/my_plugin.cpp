// A complete plugin: one op, one kernel, written with the header-only SDK.
#include <npubridge/plugin_sdk.hpp>

namespace {

// myplug::axpy(Tensor x, Tensor y, float alpha) -> Tensor   : alpha * x + y
void axpy(npub::sdk::Call& call) {
  npub::sdk::TensorRef x = call.tensor(0), y = call.tensor(1);
  const float alpha = static_cast<float>(call.double_arg(2));
  if (x.sizes() != y.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "x and y must have the same shape, but found " +
                                             npub::sdk::Call::shape_str(x.sizes()) + " and " +
                                             npub::sdk::Call::shape_str(y.sizes()));
  npub::sdk::TensorRef out = call.output(0, x.sizes(), x.dtype());
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* po = out.data<float>();
  call.parallel_for(0, x.numel(), 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = alpha * px[i] + py[i];
  });
}

void init(npub::sdk::Registrar& r) {
  r.def("myplug::axpy(Tensor x, Tensor y, float alpha) -> Tensor");
  r.kernel("myplug::axpy", &axpy)
      .dtypes({npub::sdk::kFloat32})  // fp16/bf16 calls reach it through conversion
      .contiguous_only();             // strided inputs are staged by the dispatcher
}

}  // namespace

NPUB_DEFINE_PLUGIN(myplug, "1.0.0", init)
