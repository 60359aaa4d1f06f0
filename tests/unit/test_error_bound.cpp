// The error model (dispatcher/include/npubridge/dispatcher/error_bound.h):
// ulps, each kind's bound, the derivation it reports, and the per-op terms.
#include <npubridge/dispatcher/error_bound.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/registry/schema.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace npub::numerics {
namespace {

Verdict judge(const ErrorModel& m, DType d, std::vector<double> got, std::vector<double> ref,
              int64_t terms = 0, std::vector<double> mag = {}, std::vector<double> host = {}) {
  Comparison c;
  c.got = got.data();
  c.reference = ref.data();
  c.magnitude = mag.empty() ? nullptr : mag.data();
  c.host = host.empty() ? nullptr : host.data();
  c.numel = static_cast<int64_t>(got.size());
  c.dtype = d;
  c.terms = terms;
  return compare(m, c);
}

TEST(ErrorBound, UlpsOfEachFloatingDtype) {
  EXPECT_EQ(ulp(DType::kFloat32, 1.0), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp(DType::kFloat32, 1.5), std::ldexp(1.0, -23));
  EXPECT_EQ(ulp(DType::kFloat16, 22.3), 1.0 / 64);  // [16, 32): 2^4 * 2^-10
  EXPECT_EQ(ulp(DType::kBFloat16, 1.0), 1.0 / 128);
  EXPECT_EQ(ulp(DType::kFloat64, 1.0), std::ldexp(1.0, -52));
  EXPECT_EQ(ulp(DType::kFloat16, 0.0), std::ldexp(1.0, -24));  // subnormal spacing
  EXPECT_EQ(unit_roundoff(DType::kFloat32), std::ldexp(1.0, -24));
  EXPECT_EQ(accumulate_dtype(DType::kBFloat16), DType::kFloat32);
  // The one table of significand bits (the PyTorch-side helpers read it too).
  EXPECT_EQ(precision_bits(DType::kFloat64), 53);
  EXPECT_EQ(precision_bits(DType::kFloat32), 24);
  EXPECT_EQ(precision_bits(DType::kFloat16), 11);
  EXPECT_EQ(precision_bits(DType::kBFloat16), 8);
  for (DType d : {DType::kInt64, DType::kInt32, DType::kUInt8, DType::kBool, DType::kUnknown})
    EXPECT_EQ(precision_bits(d), 0) << dtype_name(d);
}

TEST(ErrorBound, RoundedAllowsItsUlpsAndNoMore) {
  const ErrorModel& add = error_model("aten::add.out");
  ASSERT_EQ(add.kind, ErrorKind::kRounded);
  const double u = ulp(DType::kFloat16, 4.0);
  EXPECT_TRUE(judge(add, DType::kFloat16, {4.0 + 2 * u}, {4.0}).ok());
  const Verdict v = judge(add, DType::kFloat16, {4.0 + 4 * u}, {4.0});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.bound, 2 * u);
  EXPECT_NE(v.message().find("2 ulp of float16 at |4|"), std::string::npos) << v.message();
}

TEST(ErrorBound, AccumulatedBoundIsKTimesUTimesTheTerms) {
  const ErrorModel& mm = error_model("aten::mm.out");
  ASSERT_EQ(mm.kind, ErrorKind::kAccumulated);
  const double u = std::ldexp(1.0, -24), k = 100, m = 300;
  const double bound = k * u / (1 - k * u) * m + ulp(DType::kFloat32, 1.0);
  EXPECT_TRUE(judge(mm, DType::kFloat32, {1.0 + 0.99 * bound}, {1.0}, 100, {m}).ok());
  const Verdict v = judge(mm, DType::kFloat32, {1.0 + 1.01 * bound}, {1.0}, 100, {m});
  ASSERT_FALSE(v.ok());
  EXPECT_DOUBLE_EQ(v.bound, bound);
  EXPECT_NE(v.message().find("K = 100 terms, u = 2^-24 (float32 accumulation), m = 300"), std::string::npos)
      << v.message();
  // A half-type kernel is held to float32 accumulation too.
  EXPECT_FALSE(judge(mm, DType::kBFloat16, {1.0 + 4 * ulp(DType::kBFloat16, 1.0)}, {1.0}, 100, {m}).ok());
}

