// mindspeed_like::npu_apply_adam_w: one AdamW step over lists of tensors, in
// place, in one call (the role of MindSpeed's fused AdamW / torch_npu's
// npu_apply_adam_w).
//
// Note [AdamW's arithmetic follows torch.optim.AdamW]
// Each element is updated with the operations of torch.optim.AdamW's
// single-tensor path (_single_tensor_adam with decoupled weight decay) in
// their order, each rounded where ATen's CPU kernel rounds, so that a float32
// training run tracks torch's to the last bits rather than drifting by an
// algebraically equal but differently rounded formula:
//   p = p * (1 - lr*wd)                           mul_ (skipped when wd == 0)
//   m = lerp(m, g, 1 - b1)                        lerp_: ATen's vectorised form, one FMA:
//         |w| < 0.5 ? fma(w, g - m, m) : fma(w - 1, g - m, g)
//   v = fma((1 - b2) * g, g, v * b2)              mul_(b2).addcmul_(g, g, value=1 - b2)
//   (amsgrad: vmax = maximum(vmax, v), NaN-propagating; use vmax)
//   d = sqrt(v) / sqrt(1 - b2^step) + eps         (sqrt / bc2_sqrt).add_(eps)
//   p = p + (-lr / (1 - b1^step)) * m / d         addcdiv_(m, d, value=-step_size)
// The scalars are computed in double as Python does and rounded to the
// compute type once, as ATen does with a Python scalar operand. ATen's
// addcmul and lerp are compiled with FMA contraction (measured: they match
// the fused forms above bit for bit, and not the unfused ones), so this file
// uses std::fma where ATen fuses and is compiled with -ffp-contract=off so
// that the compiler fuses nothing else (p * decay + step would otherwise
// become one FMA, which torch rounds twice). The one known difference is
// sqrt: ATen's goes through MKL's VML (within 1 ulp), this one is correctly
// rounded. Half types are read and written in their own dtype and computed
// in float32 (torch rounds every intermediate to the half type instead).
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "adam_segments.h"
#include "ops.h"

namespace mindspeed_like {

namespace {

using npub::sdk::Call;
using npub::sdk::TensorRef;

// One parameter's tensors, and where its elements start in the flattened
// index space of the whole list (Note [One loop over all of a parameter list]).
struct Segment {
  void *p, *g, *m, *v, *vmax;  // vmax NULL unless amsgrad
  Storage storage;
  int64_t begin, numel;
};

template <typename T>
struct Hyper {
  T decay;       // 1 - lr * wd
  T lerp_coeff;  // 1 - b1, or (1 - b1) - 1 when it is not below 0.5 in magnitude
  bool lerp_small;
  T b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
  bool maximize;
};

template <typename T>
Hyper<T> make_hyper(int64_t step, double lr, double b1, double b2, double eps, double wd, bool maximize) {
  const double w = 1.0 - b1;
  const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(step)));
  const bool small = std::abs(static_cast<T>(w)) < T(0.5);
  return {static_cast<T>(1.0 - lr * wd),
          small ? static_cast<T>(w) : static_cast<T>(w) - T(1),
          small,
          static_cast<T>(b2),
          static_cast<T>(1.0 - b2),
          static_cast<T>(std::pow(1.0 - std::pow(b2, static_cast<double>(step)), 0.5)),
          static_cast<T>(eps),
          static_cast<T>(-step_size),
          maximize};
}

// Elements [b, e) of one segment (Note [AdamW's arithmetic follows
// torch.optim.AdamW]), compiled for each instruction-set level. The
// scalars are copied to locals and the pointers are restrict: a store
// through a float pointer could otherwise alias the Hyper struct, and the
// loop would not vectorise.
template <typename S, bool Amsgrad>
struct AdamElements {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const Segment& s, int64_t b, int64_t e,
                                        const Hyper<typename S::T>& hyper) {
    using T = typename S::T;
    using E = typename S::E;
    E* __restrict p = static_cast<E*>(s.p) + b;
    const E* __restrict gr = static_cast<const E*>(s.g) + b;
    E* __restrict m = static_cast<E*>(s.m) + b;
    E* __restrict v = static_cast<E*>(s.v) + b;
    E* __restrict vmax = Amsgrad ? static_cast<E*>(s.vmax) + b : nullptr;
    const T decay = hyper.decay, coeff = hyper.lerp_coeff, b2 = hyper.b2, one_minus_b2 = hyper.one_minus_b2;
    const T bc2_sqrt = hyper.bc2_sqrt, eps = hyper.eps, neg_step_size = hyper.neg_step_size;
    const bool small = hyper.lerp_small, maximize = hyper.maximize;
    const int64_t n = e - b;
    for (int64_t i = 0; i < n; ++i) {
      const T g0 = S::load(gr[i]);
      const T g = maximize ? -g0 : g0;
      const T pd = S::load(p[i]) * decay;
      const T m0 = S::load(m[i]);
      const T m1 = std::fma(coeff, g - m0, small ? m0 : g);
      const T v1 = std::fma(one_minus_b2 * g, g, S::load(v[i]) * b2);
      T vh = v1;
      if constexpr (Amsgrad) {
        const T mx = S::load(vmax[i]);
        vh = (mx != mx || mx > v1) ? mx : v1;  // torch.maximum: NaN wins
        vmax[i] = S::store(vh);
      }
      const T d = std::sqrt(vh) / bc2_sqrt + eps;
      p[i] = S::store(pd + (neg_step_size * m1) / d);
      m[i] = S::store(m1);
      v[i] = S::store(v1);
    }
  }
};

