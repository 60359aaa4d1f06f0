// Kernel selection, validation, conversion, staging, fallback, precision
// check, statistics and the op-mapping table.
#include "test_util.h"

#include <npubridge/support/error.h>

#include <algorithm>
#include <map>
#include <string>

using namespace npub;
using namespace npub::test;

namespace {

class DispatcherTest : public TestselAndCannLike {
 protected:
  // Calls testsel::which and returns the id the serving kernel wrote.
  double which(const Tensor& x) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
    NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("testsel::which", args, 2, rets, 1, nullptr);
    return out.to_doubles().at(0);
  }
};

TEST_F(DispatcherTest, SelectsByPriorityPredicateDtypeAndOptLevel) {
  Tensor small = f32({3}, {1, 2, 3});
  Tensor big = f32({10}, std::vector<double>(10, 1));
  EXPECT_EQ(which(small), 2);  // priority 10, predicate accepts numel <= 4
  EXPECT_EQ(which(big), 1);    // predicate declines; priority-5 kernel needs O3
  rt->dispatcher().set_opt_level(3);
  EXPECT_EQ(which(big), 3);
  EXPECT_EQ(which(small), 2);
  rt->dispatcher().set_opt_level(2);
  Tensor f64 = Tensor::from_values({10}, DType::kFloat64, std::vector<double>(10, 1), dev);
  EXPECT_EQ(which(f64), 1);  // only kernel A takes float64
  Tensor i32 = Tensor::from_values({3}, DType::kInt32, {1, 2, 3}, dev);
  EXPECT_EQ(which(i32), -1);          // no kernel: the host's implementation
  rt->dispatcher().set_opt_level(0);  // O0: every plugin off
  EXPECT_EQ(which(small), -1);
  rt->dispatcher().set_opt_level(2);
  rt->loader().plugin("testsel")->enabled = false;
  EXPECT_EQ(which(small), -1);
  rt->loader().plugin("testsel")->enabled = true;
  EXPECT_EQ(which(small), 2);
  Tensor small_out = Tensor::empty({3}, DType::kFloat32, dev);
  const reg::Kernel* k = rt->dispatcher().select(
      rt->dispatcher().op("testsel::which"),
      std::vector<NpubValue>{tensor_value(small.dl()), tensor_value(small_out.dl())}.data(), 2);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->priority, 10);
  EXPECT_EQ(host.served.size(), 3u);
}