TEST(ErrorBound, ExactKindsAndIntegersAdmitNoDifference) {
  const ErrorModel& gather = error_model("aten::gather.out");
  EXPECT_FALSE(judge(gather, DType::kFloat32, {1.0 + ulp(DType::kFloat32, 1.0)}, {1.0}).ok());
  EXPECT_FALSE(judge(error_model("aten::mm.out"), DType::kInt64, {8}, {7}, 100, {1e9}).ok());
  EXPECT_TRUE(judge(gather, DType::kFloat32, {-0.0, 3}, {0.0, 3}).ok());
}

TEST(ErrorBound, NanInfAndOverflow) {
  const ErrorModel& add = error_model("aten::add.out");
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(judge(add, DType::kFloat32, {nan, inf, -inf}, {nan, inf, -inf}).ok());
  EXPECT_FALSE(judge(add, DType::kFloat32, {1.0}, {nan}).ok());
  EXPECT_FALSE(judge(add, DType::kFloat32, {nan}, {1.0}).ok());
  EXPECT_FALSE(judge(add, DType::kFloat32, {inf}, {-inf}).ok());
  // 70000 overflows float16: the kernel's inf is the rounded exact result.
  EXPECT_TRUE(judge(add, DType::kFloat16, {inf}, {70000.0}).ok());
  EXPECT_FALSE(judge(add, DType::kFloat16, {65504.0}, {70000.0}).ok());
}

TEST(ErrorBound, HostCalibratedAllowsFourTimesTheHostsOwnError) {
  const ErrorModel& custom = error_model("acme::unknown_op");
  ASSERT_EQ(custom.kind, ErrorKind::kHostCalibrated);
  EXPECT_FALSE(has_error_model("acme::unknown_op"));
  const double slack =
      6 * ulp(DType::kFloat32, 1.0);  // 4 ulp at the element, 2 at the largest value (both 1)
  EXPECT_TRUE(judge(custom, DType::kFloat32, {1.0 + 3.9e-6 + slack}, {1.0}, 0, {}, {1.0 + 1e-6}).ok());
  const Verdict v = judge(custom, DType::kFloat32, {1.0 + 4.2e-6 + slack}, {1.0}, 0, {}, {1.0 + 1e-6});
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.derivation.find("the host's own worst error against float64"), std::string::npos)
      << v.derivation;
}

TEST(ErrorBound, TermsComeFromTheCallsShapes) {
  const reg::Schema mm =
      reg::parse_schema("aten::mm.out(Tensor self, Tensor mat2, *, Tensor(a!) out) -> Tensor(a!)");
  int64_t a_shape[] = {5, 96}, b_shape[] = {96, 3}, o_shape[] = {5, 3};
  DLTensor a{}, b{}, o{};
  a.ndim = b.ndim = o.ndim = 2;
  a.shape = a_shape;
  b.shape = b_shape;
  o.shape = o_shape;
  NpubValue args[] = {tensor_value(&a), tensor_value(&b), tensor_value(&o)};
  EXPECT_EQ(terms(error_model("aten::mm.out"), mm, args, 3), 96);
  const reg::Schema sum = reg::parse_schema(
      "aten::sum.IntList_out(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None, "
      "Tensor(a!) out) -> Tensor(a!)");
  int64_t x_shape[] = {4, 5, 6};
  DLTensor x{};
  x.ndim = 3;
  x.shape = x_shape;
  std::vector<int64_t> dims = {0, -1};
  NpubValue sum_args[] = {tensor_value(&x), int_list_value(dims), bool_value(false), none_value(),
                          tensor_value(&o)};
  EXPECT_EQ(terms(error_model("aten::sum.IntList_out"), sum, sum_args, 5), 24);
  sum_args[1] = none_value();
  EXPECT_EQ(terms(error_model("aten::sum.IntList_out"), sum, sum_args, 5), 120);
}

}  // namespace
}  // namespace npub::numerics
