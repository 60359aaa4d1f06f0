// Test plugin with two numerical defects that npub-conformance's error model
// must catch (tests/conformance_catches_defects.sh): its aten::mm.out drops
// the last term of every dot product, and its float16 aten::add.out is off
// by 4 ulp. Both are preferred over cann_like's kernels by priority.
#include <npubridge/plugin_sdk.hpp>

#include <cmath>
#include <cstring>

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

void mm_without_last_term(Call& c) {
  TensorRef a = c.tensor(0), b = c.tensor(1), out = c.tensor(2);
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || !a.is(npub::sdk::kFloat32) ||
      !b.is(npub::sdk::kFloat32))
    c.fail(NPUB_ERR_UNSUPPORTED, "float32 matrices of matching inner size only");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (out.sizes() != std::vector<int64_t>{m, n})
    c.fail(NPUB_ERR_UNSUPPORTED, "out must have the product's shape");
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* z = out.data<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t p = 0; p + 1 < k; ++p) s += x[i * k + p] * y[p * n + j];  // the defect: p < k - 1
      z[i * n + j] = s;
    }
}

void add_off_by_4_ulp(Call& c) {
  TensorRef a = c.tensor(0), b = c.tensor(1), out = c.tensor(3);
  if (!a.is(npub::sdk::kFloat16) || !b.is(npub::sdk::kFloat16))
    c.fail(NPUB_ERR_UNSUPPORTED, "float16 operands of one shape only");
  if (out.sizes() != a.sizes() || b.sizes() != a.sizes())
    c.fail(NPUB_ERR_UNSUPPORTED, "one shape for all operands only");
  const double alpha = c.scalar_arg(2);
  const uint16_t* x = a.data<uint16_t>();
  const uint16_t* y = b.data<uint16_t>();
  uint16_t* z = out.data<uint16_t>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float s =
        npub::sdk::half_to_float(x[i]) + static_cast<float>(alpha) * npub::sdk::half_to_float(y[i]);
    uint16_t h = npub::sdk::float_to_half(s);
    if (std::isfinite(s) && (h & 0x7c00) != 0x7c00 && (h & 0x7fff) < 0x7bfb)
      h = static_cast<uint16_t>(h + 4);  // the defect
    z[i] = h;
  }
}

void init(npub::sdk::Registrar& r) {
  r.def("aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::mm.out", &mm_without_last_term)
      .dtypes({npub::sdk::kFloat32})
      .contiguous_only()
      .priority(100);
  r.def("aten::add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!)");
  r.kernel("aten::add.out", &add_off_by_4_ulp).dtypes({npub::sdk::kFloat16}).contiguous_only().priority(100);
}

}  // namespace

NPUB_DEFINE_PLUGIN(imprecise, "0.0.1", init)
