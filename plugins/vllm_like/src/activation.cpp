// vllm_like's activation ops: silu_and_mul (SwiGLU's gate) and its GELU
// variants, as vLLM's csrc/activation_kernels.cu defines them.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// vllm_like::silu_and_mul(Tensor(a!) out, Tensor input) -> ()
// out[..., d] = silu(input[..., :d]) * input[..., d:]
// The checks on metadata alone; also the op's meta function (it writes only
// `out`, so there is nothing to declare).
void silu_and_mul_meta(Call& call) {
  TensorRef out = call.tensor(0), in = call.tensor(1);
  if (in.dim() < 1 || in.size(-1) % 2 != 0)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "input: expected an even last dimension but found shape " + Call::shape_str(in.sizes()));
  std::vector<int64_t> expected = in.sizes();
  expected.back() /= 2;
  if (out.sizes() != expected)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected shape " + Call::shape_str(expected) + " but found " +
                                             Call::shape_str(out.sizes()));
  if (!out.is(in.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "out: expected the dtype of input (" +
                                             npub::sdk::dtype_name(in.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(out.dtype()));
}

void silu_and_mul(Call& call) {
  TensorRef out = call.tensor(0), in = call.tensor(1);
  if (!in.is(npub::sdk::kFloat32) || !out.is(npub::sdk::kFloat32))
    call.fail(NPUB_ERR_UNSUPPORTED, "expected float32 out and input");
  silu_and_mul_meta(call);
  const int64_t d = in.size(-1) / 2;
  const int64_t rows = d == 0 ? 0 : out.numel() / d;
  const float* pi = in.data<float>();
  float* po = out.data<float>();
  call.parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = pi + r * 2 * d;
      float* y = po + r * d;
      for (int64_t i = 0; i < d; ++i) {
        const float g = x[i];
        y[i] = g / (1.0f + std::exp(-g)) * x[d + i];
      }
    }
  });
}

}  // namespace

void register_activation(npub::sdk::Registrar& r) {
  r.def("vllm_like::silu_and_mul(Tensor(a!) out, Tensor input) -> ()");
  r.kernel("vllm_like::silu_and_mul", &silu_and_mul)
      .dtypes({npub::sdk::kFloat32})
      .contiguous_only()
      .opt_level(2);
  r.meta<&silu_and_mul_meta>("vllm_like::silu_and_mul");
}

}  // namespace vllm_like
