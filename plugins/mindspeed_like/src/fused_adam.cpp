// aten::_fused_adam_ and aten::_fused_adamw_ (both with a float lr and with
// the .tensor_lr overload): what torch.optim.Adam(fused=True) and
// AdamW(fused=True) call, the default optimizer of transformers' Trainer.
// One call updates a whole param group in place, with the segment loop of
// adam_segments.h.
//
// Note [The fused Adam's arithmetic follows ATen's fused CPU kernel]
// torch.optim's fused=True path on the CPU is ATen's FusedAdamKernel.cpp,
// whose arithmetic differs from the single-tensor path npu_apply_adam_w
// follows (Note [AdamW's arithmetic follows torch.optim.AdamW] in
// adamw.cpp): the scalars are rounded once to the compute type from double,
// and each element, in the compute type (float32 for the half types, as
// ATen's opmath), goes through
//   g = g / float(grad_scale), written back to grads  (when grad_scale is given)
//   g = -g                                            (maximize)
//   Adam:  g = fma(p, wd, g)        AdamW: p = p * (1 - lr*wd)   (when wd != 0)
//   m = |w| < 0.5 ? fma(w, g - m, m) : fma(w - 1, g - m, g),  w = 1 - b1
//   v = fma((1 - b2) * g, g, v * b2)
//   (amsgrad: vmax = maximum(vmax, v), NaN if either is; use vmax)
//   d = sqrt(v) / sqrt(1 - b2^step) + eps             (correctly rounded sqrt)
//   p = p + ((-lr / (1 - b1^step)) * m) / d
// with step = float(state_steps[i]) and the bias corrections in double. The
// half types store m, v, vmax and p rounded, but the update uses the
// unrounded float32 m and v, as ATen does. ATen writes its loop with
// Vectorized<T> operators, which GCC (PyTorch's compiler, -O2, FMA
// contraction on by default) fuses where a product has a single use in an
// addition in the same block: the lerp is an explicit fmadd; the second
// moment's v * b2 + (c * g) * g becomes fma(c * g, g, v * b2) (measured,
// as addcmul_ in adamw.cpp; but see the tail below); Adam's weight decay
// g + p * wd becomes fma(p, wd, g); AdamW's decay p * (1 - lr*wd) sits in
// a conditional block and stays a separate rounding. This file spells
// those FMAs out with std::fma and is compiled with -ffp-contract=off so
// that the compiler fuses nothing else. Measured against torch 2.13's
// _fused_adam(w)_ on an AVX-512 CPU (bench/fused_adam_bits.py, a
// measurement, not a test): params, moments and unscaled grads equal
// bit for bit over 10 steps for every flag combination and both lerp
// branches, in float32, float64, bfloat16 and float16, once the second
// moment of ATen's tail elements is rounded as Note [ATen's tail loop
// rounds the second moment its own way] says (without it, float32 differed
// in a few tail elements per tensor from the second step on). The other
// contraction, fma(v, b2, (c * g) * g) everywhere, differed in many of v's
// elements: GCC fused the other product. The equality is of ATen's AVX-512
// kernel; on a CPU where torch picks AVX2 the tail split differs (below)
// and a few tail elements round differently, within the error model the
// tests judge by. Without hardware FMA (the baseline ISA) std::fma is
// emulated in software: right, but slow.
#include <algorithm>
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

enum class Mode { kAdam, kAdamW };

// The scalars of one step in the compute type T, each rounded once from
// double as ATen's scalar_t(...) / opmath_t(...) does.
template <typename T>
struct FusedHyper {
  T grad_scale;  // float(grad_scale) in T; used only when scaled
  T wd;          // Adam: the L2 coefficient
  T decay;       // AdamW: 1 - lr * wd (1 when wd == 0)
  T lerp_coeff;  // w = 1 - b1, or w - 1 when |w| >= 0.5
  T b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
  bool lerp_small, maximize, weight_decay;
};

template <typename T>
FusedHyper<T> make_fused_hyper(double step, double lr, double b1, double b2, double wd, double eps,
                               float grad_scale, bool maximize) {
  const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
  const T w = static_cast<T>(1 - b1);
  const bool small = std::abs(w) < T(0.5);
  FusedHyper<T> h{};
  h.grad_scale = static_cast<T>(grad_scale);
  h.wd = static_cast<T>(wd);
  h.decay = wd != 0 ? static_cast<T>(1 - lr * wd) : T(1);
  h.lerp_coeff = small ? w : w - T(1);
  h.b2 = static_cast<T>(b2);
  h.one_minus_b2 = static_cast<T>(1 - b2);
  h.bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  h.eps = static_cast<T>(eps);
  h.neg_step_size = static_cast<T>(-(lr / bc1));
  h.lerp_small = small;
  h.maximize = maximize;
  h.weight_decay = wd != 0;
  return h;
}

