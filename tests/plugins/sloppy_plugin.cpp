// Test plugin with a precision bug: its aten::neg.out (preferred over
// cann_like's by priority) is off by 1e-3 for float32, and serves
// in-place calls too (x.neg_() is neg.out with out= self: each element is
// read before it is written). The precision check must catch it on every
// path.
#include <npubridge/plugin_sdk.hpp>

namespace {

void sloppy_neg(npub::sdk::Call& c) {
  npub::sdk::TensorRef self = c.tensor(0), out = c.tensor(1);
  if (!self.is(npub::sdk::kFloat32) || !out.is(npub::sdk::kFloat32) || out.numel() != self.numel())
    c.fail(NPUB_ERR_UNSUPPORTED, "only float32 of equal sizes");
  const float* x = self.data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < self.numel(); ++i) y[i] = -x[i] + 1e-3f;
}

void init(npub::sdk::Registrar& r) {
  r.def("aten::neg.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::neg.out", &sloppy_neg)
      .dtypes({npub::sdk::kFloat32})
      .contiguous_only()
      .alias_safe()
      .priority(100);
}

}  // namespace

NPUB_DEFINE_PLUGIN(sloppy, "0.0.1", init)
