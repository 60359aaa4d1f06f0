// Autocast for npu tensors, registered for AutocastPrivateUse1 when the
// module loads.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace npub::torch_backend {

namespace {

// Autocast for npu: PyTorch's usual policy. Matrix products and
// convolutions in the autocast dtype; reductions, norms, losses and
// exponentials in float32.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  KERNEL_PRIVATEUSEONE(mm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(addmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(bmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(baddbmm, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(matmul, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(linear, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(conv2d, lower_precision_fp)
  KERNEL_PRIVATEUSEONE(exp, fp32)
  KERNEL_PRIVATEUSEONE(log, fp32)
  KERNEL_PRIVATEUSEONE(log1p, fp32)
  KERNEL_PRIVATEUSEONE(rsqrt, fp32)
  KERNEL_PRIVATEUSEONE(reciprocal, fp32)
  KERNEL_PRIVATEUSEONE(pow, Tensor_Scalar, fp32)
  KERNEL_PRIVATEUSEONE(layer_norm, fp32)
  KERNEL_PRIVATEUSEONE(nll_loss, fp32)
  KERNEL_PRIVATEUSEONE(mse_loss, fp32)
  KERNEL_PRIVATEUSEONE(l1_loss, fp32)
  KERNEL_PRIVATEUSEONE(binary_cross_entropy_with_logits, fp32)
  KERNEL_PRIVATEUSEONE(softmax, int, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(log_softmax, int, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(sum, fp32_set_opt_dtype)
  KERNEL_PRIVATEUSEONE(cumsum, fp32_set_opt_dtype)
}

}  // namespace

}  // namespace npub::torch_backend