// One parameter's tensors and its step's scalars in both compute types.
struct Segment {
  void *p, *g, *m, *v, *vmax;  // vmax NULL unless amsgrad
  Storage storage;
  int64_t begin, numel;
  int64_t tail_form_from;  // Note [ATen's tail loop rounds the second moment its own way]
  FusedHyper<float> hf;
  FusedHyper<double> hd;
};

template <typename T>
const FusedHyper<T>& hyper_of(const Segment& s) {
  if constexpr (std::is_same_v<T, double>)
    return s.hd;
  else
    return s.hf;
}

// Elements [b, e) of one segment (Note [The fused Adam's arithmetic follows
// ATen's fused CPU kernel]); scalars in locals and restrict pointers so that
// the loop vectorises (Note in adamw.cpp's AdamElements).
template <typename S, Mode M, bool Amsgrad, bool Scaled, bool TailForm>
struct FusedAdamElements {
  template <Isa>
  static PLUGIN_KERNELS_INLINE void run(const Segment& s, int64_t b, int64_t e) {
    using T = typename S::T;
    using E = typename S::E;
    const FusedHyper<T>& h = hyper_of<T>(s);
    E* __restrict p = static_cast<E*>(s.p) + b;
    E* __restrict gr = static_cast<E*>(s.g) + b;
    E* __restrict m = static_cast<E*>(s.m) + b;
    E* __restrict v = static_cast<E*>(s.v) + b;
    E* __restrict vmax = Amsgrad ? static_cast<E*>(s.vmax) + b : nullptr;
    const T scale = h.grad_scale, wd = h.wd, decay = h.decay, coeff = h.lerp_coeff, b2 = h.b2;
    const T one_minus_b2 = h.one_minus_b2, bc2_sqrt = h.bc2_sqrt, eps = h.eps,
            neg_step_size = h.neg_step_size;
    const bool small = h.lerp_small, maximize = h.maximize, weight_decay = h.weight_decay;
    const int64_t n = e - b;
    for (int64_t i = 0; i < n; ++i) {
      T g = S::load(gr[i]);
      if constexpr (Scaled) {
        g = g / scale;
        gr[i] = S::store(g);  // the unscaled gradient, as ATen leaves it
      }
      g = maximize ? -g : g;
      T p0 = S::load(p[i]);
      if constexpr (M == Mode::kAdam) {
        g = weight_decay ? std::fma(p0, wd, g) : g;
      } else {
        p0 = p0 * decay;  // decay is 1 without weight decay: p unchanged
      }
      const T m0 = S::load(m[i]);
      const T m1 = std::fma(coeff, g - m0, small ? m0 : g);
      const T v1 = TailForm ? std::fma(S::load(v[i]), b2, (one_minus_b2 * g) * g)
                            : std::fma(one_minus_b2 * g, g, S::load(v[i]) * b2);
      T vh = v1;
      if constexpr (Amsgrad) {
        const T mx = S::load(vmax[i]);
        vh = (mx != mx || v1 != v1) ? mx + v1 : (mx > v1 ? mx : v1);  // NaN if either is
        vmax[i] = S::store(vh);
      }
      const T d = std::sqrt(vh) / bc2_sqrt + eps;
      p[i] = S::store(p0 + (neg_step_size * m1) / d);
      m[i] = S::store(m1);
      v[i] = S::store(v1);
    }
  }
};

template <typename S, Mode M, bool Amsgrad, bool Scaled>
void fused_adam_variant(const Segment& s, int64_t b, int64_t e) {
  const int64_t cut = std::min(std::max(b, s.tail_form_from), e);
  // std::fma needs the FMA instruction: an AVX2 variant (Note [One ISA
  // layer for the in-tree plugins]).
  if (b < cut) run_at_kernel_isa<FusedAdamElements<S, M, Amsgrad, Scaled, false>, Isa::kAvx2>(s, b, cut);
  if (cut < e) run_at_kernel_isa<FusedAdamElements<S, M, Amsgrad, Scaled, true>, Isa::kAvx2>(s, cut, e);
}

