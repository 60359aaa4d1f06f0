// Dispatcher::plan and run (Note [One call plan per signature]): the same
// kernel, conversion, fallback and statistics as Dispatcher::call, without
// validation and selection per call.
#include "test_util.h"

#include <npubridge/support/error.h>

#include <string>
#include <vector>

using namespace npub;
using namespace npub::test;

namespace {

class ResolvedCallTest : public TestselAndCannLike {
 protected:
  const OpStatsSnapshot* stats_of(const std::string& op) {
    snapshot = rt->dispatcher().stats();
    for (const auto& s : snapshot)
      if (s.op == op) return &s;
    return nullptr;
  }
  std::vector<OpStatsSnapshot> snapshot;
};

TEST_F(ResolvedCallTest, ResolvesFromMetadataAndRunsTheSameKernelOnNewData) {
  Dispatcher& d = rt->dispatcher();
  const OpHandle op = d.op("aten::add.out");
  // Resolution sees metadata only: NULL data is fine.
  int64_t shape[] = {3};
  DLTensor meta{};
  meta.ndim = 1;
  meta.shape = shape;
  meta.dtype = to_dl(DType::kFloat32);
  meta.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), 0};
  // add.out is (self, other, *, alpha=1, out).
  NpubValue full_meta[] = {tensor_value(&meta), tensor_value(&meta), int_value(1), tensor_value(&meta)};
  const CallPlan rc = d.plan(op, full_meta, 4);
  ASSERT_NE(rc.kernel, nullptr);
  EXPECT_EQ(rc.plugin(), "cann_like");
  EXPECT_EQ(rc.convert_from, DType::kUnknown);
  EXPECT_EQ(rc.conversion(), "");
  EXPECT_EQ(rc.num_args, 4);
  for (int run = 0; run < 3; ++run) {  // new data every run
    Tensor a = Tensor::from_values({3}, DType::kFloat32, {1.0 + run, 2, 3}, dev);
    Tensor b = Tensor::from_values({3}, DType::kFloat32, {10, 20, 30.0 * run}, dev);
    Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
    NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl()), int_value(1), tensor_value(out.dl())};
    NpubValue rets[1] = {none_value()};
    d.run(rc, args, 4, rets, 1, nullptr);
    expect_values(out, {11.0 + run, 22, 3 + 30.0 * run});
    // The return that aliases out= is set, as call() sets it.
    ASSERT_EQ(rets[0].tag, NPUB_VALUE_TENSOR);
    EXPECT_EQ(rets[0].u.tensor, out.dl());
  }
  const OpStatsSnapshot* s = stats_of("aten::add.out");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->calls, 3);
  EXPECT_EQ(s->fallbacks, 0);
  EXPECT_TRUE(host.served.empty());
}

TEST_F(ResolvedCallTest, HalfTypeCallsAreConvertedAndDefaultsFilled) {
  Dispatcher& d = rt->dispatcher();
  Tensor x = Tensor::from_values({4}, DType::kFloat16, {1.5, -2, 3.25, 0}, dev);
  Tensor out = Tensor::empty({4}, DType::kFloat16, dev);
  const OpHandle twice = d.op("testsel::twice");
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  const CallPlan rc = d.plan(twice, args, 2);
  ASSERT_NE(rc.kernel, nullptr);
  EXPECT_EQ(rc.convert_from, DType::kFloat16);  // decided once: the float32 kernel
  EXPECT_EQ(rc.conversion(), "float16->float32");
  EXPECT_EQ(conversion_name(DType::kBFloat16, /*back=*/true), "float32->bfloat16");
  NpubValue rets[1] = {none_value()};
  d.run(rc, args, 2, rets, 1, nullptr);
  EXPECT_EQ(out.dtype(), DType::kFloat16);
  expect_values(out, {3, -4, 6.5, 0});
  EXPECT_EQ(stats_of("testsel::twice")->conversions, 1);
  // Trailing defaults omitted at plan() are filled by run().
  const OpHandle defaults = d.op("testsel::defaults");
  Tensor z = Tensor::from_values({2}, DType::kFloat32, {0, 0}, dev);
  Tensor zout = Tensor::empty({2}, DType::kFloat32, dev);
  NpubValue zargs[] = {tensor_value(z.dl()), tensor_value(zout.dl())};
  const CallPlan rcz = d.plan(defaults, zargs, 2);
  EXPECT_EQ(rcz.num_args, 6);
  EXPECT_EQ(rcz.filled.size(), 4u);
  d.run(rcz, zargs, 2, rets, 1, nullptr);
  expect_values(zout, {3 + 0.5 + 1 + 2 + 2, 3 + 0.5 + 1 + 2 + 2});  // as Dispatcher::call fills them
  std::vector<int64_t> c = {10, 20};
  NpubValue zargs4[] = {tensor_value(z.dl()), tensor_value(zout.dl()), int_value(1), double_value(0.25)};
  d.run(rcz, zargs4, 4, rets, 1, nullptr);  // the last default only
  expect_values(zout, {1 + 0.25 + 1 + 2 + 2, 1 + 0.25 + 1 + 2 + 2});
}

