// Test plugin with an op whose schema npubridge accepts but PyTorch refuses
// (a Dimname argument: PyTorch's schema parser outside ATen knows no such
// type): under PyTorch that op alone is disabled with a warning; `import
// torch` and the plugin's other op work. (Defaults PyTorch refuses are
// refused at load since Note [Defaults PyTorch takes], so they cannot serve
// here.)
#include <npubridge/plugin_sdk.hpp>

namespace {

void twice(npub::sdk::Call& c) {
  npub::sdk::TensorRef self = c.tensor(0);
  if (!self.is(npub::sdk::kFloat32)) c.fail(NPUB_ERR_UNSUPPORTED, "float32 only");
  npub::sdk::TensorRef out = c.output(0, self.sizes(), npub::sdk::kFloat32);
  if (c.is_meta()) return;
  const float* x = self.data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < self.numel(); ++i) y[i] = 2 * x[i];
}

void init(npub::sdk::Registrar& r) {
  r.def("refused::twice(Tensor self) -> Tensor");
  r.kernel("refused::twice", &twice).dtypes({npub::sdk::kFloat32}).contiguous_only();
  r.def("refused::named(Tensor self, Dimname dim) -> Tensor");
  r.kernel("refused::named", &twice).dtypes({npub::sdk::kFloat32}).contiguous_only();
}

}  // namespace

NPUB_DEFINE_PLUGIN(refused, "0.0.1", init)