template <typename S>
void adam_segment(const Segment& s, int64_t b, int64_t e, bool amsgrad, const Hyper<typename S::T>& h) {
  // ATen's lerp and addcmul are fused multiply-adds; without the FMA
  // instruction std::fma is a library call per element: an AVX2 variant
  // (Note [One ISA layer for the in-tree plugins]).
  if (amsgrad)
    run_at_kernel_isa<AdamElements<S, true>, Isa::kAvx2>(s, b, e, h);
  else
    run_at_kernel_isa<AdamElements<S, false>, Isa::kAvx2>(s, b, e, h);
}

// The lists, checked (shared by the kernel and the meta function): every
// list as long as params, each tensor of params' i-th shape and dtype, a
// floating dtype, step >= 1.
struct AdamArgs {
  std::vector<TensorRef> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  int64_t step;
  bool amsgrad;
};

AdamArgs adam_args(Call& call) {
  AdamArgs a{call.tensor_list(0), call.tensor_list(1), call.tensor_list(2), call.tensor_list(3),
             call.tensor_list(4), call.int_arg(5),     call.bool_arg(11)};
  if (a.step < 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "step: expected a step count >= 1 but found " + std::to_string(a.step));
  check_adam_lists(call, a.params, "params", a.grads, a.exp_avgs, a.exp_avg_sqs, a.max_exp_avg_sqs,
                   a.amsgrad);
  return a;
}

// A meta call has no returns to declare: it checks the arguments, so that a
// traced call rejects what the kernel rejects.
void apply_adam_w_meta(Call& call) { adam_args(call); }

// mindspeed_like::npu_apply_adam_w(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs,
//   Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, int step, float lr, float beta1,
//   float beta2, float eps, float weight_decay, bool amsgrad, bool maximize) -> ()
void apply_adam_w(Call& call) {
  const AdamArgs a = adam_args(call);
  const double lr = call.double_arg(6), b1 = call.double_arg(7), b2 = call.double_arg(8);
  const double eps = call.double_arg(9), wd = call.double_arg(10);
  const bool maximize = call.bool_arg(12);
  const Hyper<float> hf = make_hyper<float>(a.step, lr, b1, b2, eps, wd, maximize);
  const Hyper<double> hd = make_hyper<double>(a.step, lr, b1, b2, eps, wd, maximize);

  std::vector<Segment> segs;
  int64_t total = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const int64_t numel = a.params[i].numel();
    if (numel == 0) continue;
    segs.push_back({a.params[i].data<void>(), a.grads[i].data<void>(), a.exp_avgs[i].data<void>(),
                    a.exp_avg_sqs[i].data<void>(), a.amsgrad ? a.max_exp_avg_sqs[i].data<void>() : nullptr,
                    adam_storage_of(call, a.params[i], "params"), total, numel});
    total += numel;
  }
  for_each_segment_range(call, segs, [&](const Segment& s, int64_t lo, int64_t hi) {
    with_storage(s.storage, [&](auto S) {
      using Elem = decltype(S);
      if constexpr (std::is_same_v<typename Elem::T, double>)
        adam_segment<Elem>(s, lo, hi, a.amsgrad, hd);
      else
        adam_segment<Elem>(s, lo, hi, a.amsgrad, hf);
    });
  });
}

}  // namespace

void register_adamw(npub::sdk::Registrar& r) {
  r.def(
      "mindspeed_like::npu_apply_adam_w(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
      "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, int step, float lr, float beta1, float beta2, "
      "float eps, float weight_decay, bool amsgrad, bool maximize) -> ()");
  // Each parameter may have its own floating dtype (one call serves a whole
  // param group); the body checks that its grad and states share it.
  r.kernel("mindspeed_like::npu_apply_adam_w", &apply_adam_w)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16, npub::sdk::kFloat64})
      .mixed_dtypes()
      .contiguous_only()
      .opt_level(2);
  r.meta<&apply_adam_w_meta>("mindspeed_like::npu_apply_adam_w");
}

}  // namespace mindspeed_like