// Note [ATen's tail loop rounds the second moment its own way]
// ATen's fused kernel runs each tensor in chunks of 64 bytes through
// Vectorized<T> (16 floats or 8 doubles on an AVX-512 CPU) and the last
// numel % 16 (float64: % 8) elements through a scalar loop, which GCC
// vectorises 8 (float64: 4) wide and finishes one element at a time. The
// scalar statements v = v * b2; v = v + (c * g) * g contract like the vector
// form, fma(c * g, g, v * b2), in the vectorised part, and as
// fma(v, b2, (c * g) * g) in the last numel % 8 (float64: % 4) elements
// (measured with torch 2.13: each form matches those elements bit for bit,
// the other does not). Those elements take the second form here; where they
// start depends on ATen's vector width, taken as AVX-512's, the width torch
// picks on this project's machines. The half types round the moments to 8
// or 11 bits, where the two forms did not differ in the measurement.
int64_t tail_form_from(Storage storage, int64_t numel) {
  if (storage == Storage::kFloat32) return numel - numel % 8;
  if (storage == Storage::kFloat64) return numel - numel % 4;
  return numel;
}

template <typename S, Mode M>
void fused_adam_segment(const Segment& s, int64_t b, int64_t e, bool amsgrad, bool scaled) {
  if (amsgrad)
    scaled ? fused_adam_variant<S, M, true, true>(s, b, e) : fused_adam_variant<S, M, true, false>(s, b, e);
  else
    scaled ? fused_adam_variant<S, M, false, true>(s, b, e) : fused_adam_variant<S, M, false, false>(s, b, e);
}

// The schema's argument positions (both overloads).
enum Arg {
  kParams = 0,
  kGrads,
  kExpAvgs,
  kExpAvgSqs,
  kMaxExpAvgSqs,
  kStateSteps,
  kLr,
  kBeta1,
  kBeta2,
  kWeightDecay,
  kEps,
  kAmsgrad,
  kMaximize,
  kGradScale,
  kFoundInf
};

// A one-element tensor argument's value as a double (the step, the lr, the
// grad_scale, found_inf), of a dtype check_one_element accepted.
double scalar_value(const TensorRef& t) {
  if (t.is(npub::sdk::kFloat32)) return *t.data<float>();
  if (t.is(npub::sdk::kFloat64)) return *t.data<double>();
  if (t.is(npub::sdk::kFloat16)) return npub::sdk::half_to_float(*t.data<uint16_t>());
  if (t.is(npub::sdk::kBFloat16)) return npub::sdk::bf16_to_float(*t.data<uint16_t>());
  if (t.is(npub::sdk::kInt64)) return static_cast<double>(*t.data<int64_t>());
  return *t.data<int32_t>();
}

void check_one_element(const Call& call, const TensorRef& t, const std::string& name, bool float32_only) {
  if (t.numel() != 1)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              name + ": expected a one-element tensor but found one of shape " + Call::shape_str(t.sizes()));
  const bool ok =
      float32_only ? t.is(npub::sdk::kFloat32)
                   : (t.is(npub::sdk::kFloat32) || t.is(npub::sdk::kFloat64) || t.is(npub::sdk::kFloat16) ||
                      t.is(npub::sdk::kBFloat16) || t.is(npub::sdk::kInt64) || t.is(npub::sdk::kInt32));
  if (!ok)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              name + ": expected " + (float32_only ? "dtype float32" : "a floating or integer dtype") +
                  " but found " + npub::sdk::dtype_name(t.dtype()));
}

struct FusedArgs {
  std::vector<TensorRef> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps;
  TensorRef lr_tensor, grad_scale, found_inf;  // undefined when a float lr / None
  bool amsgrad;
};

// The arguments, checked (kernel and meta function): ATen's list-length
// rules (max_exp_avg_sqs empty unless amsgrad) plus what ATen's CPU kernel
// assumes without checking (each tensor of its parameter's shape and dtype).
FusedArgs fused_args(Call& call, bool tensor_lr) {
  FusedArgs a{call.tensor_list(kParams),
              call.tensor_list(kGrads),
              call.tensor_list(kExpAvgs),
              call.tensor_list(kExpAvgSqs),
              call.tensor_list(kMaxExpAvgSqs),
              call.tensor_list(kStateSteps),
              tensor_lr ? call.tensor(kLr) : TensorRef(),
              call.optional_tensor(kGradScale),
              call.optional_tensor(kFoundInf),
              call.bool_arg(kAmsgrad)};
  const size_t n = a.params.size();
  check_adam_lists(call, a.params, "self", a.grads, a.exp_avgs, a.exp_avg_sqs, a.max_exp_avg_sqs, a.amsgrad);
  if (!a.amsgrad && !a.max_exp_avg_sqs.empty())
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "max_exp_avg_sqs: expected an empty list since amsgrad is not set but found " +
                  std::to_string(a.max_exp_avg_sqs.size()) + " tensors");
  if (a.state_steps.size() != n)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "state_steps: expected as many tensors as self (" +
                                             std::to_string(n) + ") but found " +
                                             std::to_string(a.state_steps.size()));
  for (size_t i = 0; i < n; ++i)
    check_one_element(call, a.state_steps[i], "state_steps[" + std::to_string(i) + "]", false);
  if (tensor_lr) check_one_element(call, a.lr_tensor, "lr", false);
  if (a.grad_scale.defined()) check_one_element(call, a.grad_scale, "grad_scale", true);
  if (a.found_inf.defined()) check_one_element(call, a.found_inf, "found_inf", true);
  return a;
}

