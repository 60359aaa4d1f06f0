// Dropout: aten::native_dropout and its backward.
//
// Note [Dropout draws Philox blocks in batches]
// The mask comes from the device's Philox stream, one counter per 4 elements
// (npubridge/philox.hpp). With each element loaded and stored through the
// dtype switch, dropout ran at ~9 ns an element. Here the mask bytes of 16
// blocks are drawn into a small buffer, and float32 elements are scaled from
// it in a typed loop compiled per ISA level, in the same pass. The stream
// and the results are the same as block by block.
#include "elementwise.h"
#include "ops.h"

#include <npubridge/philox.hpp>

#include <cstring>

namespace cann_like {

namespace {

constexpr int kLanes = 16;  // Philox blocks per batch

// The 4 * kLanes uniform draws of blocks [counter, counter + kLanes): keep[i]
// = uniform(bits of element i) < keep_p.
PLUGIN_KERNELS_INLINE void keep_batch(uint64_t seed, uint64_t counter, float keep_p, uint8_t* keep) {
  for (int l = 0; l < kLanes; ++l) {
    const auto r = npub::philox::block(seed, counter + static_cast<uint64_t>(l));
    for (int k = 0; k < 4; ++k) keep[4 * l + k] = npub::philox::uniform(r[static_cast<size_t>(k)]) < keep_p;
  }
}

// Elements [b, e) (b a multiple of 4 * kLanes) of the mask, and of a float32
// output when x is not null: out = kept ? x * scale (in double, rounded once)
// : 0.
PLUGIN_KERNELS_INLINE void dropout_range_body(uint64_t seed, uint64_t offset, int64_t b, int64_t e,
                                              float keep_p, double scale, uint8_t* m, const float* x,
                                              float* o) {
  uint8_t keep[4 * kLanes];
  for (int64_t i0 = b; i0 < e; i0 += 4 * kLanes) {
    keep_batch(seed, offset + static_cast<uint64_t>(i0 / 4), keep_p, keep);
    const int64_t w = std::min<int64_t>(4 * kLanes, e - i0);
    std::memcpy(m + i0, keep, static_cast<size_t>(w));
    if (x != nullptr)
      for (int64_t j = 0; j < w; ++j)
        o[i0 + j] = keep[j] ? static_cast<float>(static_cast<double>(x[i0 + j]) * scale) : 0.0f;
  }
}
PLUGIN_KERNELS_ISA_DISPATCH(void, dropout_range, dropout_range_body,
                            (uint64_t seed, uint64_t offset, int64_t b, int64_t e, float keep_p, double scale,
                             uint8_t* m, const float* x, float* o),
                            (seed, offset, b, e, keep_p, scale, m, x, o))

// aten::native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)
// Training: mask ~ Bernoulli(1 - p) from the device's Philox stream (one
// counter per 4 elements), output = input * mask / (1 - p). Inference
// (train=False): output = input, mask all true.
void native_dropout(Call& call) {
  TensorRef x = call.tensor(0);
  const double p = call.double_arg(1);
  const bool train = call.is_none(2) || call.bool_arg(2);
  if (!(p >= 0 && p <= 1))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "dropout probability has to be between 0 and 1, but got " + std::to_string(p));
  const DT d = dt_of(x.dtype());
  const int64_t n = x.numel(), es = dt_size(d);
  TensorRef out = call.output(0, x.sizes(), x.dtype());
  TensorRef mask = call.output(1, x.sizes(), npub::sdk::kBool);
  uint8_t* m = mask.data<uint8_t>();
  if (!train || p == 0) {
    std::memcpy(out.data<char>(), x.data<char>(), static_cast<size_t>(n * es));
    std::memset(m, 1, static_cast<size_t>(n));
    return;
  }
  const auto [seed, offset] = call.philox(static_cast<uint64_t>((n + 3) / 4));
  const float keep = static_cast<float>(1.0 - p);
  const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  const bool f32 = d == DT::f32;
  constexpr int64_t kBatch = 4 * kLanes;
  // See Note [Dropout draws Philox blocks in batches].
  call.parallel_for(0, (n + kBatch - 1) / kBatch, 256, [&](int64_t bb, int64_t be) {
    const int64_t b = bb * kBatch, e = std::min(n, be * kBatch);
    dropout_range(seed, offset, b, e, keep, scale, m, f32 ? x.data<float>() : nullptr,
                  f32 ? out.data<float>() : nullptr);
    if (f32) return;
    for (int64_t i = b; i < e; ++i)
      store<double>(out.data<char>() + i * es, d,
                    m[i] ? load<double>(x.data<char>() + i * es, d) * scale : 0.0);
  });
}

// aten::native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor
// ATen's grad_output * mask * scale: the product with the mask in the
// grad's dtype (exact; NaN * 0 stays NaN), then the scale as the compute
// type's scalar (float for float and the half types, as ATen's opmath).
void native_dropout_backward(Call& call) {
  const TensorRef g = call.tensor(0), mask = call.tensor(1);
  const DT d = dt_of(g.dtype());
  if (!mask.is(npub::sdk::kBool))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("mask should be a boolean tensor, but got ") + dt_name(dt_of(mask.dtype())));
  if (mask.sizes() != g.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "mask of shape " + shape_str(mask.sizes()) +
                                             " does not match grad_output of shape " + shape_str(g.sizes()));
  const double scale = call.double_arg(2);
  TensorRef out = call.output(0, g.sizes(), g.dtype());
  const int64_t n = g.numel(), es = dt_size(d);
  const uint8_t* m = mask.data<uint8_t>();
  const char* gb = g.data<char>();
  char* ob = out.data<char>();
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T s = static_cast<T>(scale);
      call.parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
        if (dt_for<T>() == d) {  // the typed (vectorisable) loop
          const T* gt = reinterpret_cast<const T*>(gb);
          T* ot = reinterpret_cast<T*>(ob);
          for (int64_t i = b; i < e; ++i) ot[i] = (gt[i] * (m[i] ? T(1) : T(0))) * s;
          return;
        }
        for (int64_t i = b; i < e; ++i) {
          const T v = load<T>(gb + i * es, d) * (m[i] ? T(1) : T(0));
          store<T>(ob + i * es, d, v * s);
        }
      });
    }
  });
}

}  // namespace

void register_dropout(npub::sdk::Registrar& r) {
  r.op("aten::native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor",
       &native_dropout_backward)
      .dtypes(dtypes_floating())
      .arg_dtypes("mask", {npub::sdk::kBool})
      .contiguous_only();
  r.op("aten::native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)", &native_dropout)
      .dtypes(dtypes_floating())
      .contiguous_only();
}

}  // namespace cann_like
