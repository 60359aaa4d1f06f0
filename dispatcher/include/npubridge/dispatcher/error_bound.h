// When does a kernel's result match? One answer for every checker:
// npub-conformance, the dispatcher's precision check and the PyTorch
// extension's OpInfo runner all compare through this header.
//
// See Note [The error model]. In short: a floating result is compared with a
// reference computed in float64 from the same inputs, and each element may
// differ from it by a bound derived from the computation: the final rounding
// to the output dtype, plus, for ops that sum K terms, the classic bound
// K * u * sum(|terms|) with u the unit roundoff of the dtype the kernel
// accumulates in. Integer and bool results, and ops that only move or select
// values, must be exact. The float64 reference does not depend on which
// CPU computes it, so these verdicts are the same on every machine; only
// ops without an entry (host-calibrated, below) lean on the host's own
// result in the op's dtype.
#pragma once

#include <npubridge/plugin_api.h>
#include <npubridge/support/dtype.h>

#include <cstdint>
#include <functional>
#include <string>

namespace npub::reg {
struct Schema;
}

namespace npub::numerics {

// Note [The error model]
// ~~~~~~~~~~~~~~~~~~~~~~
// Let y be the exact result of the op on the kernel's (already rounded)
// inputs, approximated by the reference run in float64, and d the output
// dtype with precision p bits (float32 24, float16 11, bfloat16 8,
// float64 53), unit roundoff u_d = 2^-p and ulp_d(y) the spacing of d's
// values at |y|. An element passes when |got - y| <= bound:
//
//   kExact        bound = 0 (NaN matches NaN, infinities match by sign).
//                 Copies, selection (max, sort, where, index), comparisons,
//                 rounding functions, every integer or bool result.
//   kSameDtype    the reference runs in the op's own dtype and
//                 bound = ulps * ulp_d(y): ops defined by a rounding in that
//                 dtype (floor division, remainder), where a float64
//                 reference alone would move a value across a
//                 discontinuity. The float64 result rounded to d is also
//                 accepted (whether a quotient is rounded to d before it is
//                 truncated differs between ATen's own paths).
//   kRounded      bound = ulps * ulp_d(y): elementwise ops computed in
//                 float32 (or better) and rounded once to d. 2 ulps unless
//                 the op's entry says otherwise (and why).
//   kAccumulated  bound = gamma_K * m + ulps * ulp_d(y), gamma_K =
//                 K u_a / (1 - K u_a), u_a the unit roundoff of the
//                 accumulating dtype (float32 for float32, float16 and
//                 bfloat16 kernels, float64 for float64; the output dtype's
//                 own for ops that add in place into their output), K the number of
//                 terms one output element sums (from the call's shapes),
//                 and m the magnitude of those terms:
//                   kAbsInputs  the op applied to |inputs| in float64, i.e.
//                               sum |a_k| |b_k| (mm, conv, sum, mean, ...);
//                   kResult     |y| (products, norms, softmax, whose terms
//                               share one sign);
//                   kScale      the largest |value| among the floating
//                               inputs and the reference result, for ops
//                               with subtraction inside (variance, layer
//                               and RMS norm, softmax gradients).
//                 gamma_K * m bounds the rounding error of any summation
//                 order (Higham, Accuracy and Stability of Numerical
//                 Algorithms, 2nd ed., sec. 3.1), so a kernel that blocks,
//                 splits or reorders a reduction passes on every CPU, while
//                 one that drops or doubles a term misses by about a term.
//   kHostCalibrated  for ops without an entry (a plugin's custom op, or
//                 PyTorch's composite ops in the OpInfo runner), whose
//                 reduction length is unknown: bound = 4 ulp_d(y) +
//                 2 ulp_d(max_j |y_j|) + 4 * max_j |host_j - y_j|: within
//                 four times the worst error the host framework's own
//                 result in dtype d shows against the float64 reference
//                 (tensor-wide: where a correct kernel's error peaks
//                 varies with its summation order), plus a few
//                 roundings at the element's and at the tensor's largest
//                 magnitude (a composite's intermediates are as large as
//                 its largest output).
// A result that overflows d matches an infinity of the same sign.

enum class ErrorKind { kExact, kSameDtype, kRounded, kAccumulated, kHostCalibrated };
enum class Magnitude { kAbsInputs, kResult, kScale };

// The arguments of one call, by schema name (shapes and scalars only).
class CallArgs {
 public:
  CallArgs(const reg::Schema& schema, const NpubValue* args, int32_t num_args)
      : schema_(schema), args_(args), num_args_(num_args) {}
  // The argument named `name` (NONE when absent or out of range).
  NpubValue get(const char* name) const;
  // Size of dimension `dim` (negative counts from the end) of tensor `name`;
  // 1 when the tensor is absent or has no such dimension.
  int64_t size(const char* name, int64_t dim) const;
  int64_t numel(const char* name) const;
  // Product of the sizes of `tensor` over the dimensions listed in the
  // int-list (or int) argument `dims`; every dimension when it is None or
  // empty.
  int64_t reduced(const char* tensor, const char* dims) const;
  // The largest numel among the tensors of a tensor-list argument (0 when absent).
  int64_t list_numel(const char* name) const;
  // Product of an int-list argument's values (1 when absent).
  int64_t product(const char* name) const;

