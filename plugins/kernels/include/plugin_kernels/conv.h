// Float32 2-d convolutions on oneDNN's convolution primitives: the three
// passes of a convolution (forward, input grad, weight grad) on plain NCHW
// tensors, spread over the device's compute threads. cann_like runs its
// float32 2-d convolutions here and keeps im2col + GEMM for the rest.
//
// Note [Convolutions on oneDNN's convolution primitives]
// oneDNN's direct convolution kernels (jit:avx512_core, jit_1x1, ...) are
// about twice as fast as im2col + GEMM on a CNN's shapes, but want their
// activations and weights in blocked layouts (nChw16c, OIhw16i16o): on
// plain NCHW oneDNN offers only its own im2col + GEMM. So every pass
// reorders its operands from PyTorch's NCHW into the layout the primitive
// chose (format_tag::any) and its result back; the reorders cost 5 to 10%
// of the convolution. The batch is split into one sub-batch of images per
// compute thread (call.parallel_for); each thread reorders and convolves
// its own images into buffers of its own, with one OpenMP thread and its
// own scratchpad (Note [GEMM runs on the caller's thread only]). The
// weights are reordered once, on the calling thread, and read by all. The
// weight grad is a sum over images: each sub-batch computes its partial
// dW, and the partials are added in sub-batch order, so the result does
// not depend on which thread ran what. Primitives (the convolution and its
// reorders) are created once per shape and sub-batch size and shared (Note
// [oneDNN primitives are created once and run from any thread]).
// A pass declines (returns false, having written nothing) when oneDNN is
// not built in, or offers only its reference or GEMM-based kernels for the
// shape (no faster than the caller's im2col; and its gemm:jit cannot run
// where PyTorch's oneDNN interposes it, Note [Two oneDNN copies in one
// process]), or when the blocked kernel would waste most of its work
// (the input grad of a convolution with fewer than 8 input channels a
// group: the stem of an image model, 2x slower than im2col).
#pragma once

#include <npubridge/plugin_sdk.hpp>

#include <cstdint>

namespace plugin_kernels {

// x [n, c, h, w] convolved with w [oc, c / groups, kh, kw] gives y [n, oc,
// oh, ow]; all contiguous NCHW float32. Dilation as PyTorch's (1: dense);
// padding the same on both sides (oh and ow are PyTorch's output sizes).
struct Conv2dShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t oc = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dil_h = 1, dil_w = 1;
  int64_t groups = 1;
};

// y = conv(x, w) (+ bias[oc], when not null).
bool conv2d_forward(const npub::sdk::Call& call, const Conv2dShape& s, const float* x, const float* w,
                    const float* bias, float* y);

// dx = the input grad of conv(x, w) for the output grad dy (overwritten).
bool conv2d_backward_data(const npub::sdk::Call& call, const Conv2dShape& s, const float* dy, const float* w,
                          float* dx);

// dw = the weight grad of conv(x, w) for the output grad dy, summed over
// the batch (overwritten).
bool conv2d_backward_weights(const npub::sdk::Call& call, const Conv2dShape& s, const float* x,
                             const float* dy, float* dw);

}  // namespace plugin_kernels
