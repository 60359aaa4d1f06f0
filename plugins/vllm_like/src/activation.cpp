// vllm_like's gated activations, as vLLM's csrc/activation_kernels.cu
// defines them: out[..., i] = act(input[..., i]) * input[..., d + i] for
// i < d = input.size(-1) / 2, with act silu, erf GELU or tanh GELU.
// float32, float16 and bfloat16, computed in float32 and rounded once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "loops.h"
#include "ops.h"

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// The checks on metadata alone, shared by the three ops; also their meta
// function (they write only `out`, so there is nothing to declare).
void act_and_mul_meta(Call& call) {
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

// The activations, in float32.
struct Silu {
  static PLUGIN_KERNELS_INLINE float apply(float x) { return x * plugin_kernels::sigmoid(x); }
};
// x * Phi(x) with Phi(x) = erfc(z) / 2, z = -x / sqrt 2: unlike
// 1 + erf(x / sqrt 2) it does not cancel for negative x, so the result keeps
// its relative accuracy where it is small. erfc without libm (a libm call
// keeps the loop scalar): erfc(a) = e^(-a^2) * R(a) for a = |z|, with
// R(a) = e^(a^2) erfc(a) = t P(t), t = 1 / (1 + a / 2), P of degree 10
// fitted here for relative error (3.4e-9 in exact arithmetic over a in
// [0, 10], about 5 float32 ulps evaluated in float32); erfc(z) = 2 -
// erfc(a) for z < 0. Below a = 9.34 e^(-a^2) is subnormal and flushes to 0
// (exp_nonpositive), where x Phi(x) is below 1e-38 |x|.
struct GeluErf {
  static PLUGIN_KERNELS_INLINE float apply(float x) {
    const float z = -x * 0.70710678118654752f;
    const float a = std::fabs(z);
    const float t = 1.0f / (1.0f + 0.5f * a);
    float p = 0.035374365746974945f;
    p = p * t - 0.18870006501674652f;
    p = p * t + 0.37534254789352417f;
    p = p * t - 0.28047487139701843f;
    p = p * t - 0.030664704740047455f;
    p = p * t + 0.04091827571392059f;
    p = p * t + 0.05253898724913597f;
    p = p * t + 0.18624983727931976f;
    p = p * t + 0.2450636476278305f;
    p = p * t + 0.28226396441459656f;
    p = p * t + 0.2820880115032196f;
    const float e = plugin_kernels::exp_nonpositive(-a * a) * (t * p);
    const float erfc = z >= 0.0f ? e : 2.0f - e;
    return 0.5f * x * erfc;
  }
};
// 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), computed as
// x * sigmoid(2u) (the same function: 1 + tanh(u) = 2 sigmoid(2u)), which
// neither cancels nor calls libm.
struct GeluTanh {
  static PLUGIN_KERNELS_INLINE float apply(float x) {
    const float u2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);  // 2 sqrt(2 / pi) (...)
    return x * plugin_kernels::sigmoid(u2);
  }
};

template <typename S, typename A>
struct ActAndMulRows {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const typename S::E* __restrict in, typename S::E* __restrict out,
                                        int64_t d, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const typename S::E* __restrict x = in + r * 2 * d;
      const typename S::E* __restrict y = x + d;
      typename S::E* __restrict o = out + r * d;
      for (int64_t i = 0; i < d; ++i) o[i] = S::store(A::apply(S::load(x[i])) * S::load(y[i]));
    }
  }
};
template <typename A>
void act_and_mul(Call& call) {
  TensorRef out = call.tensor(0), in = call.tensor(1);
  act_and_mul_meta(call);
  const int64_t d = in.size(-1) / 2;
  const int64_t rows = d == 0 ? 0 : out.numel() / d;
  plugin_kernels::with_float_types(
      call, in.dtype(),
      [&](auto tag) {
        using S = decltype(tag);
        const typename S::E* pi = plugin_kernels::elements<S>(in);
        typename S::E* po = plugin_kernels::elements<S>(out);
        call.parallel_for(0, rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(d, 1)),
                          [&](int64_t b, int64_t e) {
                            run_at_kernel_isa<ActAndMulRows<S, A>, Isa::kAvx2>(pi, po, d, b, e);
                          });
      },
      /*with_f64=*/false);
}

}  // namespace

void register_activation(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const auto dtypes = {kFloat32, kFloat16, kBFloat16};
  r.def("vllm_like::silu_and_mul(Tensor(a!) out, Tensor input) -> ()");
  r.kernel("vllm_like::silu_and_mul", &act_and_mul<Silu>).dtypes(dtypes).contiguous_only().opt_level(2);
  r.meta<&act_and_mul_meta>("vllm_like::silu_and_mul");
  r.def("vllm_like::gelu_and_mul(Tensor(a!) out, Tensor input) -> ()");
  r.kernel("vllm_like::gelu_and_mul", &act_and_mul<GeluErf>).dtypes(dtypes).contiguous_only().opt_level(2);
  r.meta<&act_and_mul_meta>("vllm_like::gelu_and_mul");
  r.def("vllm_like::gelu_tanh_and_mul(Tensor(a!) out, Tensor input) -> ()");
  r.kernel("vllm_like::gelu_tanh_and_mul", &act_and_mul<GeluTanh>)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&act_and_mul_meta>("vllm_like::gelu_tanh_and_mul");
}

}  // namespace vllm_like
