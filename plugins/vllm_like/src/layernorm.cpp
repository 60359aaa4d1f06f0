// vllm_like::rms_norm and fused_add_rms_norm, as vLLM's
// csrc/layernorm_kernels.cu defines them:
//   rms_norm:           out = (x * rstd rounded to the dtype) * weight
//   fused_add_rms_norm: residual = input + residual (rounded to the dtype),
//                       input = (residual * rstd rounded to the dtype) * weight
// rstd = (mean(x^2) + epsilon)^-1/2 per row of the last dimension, in
// float32. The rounding of x * rstd before the weight is HF's LlamaRMSNorm's
// (`weight * hidden_states.to(input_dtype)`), which vLLM keeps, so that a
// model gives the same values with and without the fused op. Rows of any
// leading shape; weight [hidden].
#include <algorithm>
#include <cmath>
#include <string>

#include "loops.h"
#include "ops.h"

namespace vllm_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

void check_like(const Call& call, const TensorRef& t, const char* name, const TensorRef& x,
                const char* x_name) {
  if (t.sizes() != x.sizes())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the shape of " + x_name + " " +
                                             Call::shape_str(x.sizes()) + " but found " +
                                             Call::shape_str(t.sizes()));
  if (!t.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(name) + ": expected the dtype of " + x_name + " (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(t.dtype()));
}

struct Rows {
  int64_t rows, hidden;
};

// x's rows (its last dimension) and weight [hidden] in x's dtype.
Rows rows_of(const Call& call, const TensorRef& x, const char* x_name, const TensorRef& weight) {
  if (x.dim() < 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(x_name) + ": expected at least 1 dimension but found " +
                                             Call::shape_str(x.sizes()));
  const int64_t hidden = x.size(-1);
  if (weight.dim() != 1 || weight.size(0) != hidden)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "weight: expected shape [" + std::to_string(hidden) +
                                             "] (the last " + "dimension of " + x_name + " " +
                                             Call::shape_str(x.sizes()) + ") but found " +
                                             Call::shape_str(weight.sizes()));
  if (!weight.is(x.dtype()))
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string("weight: expected the dtype of ") + x_name + " (" +
                                             npub::sdk::dtype_name(x.dtype()) + ") but found " +
                                             npub::sdk::dtype_name(weight.dtype()));
  int64_t rows = 1;
  for (int32_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return {rows, hidden};
}

template <typename S>
struct NormArgs {
  using E = typename S::E;
  const E* x;   // rms_norm's input; fused_add_rms_norm's input (the addend)
  E* residual;  // fused_add_rms_norm only: read, then overwritten with the sum
  const E* w;
  E* out;  // rms_norm's out; fused_add_rms_norm's input
  int64_t hidden;
  double eps;
};

// One row of h (already in the dtype): out = (h * rstd rounded) * w.
// `out` may be h itself (rms_norm with out = input, fused_add_rms_norm's
// written input): each element is read before it is written.
template <typename S>
PLUGIN_KERNELS_INLINE void normalise_row(const typename S::E* h, const typename S::E* __restrict w,
                                         typename S::E* out, int64_t n, double eps) {
  const typename S::T inv = plugin_kernels::inverse_rms<S>(h, n, eps);
  for (int64_t i = 0; i < n; ++i) out[i] = S::store(S::load(S::store(S::load(h[i]) * inv)) * S::load(w[i]));
}

template <typename S, bool Add>
struct NormRows {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const NormArgs<S>& a, int64_t r0, int64_t r1) {
    using E = typename S::E;
    const int64_t n = a.hidden;
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (Add) {
        const E* __restrict x = a.x + r * n;
        E* __restrict res = a.residual + r * n;
        // the sum rounded to the dtype, as vLLM's `z = input; z += residual`
        for (int64_t i = 0; i < n; ++i) res[i] = S::store(S::load(x[i]) + S::load(res[i]));
        normalise_row<S>(res, a.w, a.out + r * n, n, a.eps);
      } else {
        normalise_row<S>(a.x + r * n, a.w, a.out + r * n, n, a.eps);
      }
    }
  }
};
template <typename S, bool Add>
void run_rows(const Call& call, const NormArgs<S>& a, int64_t rows) {
  call.parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(a.hidden, 1)),
                    [&](int64_t b, int64_t e) { run_at_kernel_isa<NormRows<S, Add>, Isa::kAvx2>(a, b, e); });
}

// vllm_like::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float epsilon) -> ()
// The checks; on their own the meta function (the op writes only `out`).
Rows rms_norm_checks(Call& call) {
  TensorRef out = call.tensor(0), in = call.tensor(1), w = call.tensor(2);
  const Rows s = rows_of(call, in, "input", w);
  check_like(call, out, "out", in, "input");
  return s;
}
void rms_norm_meta(Call& call) { rms_norm_checks(call); }

void rms_norm(Call& call) {
  TensorRef out = call.tensor(0), in = call.tensor(1), w = call.tensor(2);
  const Rows s = rms_norm_checks(call);
  plugin_kernels::with_float_types(
      call, in.dtype(),
      [&](auto tag) {
        using S = decltype(tag);
        using plugin_kernels::elements;
        const NormArgs<S> a{elements<S>(in),  nullptr,  elements<S>(w),
                            elements<S>(out), s.hidden, call.double_arg(3)};
        run_rows<S, false>(call, a, s.rows);
      },
      /*with_f64=*/false);
}

// vllm_like::fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float epsilon) -> ()
Rows fused_add_rms_norm_checks(Call& call) {
  TensorRef in = call.tensor(0), res = call.tensor(1), w = call.tensor(2);
  const Rows s = rows_of(call, in, "input", w);
  check_like(call, res, "residual", in, "input");
  return s;
}
void fused_add_rms_norm_meta(Call& call) { fused_add_rms_norm_checks(call); }

void fused_add_rms_norm(Call& call) {
  TensorRef in = call.tensor(0), res = call.tensor(1), w = call.tensor(2);
  const Rows s = fused_add_rms_norm_checks(call);
  plugin_kernels::with_float_types(
      call, in.dtype(),
      [&](auto tag) {
        using S = decltype(tag);
        using plugin_kernels::elements;
        // input is read (into the sum) before it is overwritten with the result
        const NormArgs<S> a{elements<S>(in), elements<S>(res), elements<S>(w),
                            elements<S>(in), s.hidden,         call.double_arg(3)};
        run_rows<S, true>(call, a, s.rows);
      },
      /*with_f64=*/false);
}

}  // namespace

void register_layernorm(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const auto dtypes = {kFloat32, kFloat16, kBFloat16};
  r.def("vllm_like::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float epsilon) -> ()");
  // alias_safe: out may be input itself (each element is read before it is written)
  r.kernel("vllm_like::rms_norm", &rms_norm).dtypes(dtypes).contiguous_only().alias_safe().opt_level(2);
  r.meta<&rms_norm_meta>("vllm_like::rms_norm");
  r.def(
      "vllm_like::fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float epsilon) -> "
      "()");
  r.kernel("vllm_like::fused_add_rms_norm", &fused_add_rms_norm)
      .dtypes(dtypes)
      .contiguous_only()
      .opt_level(2);
  r.meta<&fused_add_rms_norm_meta>("vllm_like::fused_add_rms_norm");
}

}  // namespace vllm_like