template <Mode M, bool TensorLr>
void fused_adam_meta(Call& call) {
  fused_args(call, TensorLr);
}

template <Mode M, bool TensorLr>
void fused_adam(Call& call) {
  const FusedArgs a = fused_args(call, TensorLr);
  // ATen: a step whose gradients overflowed (found_inf == 1) changes nothing.
  // ATen returns before checking the lists; the checks come first here, so
  // that bad input fails the same way whatever found_inf holds (and the meta
  // function, which cannot read it, agrees with the kernel).
  if (a.found_inf.defined() && *a.found_inf.data<float>() == 1.0f) return;
  const double lr = TensorLr ? scalar_value(a.lr_tensor) : call.double_arg(kLr);
  const double b1 = call.double_arg(kBeta1), b2 = call.double_arg(kBeta2);
  const double wd = call.double_arg(kWeightDecay), eps = call.double_arg(kEps);
  const bool maximize = call.bool_arg(kMaximize);
  const bool scaled = a.grad_scale.defined();
  const float grad_scale = scaled ? *a.grad_scale.data<float>() : 1.0f;

  std::vector<Segment> segs;
  int64_t total = 0;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const int64_t numel = a.params[i].numel();
    if (numel == 0) continue;
    // ATen reads the step as a float (state_step.item<float>()).
    const double step = static_cast<float>(scalar_value(a.state_steps[i]));
    segs.push_back({a.params[i].data<void>(), a.grads[i].data<void>(), a.exp_avgs[i].data<void>(),
                    a.exp_avg_sqs[i].data<void>(), a.amsgrad ? a.max_exp_avg_sqs[i].data<void>() : nullptr,
                    adam_storage_of(call, a.params[i], "self"), total, numel,
                    tail_form_from(adam_storage_of(call, a.params[i], "self"), numel),
                    make_fused_hyper<float>(step, lr, b1, b2, wd, eps, grad_scale, maximize),
                    make_fused_hyper<double>(step, lr, b1, b2, wd, eps, grad_scale, maximize)});
    total += numel;
  }
  for_each_segment_range(call, segs, [&](const Segment& s, int64_t lo, int64_t hi) {
    with_storage(s.storage,
                 [&](auto elem) { fused_adam_segment<decltype(elem), M>(s, lo, hi, a.amsgrad, scaled); });
  });
}

constexpr const char* kListArgs =
    "(Tensor(a!)[] self, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, "
    "Tensor(e!)[] max_exp_avg_sqs, Tensor[] state_steps, *, ";
constexpr const char* kTail =
    "float beta1, float beta2, float weight_decay, float eps, bool amsgrad, bool maximize, "
    "Tensor? grad_scale=None, Tensor? found_inf=None) -> ()";

template <Mode M, bool TensorLr>
void register_one(npub::sdk::Registrar& r, const std::string& name) {
  const std::string op = std::string("aten::") + name + (TensorLr ? ".tensor_lr" : "");
  r.def((op + kListArgs + (TensorLr ? "Tensor lr, " : "float lr, ") + kTail).c_str());
  // Each parameter may have its own floating dtype (one call serves a whole
  // param group, as ATen's does); the body checks that its grad and states
  // share it, and the steps, lr, grad_scale and found_inf dtypes.
  r.kernel(op, &fused_adam<M, TensorLr>)
      .dtypes({npub::sdk::kFloat32, npub::sdk::kFloat16, npub::sdk::kBFloat16, npub::sdk::kFloat64})
      .mixed_dtypes()
      .contiguous_only()
      .opt_level(2);
  r.meta<&fused_adam_meta<M, TensorLr>>(op.c_str());
}

}  // namespace

void register_fused_adam(npub::sdk::Registrar& r) {
  register_one<Mode::kAdam, false>(r, "_fused_adam_");
  register_one<Mode::kAdam, true>(r, "_fused_adam_");
  register_one<Mode::kAdamW, false>(r, "_fused_adamw_");
  register_one<Mode::kAdamW, true>(r, "_fused_adamw_");
}

}  // namespace mindspeed_like
