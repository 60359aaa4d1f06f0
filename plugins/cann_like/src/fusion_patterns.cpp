// cann_like's fusion patterns (ABI 1.5, NpubHostApi.register_fusion_pattern):
// conv2d + relu -> conv2d_bias_relu, as PyTorch's pre-dispatch ATen graph
// spells it (format in docs/graph-mode.md, "Fusion patterns"). The fused op
// differentiates through conv2d_bias_relu_backward (conv.cpp). Arguments the
// conv2d call leaves out bind their schema defaults; a None bias gives the
// fused op (bias: Tensor) a call its meta function refuses, so the matcher
// skips it.
#include <npubridge/plugin_sdk.hpp>

#include "ops.h"

namespace cann_like {

namespace {

constexpr const char* kConvRelu = R"(
pattern conv2d_bias_relu priority 10
  %c = aten::conv2d(%x, %w, %b, $stride, $padding, $dilation, $groups)
  %y = aten::relu(%c)
  => cann_like::conv2d_bias_relu(%x, %w, %b, $stride, $padding, $dilation, $groups)
end
pattern conv2d_bias_relu_inplace priority 10
  %c = aten::conv2d(%x, %w, %b, $stride, $padding, $dilation, $groups)
  %y = aten::relu_(%c)
  => cann_like::conv2d_bias_relu(%x, %w, %b, $stride, $padding, $dilation, $groups)
end
)";

}  // namespace

void register_fusion_patterns(npub::sdk::Registrar& r) {
  if (!r.has_fusion_patterns()) return;  // a host before ABI 1.5: the ops alone
  r.fusion_pattern(kConvRelu);
}

}  // namespace cann_like
