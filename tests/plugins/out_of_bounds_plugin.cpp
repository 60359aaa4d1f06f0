// Test plugin: kernels that write outside their buffers, which the guard
// zones of NPUB_VALIDATE=1 must catch (Note [Guard zones],
// device_sim/caching_allocator.h; tests/unit/test_guard_zones.cpp):
//   oob::write_before(Tensor x) -> Tensor       copies x, then writes 256 bytes
//                                              just before its output
//   oob::write_after(Tensor x, Tensor(a!) out) -> Tensor(a!)
//                                              copies x into out, then writes 4
//                                              bytes just past out's end
//   oob::copy(Tensor x) -> Tensor              copies x, in bounds
#include <npubridge/plugin_sdk.hpp>

#include <cstdint>
#include <cstring>

namespace {

using namespace npub::sdk;

void copy_into(const TensorRef& x, const TensorRef& out) {
  std::memcpy(out.data<float>(), x.data<float>(), static_cast<size_t>(x.numel()) * sizeof(float));
}

void write_before(Call& call) {
  TensorRef x = call.tensor(0);
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  if (call.is_meta()) return;
  copy_into(x, out);
  std::memset(reinterpret_cast<unsigned char*>(out.data<float>()) - 256, 0x42, 256);
}

void write_after(Call& call) {
  TensorRef x = call.tensor(0), out = call.tensor(1);
  copy_into(x, out);
  std::memset(out.data<float>() + out.numel(), 0x42, 4);
}

void copy(Call& call) {
  TensorRef x = call.tensor(0);
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  if (call.is_meta()) return;
  copy_into(x, out);
}

void init(Registrar& r) {
  r.op("oob::write_before(Tensor x) -> Tensor", &write_before).dtypes({kFloat32});
  r.meta<&write_before>("oob::write_before");
  r.op("oob::write_after(Tensor x, Tensor(a!) out) -> Tensor(a!)", &write_after).dtypes({kFloat32});
  r.op("oob::copy(Tensor x) -> Tensor", &copy).dtypes({kFloat32});
  r.meta<&copy>("oob::copy");
}

}  // namespace

NPUB_DEFINE_PLUGIN(oob, "1.0.0", init)