 private:
  const reg::Schema& schema_;
  const NpubValue* args_;
  int32_t num_args_;
};

struct ErrorModel {
  ErrorKind kind = ErrorKind::kHostCalibrated;
  double ulps = 2;  // of the output dtype: the final rounding (and more where `why` says)
  // kAccumulated: the op accumulates in its output's dtype by definition (in
  // place into a half-type tensor, as ATen's index_put_ and scatter_add do),
  // so u is the output dtype's.
  bool accumulates_in_output = false;
  Magnitude magnitude = Magnitude::kScale;
  // kAccumulated: terms summed into one output element (0: the call is exact).
  std::function<int64_t(const CallArgs&)> terms;
  const char* why = "";  // the reason for a non-default entry, shown in reports
};

// Whether judging under `m` needs a float64 reference run, and a run on
// |inputs| for the magnitude of the terms.
inline bool needs_float64(const ErrorModel& m) { return m.kind != ErrorKind::kExact; }
inline bool needs_magnitude(const ErrorModel& m) {
  return m.kind == ErrorKind::kAccumulated && m.magnitude == Magnitude::kAbsInputs;
}

// The model of an op by its qualified name (kHostCalibrated when none).
const ErrorModel& error_model(const std::string& op);
// Whether `op` has an entry of its own.
bool has_error_model(const std::string& op);

// Significand bits of a floating dtype, the implicit one included (the p
// of Note [The error model]: float64 53, float32 24, float16 11, bfloat16
// 8); 0 for the other dtypes.
int precision_bits(DType d);
double unit_roundoff(DType d);
// The spacing of d's values at magnitude |x| (subnormal spacing below the
// smallest normal).
double ulp(DType d, double x);
// x rounded to nearest (ties to even) in d.
double round_to(DType d, double x);
// The dtype a kernel producing d accumulates in (float32 for half types).
DType accumulate_dtype(DType d);

// One output to judge. Arrays hold `numel` values in row-major order.
struct Comparison {
  const double* got = nullptr;
  const double* reference = nullptr;    // float64 (kSameDtype: the op's dtype)
  const double* magnitude = nullptr;    // kAccumulated + kAbsInputs: per element
  const double* host = nullptr;         // kHostCalibrated: the host's result in d
  const double* alternative = nullptr;  // kSameDtype: the float64 result, also accepted once rounded to d
  int64_t numel = 0;
  DType dtype = DType::kFloat32;  // of the output
  double scale = 0;               // kAccumulated + kScale
  int64_t terms = 0;              // kAccumulated: K
};

struct Verdict {
  int64_t numel = 0, mismatched = 0;
  int64_t worst_index = -1;  // the element furthest beyond its bound
  double got = 0, reference = 0, error = 0, bound = 0;
  std::string derivation;  // how that element's bound was derived
  bool ok() const { return mismatched == 0; }
  // "3 of 64 elements exceed their error bound; worst at flat index 5: got
  // ..., reference ... (error ..., bound ... = ...)"
  std::string message() const;
};

Verdict compare(const ErrorModel& model, const Comparison& c);

// K: the terms one output element of the call sums (kAccumulated), from the
// arguments' shapes and scalars (tensor data is not read).
int64_t terms(const ErrorModel& model, const reg::Schema& schema, const NpubValue* args, int32_t num_args);

// The largest finite |value| among the call's floating tensor arguments
// that it does not write (read through the copy engine): the inputs' part
// of Magnitude::kScale, to be taken before the kernel runs.
double input_scale(const reg::Schema& schema, const NpubValue* args, int32_t num_args);

}  // namespace npub::numerics