TEST_F(DispatcherTest, ValidationErrorsNameOpArgumentExpectedAndFound) {
  Dispatcher& d = rt->dispatcher();
  Tensor a = f32({3}, {1, 2, 3});
  Tensor b = f32({3}, {1, 2, 3});
  Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue rets[1] = {};
  {  // wrong kind
    NpubValue args[] = {tensor_value(a.dl()), int_value(3), int_value(1), tensor_value(out.dl())};
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'other' (1): expected Tensor but found int");
  }
  {  // too few
    NpubValue args[] = {tensor_value(a.dl())};
    EXPECT_NE(error_of([&] {
                d.call("aten::add.out", args, 1, rets, 1, nullptr);
              }).find("op 'aten::add.out': expected 4 arguments but found 1"),
              std::string::npos);
  }
  {  // devices differ
    Tensor other = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, &rt->devices().at(1));
    NpubValue args[] = {tensor_value(a.dl()), tensor_value(other.dl()), int_value(1), tensor_value(out.dl())};
    EXPECT_EQ(
        error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
        "Expected all tensors to be on the same device, but found at least two devices, npu:0 and npu:1 "
        "(op 'aten::add.out', argument 'other')");
  }
  {  // negative size, NULL tensor, unknown dtype, device out of range
    DLTensor bad = *a.dl();
    int64_t neg[1] = {-2};
    bad.shape = neg;
    NpubValue args[] = {tensor_value(&bad), tensor_value(b.dl()), int_value(1), tensor_value(out.dl())};
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): expected non-negative sizes but found -2 at dim 0");
    args[0] = tensor_value(nullptr);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): expected a tensor but found a NULL DLTensor pointer");
    DLTensor weird = *a.dl();
    weird.dtype = DLDataType{kDLComplex, 64, 1};
    args[0] = tensor_value(&weird);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): unsupported dtype dtype(code=5, bits=64, lanes=1)");
    DLTensor far = *a.dl();
    far.device.device_id = 7;
    args[0] = tensor_value(&far);
    EXPECT_EQ(
        error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
        "op 'aten::add.out', argument 'self' (0): tensor is on npu:7, which does not exist (2 devices)");
    int64_t huge[3] = {1ll << 40, 1ll << 40, 1ll << 40};
    DLTensor big = *a.dl();
    big.ndim = 3;
    big.shape = huge;
    big.strides = nullptr;
    args[0] = tensor_value(&big);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): element count overflows int64");
    // Every field a host can get wrong: NULL shape, ndim out of range,
    // NULL data with elements, vector lanes.
    DLTensor no_shape = *a.dl();
    no_shape.shape = nullptr;
    args[0] = tensor_value(&no_shape);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): tensor has ndim > 0 but a NULL shape");
    for (int32_t ndim : {-1, 65, 1 << 30}) {
      DLTensor odd = *a.dl();
      odd.ndim = ndim;
      args[0] = tensor_value(&odd);
      EXPECT_EQ(
          error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
          "op 'aten::add.out', argument 'self' (0): expected a tensor with 0 to 64 dimensions but found "
          "ndim " +
              std::to_string(ndim));
    }
    DLTensor no_data = *a.dl();
    no_data.data = nullptr;
    args[0] = tensor_value(&no_data);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): tensor has elements but a NULL data pointer");
    DLTensor lanes = *a.dl();
    lanes.dtype.lanes = 4;
    args[0] = tensor_value(&lanes);
    EXPECT_EQ(error_of([&] { d.call("aten::add.out", args, 4, rets, 1, nullptr); }),
              "op 'aten::add.out', argument 'self' (0): unsupported dtype dtype(code=2, bits=32, lanes=4)");
  }
  // A kernel's own bound check surfaces with op and plugin.
  NpubValue args[] = {tensor_value(a.dl()), int_value(5)};
  TensorOutputs outs(rt->devices());
  EXPECT_EQ(
      error_of([&] { d.call("testsel::bad_index", args, 2, rets, 1, &outs); }),
      "op 'testsel::bad_index' failed in the kernel of plugin 'testsel': testsel::bad_index: index 5 is "
      "out of bounds for a tensor of 3 elements");
  EXPECT_EQ(error_of([&] { d.call("nope::op", args, 2, rets, 1, &outs); }),
            "unknown op 'nope::op': no plugin defines it and the op-mapping table does not map it");
  // Shape mismatch in a plugin kernel (cann_like broadcasting rule).
  Tensor c = f32({2}, {1, 2});
  NpubValue add_args[] = {tensor_value(a.dl()), tensor_value(c.dl()), int_value(1), tensor_value(out.dl())};
  EXPECT_NE(
      error_of([&] {
        d.call("aten::add.out", add_args, 4, rets, 1, nullptr);
      }).find("the size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 0"),
      std::string::npos);
}

