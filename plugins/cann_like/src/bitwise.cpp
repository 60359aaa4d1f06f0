// Bitwise and/or/xor over bool and integer tensors (aten::bitwise_*.Tensor_out
// and .Scalar_out), with broadcasting and ATen's type promotion, and
// bitwise_not (`~`). HF models combine their boolean attention masks with `&`
// and invert them with `~` (TRL's chunked log-probabilities), so these keep
// mask building on the device (and capturable: a host fallback cannot be
// recorded).
#include "elementwise.h"
#include "ops.h"

#include <memory>
#include <string>
#include <type_traits>

namespace cann_like {

namespace {

enum class Bit { kAnd, kOr, kXor };

const char* bit_name(Bit op) {
  return op == Bit::kAnd ? "bitwise_and" : op == Bit::kOr ? "bitwise_or" : "bitwise_xor";
}

// (self, other: Tensor or Scalar, *, out)
template <Bit kOp>
void bitwise(Call& call) {
  TensorRef a = call.tensor(0), b, out = call.tensor(2);
  ResultType rt;
  rt.tensor(a);
  std::unique_ptr<ScalarTensor> scalar;
  const NpubValue& bv = call.arg(1);
  if (bv.tag == NPUB_VALUE_TENSOR) {
    b = call.tensor(1);
    rt.tensor(b);
  } else {
    scalar = std::make_unique<ScalarTensor>(bv);
    b = scalar->ref();
    rt.scalar_value(bv);
  }
  const DT common = rt.result();
  // ATen's message for a floating operand (the CPU kernel's dispatch name).
  if (!is_integral(common, true))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("\"") + bit_name(kOp) + "_cpu\" not implemented for '" + dt_name(common) + "'");
  check_out(call, out, broadcast(call, a.sizes(), b.sizes()));
  check_castable(call, common, out);
  Iter it = make_iter(out, {a, b});
  visit_compute(common, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      return;  // refused above
    } else {
      run_elementwise<T>(call, it, [](T x, T y) -> T {
        if constexpr (std::is_same_v<T, bool>) {
          if constexpr (kOp == Bit::kAnd) return x && y;
          if constexpr (kOp == Bit::kOr) return x || y;
          return x != y;
        } else {
          if constexpr (kOp == Bit::kAnd) return static_cast<T>(x & y);
          if constexpr (kOp == Bit::kOr) return static_cast<T>(x | y);
          return static_cast<T>(x ^ y);
        }
      });
    }
  });
}

// aten::bitwise_not.out(self, *, out): logical not for bool, ~x for integers.
void bitwise_not(Call& call) {
  const TensorRef self = call.tensor(0), out = call.tensor(1);
  const DT d = dt_of(self.dtype());
  if (!is_integral(d, true))
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("\"bitwise_not_cpu\" not implemented for '") + dt_name(d) + "'");
  if (dt_of(out.dtype()) != d)  // ATen's unary iterator: out of the input's dtype
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              std::string("out: expected dtype ") + dt_name(d) + " but found " + dt_name(dt_of(out.dtype())));
  check_out(call, out, self.sizes());
  Iter it = make_iter(out, {self});
  visit_compute(d, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      return;  // refused above
    } else if constexpr (std::is_same_v<T, bool>) {
      run_elementwise<T>(call, it, [](T x) -> T { return !x; });
    } else {
      run_elementwise<T>(call, it, [](T x) -> T { return static_cast<T>(~x); });
    }
  });
}

}  // namespace

void register_bitwise(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  const std::vector<DLDataType> integral{kInt64, kInt32, kInt16, kInt8, kUInt8, kBool};
  const char* names[] = {"bitwise_and", "bitwise_or", "bitwise_xor"};
  KernelBody fns[] = {&bitwise<Bit::kAnd>, &bitwise<Bit::kOr>, &bitwise<Bit::kXor>};
  for (int i = 0; i < 3; ++i) {
    const std::string n = std::string("aten::") + names[i];
    r.op((n + ".Tensor_out(Tensor self, Tensor other, *, Tensor(a!) out) -> Tensor(a!)").c_str(), fns[i])
        .dtypes(integral)
        .mixed_dtypes()
        .alias_safe();
    r.op((n + ".Scalar_out(Tensor self, Scalar other, *, Tensor(a!) out) -> Tensor(a!)").c_str(), fns[i])
        .dtypes(integral)
        .mixed_dtypes()
        .alias_safe();
  }
  r.op("aten::bitwise_not.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!)", &bitwise_not)
      .dtypes(integral)
      .mixed_dtypes()
      .alias_safe();
}

}  // namespace cann_like