TEST_F(ResolvedCallTest, FallbackDeclineAndChangedSettings) {
  Dispatcher& d = rt->dispatcher();
  // No kernel takes int32: resolved to the fallback, with the reason.
  Tensor i = Tensor::from_values({3}, DType::kInt32, {1, 2, 3}, dev);
  Tensor iout = Tensor::empty({3}, DType::kInt32, dev);
  const OpHandle which = d.op("testsel::which");
  NpubValue iargs[] = {tensor_value(i.dl()), tensor_value(iout.dl())};
  const CallPlan rci = d.plan(which, iargs, 2);
  EXPECT_EQ(rci.kernel, nullptr);
  EXPECT_NE(rci.fallback_reason.find("no kernel accepts dtype int32"), std::string::npos)
      << rci.fallback_reason;
  NpubValue rets[1] = {none_value()};
  d.run(rci, iargs, 2, rets, 1, nullptr);
  EXPECT_EQ(host.served, std::vector<std::string>{"testsel::which"});
  EXPECT_EQ(stats_of("testsel::which")->fallbacks, 1);
  // A kernel that declines at run time hands the call to the fallback.
  Tensor x = Tensor::from_values({2}, DType::kFloat32, {1, 2}, dev);
  const OpHandle decline = d.op("testsel::decline");
  NpubValue dargs[] = {tensor_value(x.dl())};
  const CallPlan rcd = d.plan(decline, dargs, 1);
  ASSERT_NE(rcd.kernel, nullptr);
  TensorOutputs outs(rt->devices());
  NpubValue drets[1] = {none_value()};
  d.run(rcd, dargs, 1, drets, 1, &outs);
  expect_values(outs[0], {3, 6});
  EXPECT_EQ(host.served.size(), 2u);
  // Resolved under O2; at O0 the call takes the full path (the fallback).
  Tensor small = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, dev);
  Tensor sout = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue sargs[] = {tensor_value(small.dl()), tensor_value(sout.dl())};
  const CallPlan rcs = d.plan(which, sargs, 2);
  ASSERT_NE(rcs.kernel, nullptr);
  d.run(rcs, sargs, 2, rets, 1, nullptr);
  EXPECT_EQ(sout.to_doubles().at(0), 2);  // the priority-10 kernel
  d.set_opt_level(0);
  d.run(rcs, sargs, 2, rets, 1, nullptr);
  EXPECT_EQ(sout.to_doubles().at(0), -1);  // the host's implementation
  d.set_opt_level(2);
  // A wrong argument count is an error naming the op.
  EXPECT_NE(error_of([&] {
              d.run(rcs, sargs, 1, rets, 1, nullptr);
            }).find("op 'testsel::which': a call plan takes 2 arguments"),
            std::string::npos);
}

TEST_F(ResolvedCallTest, TheFallbackGetsTheReasonAndTheHostsCall) {
  Dispatcher& d = rt->dispatcher();
  Tensor i = Tensor::from_values({3}, DType::kInt32, {1, 2, 3}, dev);
  Tensor iout = Tensor::empty({3}, DType::kInt32, dev);
  const OpHandle which = d.op("testsel::which");
  NpubValue iargs[] = {tensor_value(i.dl()), tensor_value(iout.dl())};
  NpubValue rets[1] = {none_value()};
  int host_call = 0;  // what a host passes: its own view of the call
  d.call(which, iargs, 2, rets, 1, nullptr, &host_call);
  const CallPlan p = d.plan(which, iargs, 2);
  d.run(p, iargs, 2, rets, 1, nullptr, &host_call);
  ASSERT_EQ(host.served.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(host.host_calls[k], &host_call);
    EXPECT_NE(host.reasons[k].find("no kernel accepts dtype int32"), std::string::npos) << host.reasons[k];
  }
  expect_values(iout, {-1, -1, -1});
  // The dispatcher keeps the latest reason per op (npub-conformance reports
  // it for a sample the plugin did not serve), across reset_stats().
  d.reset_stats();
  const auto reasons = d.fallback_reasons();
  ASSERT_EQ(reasons.count("testsel::which"), 1u);
  EXPECT_EQ(reasons.at("testsel::which"), host.reasons[1]);
  EXPECT_EQ(reasons.count("aten::add.out"), 0u);
}