TEST_F(DispatcherTest, TrailingDefaultsAreFilledFromTheSchema) {
  Tensor x = f32({2}, {0, 0});
  Tensor out = Tensor::empty({2}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testsel::defaults", args, 2, rets, 1, nullptr);
  expect_values(out, {3 + 0.5 + 1 + 2 + 2, 3 + 0.5 + 1 + 2 + 2});
  std::vector<int64_t> c = {10, 20};
  NpubValue args2[] = {tensor_value(x.dl()), tensor_value(out.dl()), int_value(1), double_value(0.25),
                       int_list_value(c)};
  rt->dispatcher().call("testsel::defaults", args2, 5, rets, 1, nullptr);
  expect_values(out, {1 + 0.25 + 30 + 2, 1 + 0.25 + 30 + 2});
}

TEST_F(DispatcherTest, HalfPrecisionRunsOnFloat32KernelAndCastsBack) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    Tensor x = Tensor::from_values({4}, t, {1.5, -2, 3.25, 0}, dev);
    Tensor out = Tensor::empty({4}, t, dev);
    NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("testsel::twice", args, 2, rets, 1, nullptr);
    EXPECT_EQ(out.dtype(), t);
    expect_values(out, {3, -4, 6.5, 0});
    // Kernel-allocated output comes back in the call's dtype.
    TensorOutputs outs(rt->devices());
    NpubValue fargs[] = {tensor_value(x.dl())};
    NpubValue frets[1] = {};
    rt->dispatcher().call("testsel::twice_fn", fargs, 1, frets, 1, &outs);
    EXPECT_EQ(dtype_of(frets[0].u.tensor->dtype), t);
    expect_values(outs[0], {3, -4, 6.5, 0});
  }
  EXPECT_TRUE(host.served.empty());
  // With conversion off, the same call falls back.
  rt->dispatcher().set_dtype_conversion(false);
  Tensor x = Tensor::from_values({2}, DType::kBFloat16, {1, 2}, dev);
  Tensor out = Tensor::empty({2}, DType::kBFloat16, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testsel::twice", args, 2, rets, 1, nullptr);
  expect_values(out, {2, 4});
  EXPECT_EQ(host.served, std::vector<std::string>{"testsel::twice"});
  bool found = false;
  for (const auto& s : rt->dispatcher().stats())
    if (s.op == "testsel::twice") {
      EXPECT_EQ(s.conversions, 2);
      EXPECT_EQ(s.fallbacks, 1);
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST_F(DispatcherTest, ContiguousOnlyKernelsGetStridedTensorsStaged) {
  // x is the transpose of a 2x3 tensor: logical [[1,4],[2,5],[3,6]].
  Tensor base = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor xt = base.as_strided({3, 2}, {1, 3}, 0);
  ASSERT_FALSE(xt.is_contiguous());
  Tensor out = Tensor::empty({3, 2}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(xt.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testsel::flat_copy", args, 2, rets, 1, nullptr);
  expect_values(out, {1, 4, 2, 5, 3, 6});
  EXPECT_EQ(rets[0].u.tensor, out.dl());
  // A strided output is written back through its strides.
  Tensor target = Tensor::from_values({2, 3}, DType::kFloat32, std::vector<double>(6, 0), dev);
  Tensor target_t = target.as_strided({3, 2}, {1, 3}, 0);
  Tensor src = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  NpubValue args2[] = {tensor_value(src.dl()), tensor_value(target_t.dl())};
  rt->dispatcher().call("testsel::flat_copy", args2, 2, rets, 1, nullptr);
  expect_values(target, {1, 3, 5, 2, 4, 6});
}

TEST_F(DispatcherTest, WorkspaceScratchAndDataDependentOutputs) {
  Tensor x = f32({4}, {1, -2, 3, 0});
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  const int64_t before = dev->allocator().stats().allocated_bytes;
  rt->dispatcher().call("testsel::with_workspace", args, 1, rets, 1, &outs);
  expect_values(outs[0], {20, -10, 40, 10});
  TensorOutputs pos(rt->devices());
  NpubValue prets[1] = {};
  rt->dispatcher().call("testsel::positives", args, 1, prets, 1, &pos);
  EXPECT_EQ(pos[0].shape(), std::vector<int64_t>{2});
  EXPECT_EQ(pos[0].dtype(), DType::kInt64);
  expect_values(pos[0], {0, 2});
  // Workspace and scratch were returned; only the two outputs remain.
  EXPECT_EQ(dev->allocator().stats().allocated_bytes - before, 512 + 512);
}

TEST_F(DispatcherTest, FallbackWarnsOnceCountsAndCanBeAnError) {
  Tensor x = Tensor::from_values({2}, DType::kInt32, {1, 2}, dev);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(which(x), -1);
  EXPECT_EQ(rt->dispatcher().total_fallbacks(), 3);
  EXPECT_TRUE(rt->dispatcher().registry().find("testsel::which")->stats().fallback_warned.load());
  rt->dispatcher().set_fallback_mode(FallbackMode::kError);
  EXPECT_EQ(error_of([&] { which(x); }),
            "op 'testsel::which' is not supported on npu:0: no kernel accepts dtype int32 (plugin 'testsel': "
            "{float32} with a predicate; plugin 'testsel': {float32} needs O3; plugin 'testsel': {float32, "
            "float64}); falling back to the host framework is disabled (NPUB_FALLBACK=error)");
  rt->dispatcher().set_fallback_mode(FallbackMode::kAllow);
  rt->dispatcher().set_fallback(nullptr);
  EXPECT_NE(error_of([&] { which(x); }).find("and the host registered no fallback"), std::string::npos);
}

TEST_F(DispatcherTest, DecliningKernelHandsTheCallToTheFallback) {
  Tensor x = f32({2}, {1, 2});
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testsel::decline", args, 1, rets, 1, &outs);
  expect_values(outs[0], {3, 6});
  EXPECT_EQ(host.served, std::vector<std::string>{"testsel::decline"});
}

// Note [A decline falls back on every path]: converted (bfloat16 on the
// float32 kernel), staged (a strided tensor for a contiguous-only kernel),
// and with more than 8 returns.
TEST_F(DispatcherTest, DecliningFallsBackOnEveryPath) {
  sim::Device* dev = &rt->devices().at(0);
  {
    Tensor x = Tensor::from_values({2}, DType::kBFloat16, {1, 2}, dev);
    TensorOutputs outs(rt->devices());
    NpubValue args[] = {tensor_value(x.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("testsel::decline", args, 1, rets, 1, &outs);
    EXPECT_EQ(dtype_of(outs[0].dl()->dtype), DType::kBFloat16);
    expect_values(outs[0], {3, 6});
  }
  {
    Tensor base = f32({2, 2}, {1, 2, 3, 4});
    Tensor xt = base.as_strided({2, 2}, {1, 2}, 0);  // the transpose: [[1, 3], [2, 4]]
    TensorOutputs outs(rt->devices());
    NpubValue args[] = {tensor_value(xt.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call("testsel::decline", args, 1, rets, 1, &outs);
    expect_values(outs[0], {3, 9, 6, 12});
  }
  {
    Tensor x = f32({2}, {1, 2});
    TensorOutputs outs(rt->devices());
    NpubValue args[] = {tensor_value(x.dl())};
    NpubValue rets[9] = {};
    rt->dispatcher().call("testsel::decline_many", args, 1, rets, 9, &outs);
    for (int i = 0; i < 9; ++i) expect_values(outs[static_cast<size_t>(i)], {1.0 * (i + 1), 2.0 * (i + 1)});
  }
  EXPECT_EQ(host.served,
            (std::vector<std::string>{"testsel::decline", "testsel::decline", "testsel::decline_many"}));
}

TEST_F(DispatcherTest, PrecisionCheckReportsTheWorstElement) {
  PrecisionCheckConfig cfg;
  cfg.enabled = true;
  rt->dispatcher().set_precision_check(cfg);
  Tensor x = f32({4}, {1, 2, 3, 4});
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testsel::sloppy", args, 1, rets, 1, &outs);
  auto mismatches = rt->dispatcher().precision_mismatches();
  ASSERT_EQ(mismatches.size(), 1u);
  EXPECT_EQ(mismatches[0].op, "testsel::sloppy");
  EXPECT_EQ(mismatches[0].output, "return 0");
  EXPECT_EQ(mismatches[0].worst_index, 2);
  EXPECT_EQ(mismatches[0].num_mismatched, 1);
  EXPECT_NEAR(mismatches[0].abs_error, 1e-3, 1e-6);
  EXPECT_NE(mismatches[0].message().find(
                "precision check failed for op 'testsel::sloppy' (plugin 'testsel'), return 0"),
            std::string::npos);
  // An accurate kernel (cann_like add, in place on `out`) passes, and the
  // check leaves the kernel's result in place.
  rt->dispatcher().clear_precision_mismatches();
  Tensor y = f32({4}, {0.5, 0.25, 0.125, 1});
  Tensor out = Tensor::empty({4}, DType::kFloat32, dev);
  NpubValue add_args[] = {tensor_value(x.dl()), tensor_value(y.dl()), double_value(2),
                          tensor_value(out.dl())};
  rt->dispatcher().call("aten::add.out", add_args, 4, rets, 1, nullptr);
  EXPECT_TRUE(rt->dispatcher().precision_mismatches().empty());
  expect_values(out, {2, 2.5, 3.25, 6});
  // raise_on_mismatch turns the report into an error.
  cfg.raise_on_mismatch = true;
  rt->dispatcher().set_precision_check(cfg);
  EXPECT_NE(error_of([&] {
              rt->dispatcher().call("testsel::sloppy", args, 1, rets, 1, &outs);
            }).find("worst at flat index 2"),
            std::string::npos);
}

// An op the host cannot run as a reference (the reference host has no
// aten::neg.out, as PyTorch has no kernel for a plugin's own op): the
// kernel's result stands, the call does not fail, and the op is marked as
// warned once.
TEST_F(DispatcherTest, PrecisionCheckLeavesAnOpWithoutReferenceUnjudged) {
  PrecisionCheckConfig cfg;
  cfg.enabled = true;
  cfg.raise_on_mismatch = true;
  rt->dispatcher().set_precision_check(cfg);
  Tensor x = f32({3}, {1, -2, 0.5});
  Tensor out = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  const reg::OpEntry* neg = rt->registry().find("aten::neg.out");
  ASSERT_NE(neg, nullptr);
  for (int i = 0; i < 2; ++i) {
    rt->dispatcher().call("aten::neg.out", args, 2, rets, 1, nullptr);
    expect_values(out, {-1, 2, -0.5});
  }
  EXPECT_TRUE(rt->dispatcher().precision_mismatches().empty());
  EXPECT_TRUE(neg->stats().unjudged_warned.load());
  EXPECT_EQ(neg->stats().precision_mismatches.load(), 0);
  // The reference was asked each time, as the dispatcher's own call.
  EXPECT_EQ(host.served, (std::vector<std::string>{"aten::neg.out", "aten::neg.out"}));
  EXPECT_EQ(host.host_calls, (std::vector<void*>{nullptr, nullptr}));
  EXPECT_EQ(neg->stats().fallbacks.load(), 0);
  cfg.enabled = false;
  rt->dispatcher().set_precision_check(cfg);
}

TEST_F(DispatcherTest, OpMappingTableRoutesFrameworkOps) {
  reg::OpMappingTable& map = rt->op_map();
  map.load_text("# comment\nfw::double_it   testsel::twice\n", "inline");
  Tensor x = f32({2}, {1, 2});
  Tensor out = Tensor::empty({2}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("fw::double_it", args, 2, rets, 1, nullptr);
  expect_values(out, {2, 4});
  map.set({"fw::double_it", "testsel::which", "testsel"});
  OpHandle h = rt->dispatcher().op("fw::double_it");
  EXPECT_EQ(h.op->name(), "testsel::which");
  EXPECT_EQ(h.preferred_plugin, rt->loader().plugin("testsel").get());
  EXPECT_NE(error_of([&] {
              map.load_text("only_one_field\n", "bad.txt");
            }).find("bad.txt:1: expected 'framework_op target_op [plugin]' but found 1 field(s)"),
            std::string::npos);
}

TEST_F(DispatcherTest, RemovingAMappingRestoresTheOpsOwnRouteAndMovesTheVersion) {
  reg::OpMappingTable& map = rt->op_map();
  map.set({"testsel::which", "testsel::twice", ""});
  EXPECT_EQ(rt->dispatcher().op("testsel::which").op->name(), "testsel::twice");
  const uint64_t before = map.version();
  EXPECT_TRUE(map.remove("testsel::which"));
  EXPECT_GT(map.version(), before);
  EXPECT_EQ(map.find("testsel::which"), nullptr);
  EXPECT_EQ(rt->dispatcher().op("testsel::which").op->name(), "testsel::which");
  const uint64_t after = map.version();
  EXPECT_FALSE(map.remove("testsel::which"));  // nothing to remove: nothing changes
  EXPECT_EQ(map.version(), after);
  EXPECT_NE(
      error_of([&] { rt->dispatcher().op("fw::unmapped"); }).find("the op-mapping table does not map it"),
      std::string::npos);
}

TEST_F(DispatcherTest, ToolQueriesListOpsKernelsAndCoverage) {
  Dispatcher& d = rt->dispatcher();
  const reg::Kernel* k = d.kernel_for(d.op("aten::mm.out"), DType::kFloat32);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->plugin_name(), "cann_like");
  EXPECT_EQ(d.kernel_for(d.op("aten::mm.out"), DType::kBool), nullptr);  // a dtype no mm kernel takes
  EXPECT_EQ(d.kernel_for(d.op("testsel::which"), DType::kFloat32)->priority, 10);
  auto coverage = rt->registry().coverage_by_plugin();
  ASSERT_EQ(coverage.size(), 2u);
  EXPECT_EQ(coverage[0].first, "cann_like");
  const auto& cann = coverage[0].second;
  for (const char* op :
       {"aten::add.out", "aten::mm.out", "aten::mul.out", "aten::relu", "aten::_softmax.out"})
    EXPECT_NE(std::find(cann.begin(), cann.end(), op), cann.end()) << op;
  EXPECT_EQ(coverage[1].first, "testsel");
  EXPECT_EQ(coverage[1].second.size(), 11u);
  std::vector<std::string> names;
  for (const reg::OpEntry* op : rt->registry().ops()) names.push_back(op->name());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(names.size(), cann.size() + 11u);
}

TEST_F(DispatcherTest, StatisticsCountCallsKernelsAndTime) {
  rt->dispatcher().reset_stats();
  Tensor a = f32({2}, {1, 2});
  Tensor out = Tensor::empty({2}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(a.dl()), tensor_value(a.dl()), int_value(1), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  for (int i = 0; i < 5; ++i) rt->dispatcher().call("aten::add.out", args, 4, rets, 1, nullptr);
  auto stats = rt->dispatcher().stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].op, "aten::add.out");
  EXPECT_EQ(stats[0].calls, 5);
  EXPECT_EQ(stats[0].fallbacks, 0);
  ASSERT_EQ(stats[0].kernels.size(), 1u);
  EXPECT_EQ(stats[0].kernels[0].plugin, "cann_like");
  EXPECT_EQ(stats[0].kernels[0].calls, 5);
  EXPECT_GT(stats[0].total_ms, 0);
}

// One account per op: a call the host computed itself (no plugin serves the
// op) and a fallback the dispatcher took land under the same name.
TEST_F(DispatcherTest, HostFallbacksShareTheOpsAccount) {
  rt->dispatcher().reset_stats();
  Tensor x = Tensor::from_values({2}, DType::kInt32, {1, 2}, dev);
  EXPECT_EQ(which(x), -1);  // the dispatcher's fallback
  EXPECT_TRUE(rt->dispatcher().record_host_fallback("testsel::which"));
  EXPECT_FALSE(rt->dispatcher().record_host_fallback("testsel::which"));
  EXPECT_TRUE(rt->dispatcher().record_host_fallback("aten::lgamma"));  // no plugin op of that name
  auto stats = rt->dispatcher().stats();
  ASSERT_EQ(stats.size(), 2u);
  std::map<std::string, OpStatsSnapshot> by_op;
  for (auto& s : stats) by_op[s.op] = s;
  EXPECT_EQ(by_op["testsel::which"].calls, 3);
  EXPECT_EQ(by_op["testsel::which"].fallbacks, 3);
  EXPECT_EQ(by_op["aten::lgamma"].calls, 1);
  EXPECT_EQ(by_op["aten::lgamma"].fallbacks, 1);
  EXPECT_EQ(rt->dispatcher().total_fallbacks(), 4);
  rt->dispatcher().reset_stats();
  EXPECT_TRUE(rt->dispatcher().stats().empty());
  EXPECT_EQ(rt->dispatcher().total_fallbacks(), 0);
  EXPECT_FALSE(
      rt->dispatcher().record_host_fallback("aten::lgamma"));  // warned once per process, as the dispatcher
  EXPECT_EQ(rt->dispatcher().total_fallbacks(), 1);
}

// Note [Memory overlap]: written tensors against the tensors a call reads.
TEST_F(DispatcherTest, WrittenTensorsThatShareMemoryWithInputs) {
  auto call = [&](const char* op, std::vector<NpubValue> args, int32_t nret = 1) {
    std::vector<NpubValue> rets(static_cast<size_t>(nret), NpubValue{});
    rt->dispatcher().call(op, args.data(), static_cast<int32_t>(args.size()), rets.data(), nret, nullptr);
  };
  const std::string clone_hint = " Please clone() the tensor before performing the operation.";
  // a.add_(a.t()): two dense views of one memory that are not the same view.
  Tensor a = f32({2, 2}, {0, 1, 2, 3});
  Tensor at = a.as_strided({2, 2}, {1, 2}, 0);
  EXPECT_EQ(
      error_of([&] {
        call("aten::add.out",
             {tensor_value(a.dl()), tensor_value(at.dl()), int_value(1), tensor_value(a.dl())});
      }),
      "op 'aten::add.out', argument 'out': unsupported operation: some elements of the input tensor and the "
      "written-to tensor refer to a single memory location." +
          clone_hint);
  expect_values(a, {0, 1, 2, 3});
  // An expanded output (stride 0): internal overlap; fill_ may still write it.
  Tensor one = f32({1}, {5});
  Tensor expanded = one.as_strided({4}, {0}, 0);
  Tensor b = f32({4}, {1, 1, 1, 1});
  EXPECT_EQ(
      error_of([&] {
        call("aten::add.out",
             {tensor_value(b.dl()), tensor_value(b.dl()), int_value(1), tensor_value(expanded.dl())});
      }),
      "op 'aten::add.out', argument 'out': unsupported operation: more than one element of the written-to "
      "tensor refers to a single memory location." +
          clone_hint);
  call("aten::fill_.Scalar", {tensor_value(expanded.dl()), double_value(2)});
  expect_values(one, {2});
  // The same view written and read: cann_like's add declares
  // NPUB_KERNEL_ALIAS_SAFE and serves it; testsel::twice does not, so the
  // host's fallback does.
  rt->dispatcher().reset_stats();
  host.served.clear();
  Tensor x = f32({3}, {1, 2, 3});
  call("aten::add.out", {tensor_value(x.dl()), tensor_value(x.dl()), int_value(1), tensor_value(x.dl())});
  expect_values(x, {2, 4, 6});
  EXPECT_EQ(rt->dispatcher().total_fallbacks(), 0);
  call("testsel::twice", {tensor_value(x.dl()), tensor_value(x.dl())});
  expect_values(x, {4, 8, 12});
  EXPECT_EQ(host.served, std::vector<std::string>{"testsel::twice"});
  // Interleaved strided views (their memory ranges overlap, their elements
  // do not): no overlap; the kernel serves them.
  Tensor y = f32({4}, {1, 2, 3, 4});
  Tensor even = y.as_strided({2}, {2}, 0), odd = y.as_strided({2}, {2}, 1);
  const size_t served = host.served.size();
  call("aten::add.out",
       {tensor_value(even.dl()), tensor_value(odd.dl()), int_value(1), tensor_value(even.dl())});
  expect_values(y, {3, 2, 7, 4});
  EXPECT_EQ(host.served.size(), served);
  // Column slices of different widths of one matrix (qkv[:, 0:2] written,
  // qkv[:, 2:3] read and broadcast, of a [2, 4]): interleaved, no shared
  // element; the kernel serves them. Written qkv[:, 1:3] does share one
  // with qkv[:, 2:3]: the fallback serves that.
  Tensor qkv = f32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor q2 = qkv.as_strided({2, 2}, {4, 1}, 0), k1 = qkv.as_strided({2, 1}, {4, 1}, 2);
  Tensor ones = f32({2, 2}, {1, 1, 1, 1});
  call("aten::add.out",
       {tensor_value(ones.dl()), tensor_value(k1.dl()), int_value(1), tensor_value(q2.dl())});
  expect_values(qkv, {4, 4, 3, 4, 8, 8, 7, 8});
  EXPECT_EQ(host.served.size(), served);
  Tensor q12 = qkv.as_strided({2, 2}, {4, 1}, 1);
  // (the test host's fallback takes equal shapes only: its refusal shows the call reached it)
  EXPECT_EQ(error_of([&] {
              call("aten::add.out",
                   {tensor_value(ones.dl()), tensor_value(k1.dl()), int_value(1), tensor_value(q12.dl())});
            }),
            "reference host: same shapes only");
  // Strided views that do share elements (x[0:3:2] and x[2:5:2]) and are
  // not dense: a case ATen does not judge; no kernel, the fallback serves it.
  Tensor z = f32({5}, {1, 2, 3, 4, 5});
  Tensor first = z.as_strided({2}, {2}, 0), second = z.as_strided({2}, {2}, 2);
  call("aten::add.out",
       {tensor_value(second.dl()), tensor_value(second.dl()), int_value(1), tensor_value(first.dl())});
  EXPECT_EQ(host.served.back(), "aten::add.out");
  // Under NPUB_FALLBACK=error the refusal says why no kernel served it.
  rt->dispatcher().set_fallback_mode(FallbackMode::kError);
  EXPECT_EQ(error_of([&] {
              call("testsel::twice", {tensor_value(x.dl()), tensor_value(x.dl())});
            }),
            "op 'testsel::twice' is not supported on npu:0: an output is the same memory as an input, and no "
            "kernel for dtype float32 declares NPUB_KERNEL_ALIAS_SAFE; falling back to the host framework is "
            "disabled (NPUB_FALLBACK=error)");
  rt->dispatcher().set_fallback_mode(FallbackMode::kAllow);
}

// A host whose fallback keeps the arguments' memory sharing (PyTorch's)
// gets the overlaps the dispatcher would refuse: its framework's checks
// differ per op. Under NPUB_FALLBACK=error the dispatcher refuses them as
// before.
TEST_F(DispatcherTest, AFallbackThatKeepsAliasingJudgesTheOverlapsItself) {
  host.install(rt->dispatcher(), /*keeps_aliasing=*/true);
  auto call = [&](const char* op, std::vector<NpubValue> args) {
    NpubValue ret{};
    rt->dispatcher().call(op, args.data(), static_cast<int32_t>(args.size()), &ret, 1, nullptr);
  };
  Tensor a = f32({2, 2}, {0, 1, 2, 3});
  Tensor at = a.as_strided({2, 2}, {1, 2}, 0);
  Tensor one = f32({1}, {5});
  Tensor expanded = one.as_strided({4}, {0}, 0);
  Tensor b = f32({4}, {1, 1, 1, 1});
  host.served.clear();
  call("aten::add.out", {tensor_value(a.dl()), tensor_value(at.dl()), int_value(1), tensor_value(a.dl())});
  call("aten::add.out",
       {tensor_value(b.dl()), tensor_value(b.dl()), int_value(1), tensor_value(expanded.dl())});
  EXPECT_EQ(host.served, (std::vector<std::string>{"aten::add.out", "aten::add.out"}));
  // The very same view still runs on the alias-safe kernel.
  Tensor x = f32({3}, {1, 2, 3});
  call("aten::add.out", {tensor_value(x.dl()), tensor_value(x.dl()), int_value(1), tensor_value(x.dl())});
  expect_values(x, {2, 4, 6});
  EXPECT_EQ(host.served.size(), 2u);
  rt->dispatcher().set_fallback_mode(FallbackMode::kError);
  EXPECT_EQ(
      error_of([&] {
        call("aten::add.out",
             {tensor_value(a.dl()), tensor_value(at.dl()), int_value(1), tensor_value(a.dl())});
      }),
      "op 'aten::add.out', argument 'out': unsupported operation: some elements of the input tensor and "
      "the written-to tensor refer to a single memory location. Please clone() the tensor before "
      "performing the operation.");
  rt->dispatcher().set_fallback_mode(FallbackMode::kAllow);
  host.install(rt->dispatcher());
}

}  // namespace
