// scaled_dot_product_attention's backend choice for npu tensors.
//
// PyTorch asks a DispatchStub (at::native::_fused_sdp_choice_stub) which
// backend runs SDPA, and only C++ can fill the stub's PrivateUse1 slot;
// without it every npu call takes the math path. The slot forwards to the
// aten::_fused_sdp_choice op's PrivateUse1 kernel, which npubridge/_sdpa.py
// registers with torch.library (it picks mindspeed_like's flash attention,
// "overrideable", or math per call). Until that kernel exists: math.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>

namespace {

constexpr int64_t kSdpMath = 0;  // sdp::SDPBackend::math (torch.nn.attention.SDPBackend.MATH)

int64_t npu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_fused_sdp_choice", "");
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return kSdpMath;
  return at::_ops::_fused_sdp_choice::call(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                           enable_gqa);
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &npu_fused_sdp_choice)
}  // namespace at::native