TEST_F(ResolvedCallTest, ACallPlanHoldsForCallsThatShareMemoryAsItsDid) {
  Dispatcher& d = rt->dispatcher();
  const OpHandle add = d.op("aten::add.out");
  Tensor a = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, dev);
  Tensor b = Tensor::from_values({3}, DType::kFloat32, {10, 20, 30}, dev);
  Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue separate[] = {tensor_value(a.dl()), tensor_value(b.dl()), int_value(1), tensor_value(out.dl())};
  const CallPlan p = d.plan(add, separate, 4, PlanInputs::kCall);
  EXPECT_EQ(p.inputs, PlanInputs::kCall);
  EXPECT_EQ(p.overlap, Overlap::kNone);
  ASSERT_NE(p.kernel, nullptr);
  NpubValue rets[1] = {none_value()};
  d.run(p, separate, 4, rets, 1, nullptr);
  expect_values(out, {11, 22, 33});
  // The same signature with out= the very same view as self: run() sees
  // other sharing and decides anew (an alias-safe kernel, or the fallback).
  NpubValue in_place[] = {tensor_value(a.dl()), tensor_value(b.dl()), int_value(1), tensor_value(a.dl())};
  d.run(p, in_place, 4, rets, 1, nullptr);
  expect_values(a, {11, 22, 33});
  const CallPlan q = d.plan(add, in_place, 4, PlanInputs::kCall);
  EXPECT_EQ(q.overlap, Overlap::kFull);
  d.run(q, separate, 4, rets, 1, nullptr);  // and back
  expect_values(out, {21, 42, 63});
  EXPECT_EQ(stats_of("aten::add.out")->calls, 3);
}

}  // namespace

// Note [A plan's returns are its kernel's]: a metadata plan says what its
// kernel returns, from the kernel's own meta function (the SDK's kernel
// body run on metadata), where the op has no meta function or another one.
TEST_F(ResolvedCallTest, AMetadataPlanSaysWhatItsKernelReturns) {
  Dispatcher& d = rt->dispatcher();
  const DLDevice npu{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), 0};
  auto meta = [&](std::vector<int64_t>& shape, DType t) {
    DLTensor m{};
    m.ndim = static_cast<int32_t>(shape.size());
    m.shape = shape.data();
    m.dtype = to_dl(t);
    m.device = npu;
    return m;
  };
  // LayerNorm in bfloat16: ATen's meta function says float32 for mean and
  // rstd; cann_like's kernel (as ATen's CPU kernel) returns bfloat16.
  std::vector<int64_t> xs = {4, 8}, ws = {8};
  DLTensor x = meta(xs, DType::kBFloat16), w = meta(ws, DType::kBFloat16);
  std::vector<int64_t> normalized = {8};
  NpubValue ln[] = {tensor_value(&x), int_list_value(normalized), tensor_value(&w), tensor_value(&w),
                    double_value(1e-5)};
  const CallPlan p = d.plan(d.op("aten::native_layer_norm"), ln, 5, PlanInputs::kMetadata, true);
  ASSERT_EQ(p.plugin(), "cann_like");
  ASSERT_EQ(p.returns.size(), 3u);
  const std::vector<std::vector<int64_t>> shapes = {{4, 8}, {4, 1}, {4, 1}};
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.returns[i].set) << "return " << i;
    EXPECT_EQ(p.returns[i].dtype, DType::kBFloat16) << "return " << i;
    EXPECT_EQ(p.returns[i].shape, shapes[i]) << "return " << i;
  }
  // A float16 call on a float32 kernel: the kernel sees float32, the call
  // gets its float32 returns back in float16 (as the staging converts them).
  std::vector<int64_t> hs = {5};
  DLTensor h = meta(hs, DType::kFloat16);
  NpubValue ha[] = {tensor_value(&h)};
  const CallPlan ph = d.plan(d.op("testsel::twice_fn"), ha, 1, PlanInputs::kMetadata, true);
  ASSERT_EQ(ph.convert_from, DType::kFloat16);
  ASSERT_EQ(ph.returns.size(), 1u);
  ASSERT_TRUE(ph.returns[0].set);
  EXPECT_EQ(ph.returns[0].dtype, DType::kFloat16);
  EXPECT_EQ(ph.returns[0].shape, hs);
  // A return whose shape depends on the data (the body reads the data
  // before declaring it): unset, as is every return of a fallback plan.
  std::vector<int64_t> fs = {6};
  DLTensor f = meta(fs, DType::kFloat32), i32 = meta(fs, DType::kInt32);
  NpubValue fa[] = {tensor_value(&f)};
  const CallPlan pp = d.plan(d.op("testsel::positives"), fa, 1, PlanInputs::kMetadata, true);
  ASSERT_NE(pp.kernel, nullptr);
  ASSERT_EQ(pp.returns.size(), 1u);
  EXPECT_FALSE(pp.returns[0].set);
  NpubValue ia[] = {tensor_value(&i32)};
  const CallPlan pf = d.plan(d.op("testsel::twice_fn"), ia, 1, PlanInputs::kMetadata, true);
  ASSERT_EQ(pf.kernel, nullptr);
  ASSERT_EQ(pf.returns.size(), 1u);
  EXPECT_FALSE(pf.returns[0].set);
  // A call's plan (kCall) leaves them to the call, and a plan not asked
  // for them (a program's) runs no meta function.
  Tensor real = Tensor::from_values({2}, DType::kFloat32, {1, -1}, dev);
  NpubValue ra[] = {tensor_value(real.dl())};
  EXPECT_TRUE(d.plan(d.op("testsel::twice_fn"), ra, 1, PlanInputs::kCall, true).returns.empty());
  EXPECT_TRUE(d.plan(d.op("testsel::twice_fn"), ha, 1).returns.empty());
}
