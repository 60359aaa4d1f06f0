// mindspeed_like's fusion patterns (ABI 1.5, NpubHostApi.register_fusion_pattern):
// the composites its fused ops replace, as PyTorch's pre-dispatch ATen graph
// spells them (what npubridge's torch.compile backend matches; format in
// docs/graph-mode.md, "Fusion patterns"). Each fused op has a derivative
// (define_derivative), so a training graph differentiates the rewrite.
#include <npubridge/plugin_sdk.hpp>

#include "ops.h"

namespace mindspeed_like {

namespace {

// Note [RMSNorm patterns with and without the casts]
// HF's LlamaRMSNorm computes in float32: `h = x.to(float32)`, the composite,
// then `weight * h.to(input_dtype)`. Pre-dispatch tracing keeps both
// `aten::to.dtype` calls even when they change nothing, so the composite
// ends in a cast there: the `_cast` patterns (tried first: higher priority)
// cover that form, the others the plain composite. The fused op does not
// round through the cast, so a `_cast` pattern holds only when the cast
// goes back to the dtype the norm read (`where $dtype == %x.dtype`: a no-op
// here; npubridge's rms_norm_upcast covers the bfloat16 model's real
// round trip). The output dtype alone would not tell: under type promotion
// `gamma(f32) * n.to(int32 | bfloat16)` is float32 again, and the fused op
// would skip the truncation or rounding.
// npu_rms_norm normalises over all the trailing dims gamma covers, the
// composite over the last only: gamma must be 1-D of the last dim's size
// (a [S, H] gamma, or a full-shape gate, would make the fused op normalise
// over S*H). The add_rms_norm patterns run over the output of the rms_norm
// rewrite (lower priority: after it), where the sum has other users (the
// residual stream): its return 2 replaces the sum; the cast between the
// add and the norm must be a no-op for the same reason as above.
constexpr const char* kRmsNorm = R"(
pattern rms_norm_cast priority 21
  %sq = aten::pow.Tensor_Scalar(%x, 2)
  %var = aten::mean.dim(%sq, [-1], True)
  %ve = aten::add.Tensor(%var, $eps)
  %r = aten::rsqrt(%ve)
  %n = aten::mul.Tensor(%x, %r)
  %nc = aten::to.dtype(%n, $dtype)
  %y = aten::mul.Tensor(%gamma, %nc)
  where $dtype == %x.dtype
  where %gamma.dim() == 1
  where %gamma.size(0) == %x.size(-1)
  => mindspeed_like::npu_rms_norm(%x, %gamma, $eps)[0]
end
pattern rms_norm priority 20
  %sq = aten::pow.Tensor_Scalar(%x, 2)
  %var = aten::mean.dim(%sq, [-1], True)
  %ve = aten::add.Tensor(%var, $eps)
  %r = aten::rsqrt(%ve)
  %n = aten::mul.Tensor(%x, %r)
  %y = aten::mul.Tensor(%gamma, %n)
  where %gamma.dim() == 1
  where %gamma.size(0) == %x.size(-1)
  => mindspeed_like::npu_rms_norm(%x, %gamma, $eps)[0]
end
pattern add_rms_norm_cast priority 11
  %s = aten::add.Tensor(%x1, %x2)
  %sc = aten::to.dtype(%s, $dtype)
  %n = mindspeed_like::npu_rms_norm(%sc, %gamma, $eps)[0]
  where $dtype == %s.dtype
  => mindspeed_like::npu_add_rms_norm(%x1, %x2, %gamma, $eps)[0]
  => %s <- [2]
end
pattern add_rms_norm priority 10
  %s = aten::add.Tensor(%x1, %x2)
  %n = mindspeed_like::npu_rms_norm(%s, %gamma, $eps)[0]
  => mindspeed_like::npu_add_rms_norm(%x1, %x2, %gamma, $eps)[0]
  => %s <- [2]
end
)";

// SwiGLU: npu_swiglu takes both halves in one tensor (torch_npu's form).
constexpr const char* kSwiglu = R"(
pattern swiglu priority 10
  %s = aten::silu(%a)
  %y = aten::mul.Tensor(%s, %b)
  => mindspeed_like::npu_swiglu(aten::cat([%a, %b], -1), -1)
end
)";

// Note [The sdpa patterns need an explicit scale]
// scaled_dot_product_attention's default scale is 1/sqrt(D), which a
// pattern cannot compute; the patterns capture the scale the call passes
// (HF attention passes `scale=self.scaling`), so a call without one binds
// None, which npu_fusion_attention's float `scale` refuses: the matcher's
// meta check skips it, and eager SDPA (npubridge/_sdpa.py) serves it with
// the same kernel anyway. Layout BNSD, head_num the query's size(1); causal
// is sparse_mode 2, as _sdpa.py calls it. Masks are left to eager SDPA
// (its boolean masks mean the opposite of the kernel's).
constexpr const char* kAttention = R"(
pattern sdpa_causal priority 10
  %o = aten::scaled_dot_product_attention(%q, %k, %v, None, 0.0, True, $scale)
  => mindspeed_like::npu_fusion_attention(%q, %k, %v, %q.size(1), "BNSD", None, None, None, $scale, 1.0, 2147483647, 2147483647, 0, None, None, None, 2)[0]
end
pattern sdpa priority 10
  %o = aten::scaled_dot_product_attention(%q, %k, %v, None, 0.0, False, $scale)
  => mindspeed_like::npu_fusion_attention(%q, %k, %v, %q.size(1), "BNSD", None, None, None, $scale, 1.0, 2147483647, 2147483647, 0, None, None, None, 0)[0]
end
)";

}  // namespace

void register_fusion_patterns(npub::sdk::Registrar& r) {
  if (!r.has_fusion_patterns()) return;  // a host before ABI 1.5: the ops alone
  r.fusion_pattern(kRmsNorm);
  r.fusion_pattern(kSwiglu);
  r.fusion_pattern(kAttention);
}

}  // namespace mindspeed_like
