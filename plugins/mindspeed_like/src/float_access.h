// Typed element access for mindspeed_like's kernels: float32, float16 and
// bfloat16 read and written in their own dtype, computed in float32.
#pragma once

#include <npubridge/plugin_sdk.hpp>

namespace mindspeed_like {

// Calls f(load, store) with element accessors typed for dtype `t` (float32,
// float16 or bfloat16; half types are read and written in their own dtype
// and computed in float32): one compiled loop per dtype.
template <typename F>
inline void with_float_access(const npub::sdk::Call& call, DLDataType t, F&& f) {
  if (npub::sdk::same_dtype(t, npub::sdk::kFloat32)) {
    f([](const npub::sdk::TensorRef& x, int64_t i) { return x.data<float>()[i]; },
      [](const npub::sdk::TensorRef& x, int64_t i, float v) { x.data<float>()[i] = v; });
  } else if (npub::sdk::same_dtype(t, npub::sdk::kFloat16)) {
    f([](const npub::sdk::TensorRef& x,
         int64_t i) { return npub::sdk::half_to_float(x.data<uint16_t>()[i]); },
      [](const npub::sdk::TensorRef& x, int64_t i, float v) {
        x.data<uint16_t>()[i] = npub::sdk::float_to_half(v);
      });
  } else if (npub::sdk::same_dtype(t, npub::sdk::kBFloat16)) {
    f([](const npub::sdk::TensorRef& x,
         int64_t i) { return npub::sdk::bf16_to_float(x.data<uint16_t>()[i]); },
      [](const npub::sdk::TensorRef& x, int64_t i, float v) {
        x.data<uint16_t>()[i] = npub::sdk::float_to_bf16(v);
      });
  } else {
    call.fail(NPUB_ERR_UNSUPPORTED, "dtype " + npub::sdk::dtype_name(t));
  }
}

}  // namespace mindspeed_like
