// Autocast for npu tensors (AutocastPrivateUse1), registered when the
// module loads.
//
// Note [Autocast on npu is CUDA's policy]
// Code written for CUDA (and Hugging Face's Trainer and Accelerate on an
// NPU) expects torch.autocast to cast as it does on CUDA: every op CUDA
// casts, with the same policy. So the npu registers PyTorch's own op lists
// (ATen/autocast_mode.h's AT_FORALL_* lists, kept "so that other backends
// can reuse the policy op list"), as AutocastCUDA does in
// aten/src/ATen/autocast_mode.cpp, not a hand-picked subset:
//  - lower_precision_fp: matrix products, convolutions, RNN cells and
//    scaled_dot_product_attention run in the autocast dtype (q, k and v are
//    all cast, so mixed float32/bfloat16 inputs work as on CUDA);
//  - fp32: exponentials, norms, losses and upsampling run in float32;
//  - fp32_set_opt_dtype: reductions (sum, prod, cumsum, softmax,
//    linalg_vector_norm, ...) accumulate in float32 unless a dtype is given;
//  - fp32_append_dtype: norm's overloads without a dtype get float32;
//  - promote: ops of several tensors (addcmul, index_put, scatter_add, ...)
//    run in the widest of their inputs' dtypes;
//  - binary_cross_entropy is refused, as on CUDA (unsafe to autocast; use
//    binary_cross_entropy_with_logits).
// Only CUDA's cuDNN-specific entries (cudnn_convolution*) are left out:
// the npu has no such ops. tests/python/test_autocast.py checks each class.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace npub::torch_backend {

namespace {

// The names AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE's signatures use
// unqualified (ATen registers them inside namespace at).
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// As CUDA's (its own is not exported): the loss of a sigmoid's output in
// float16 is unsafe, so autocast refuses it and says what to use instead.
at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast on npu (as on "
      "CUDA): a sigmoid's output in float16 or bfloat16 loses the values near 0 and 1. Use "
      "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which combine "
      "the two and are safe to autocast, or disable autocast around the loss.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NPUB_AUTOCAST_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPUB_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPUB_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPUB_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(NPUB_AUTOCAST_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NPUB_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPUB_AUTOCAST_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NPUB_AUTOCAST_PROMOTE)
#undef NPUB_AUTOCAST_LOWER_PRECISION_FP
#undef NPUB_AUTOCAST_FP32
#undef NPUB_AUTOCAST_FP32_SET_OPT_DTYPE
#undef NPUB_AUTOCAST_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN((&binary_cross_entropy_banned)));
}

}  // namespace

}  // namespace npub::torch_backend
