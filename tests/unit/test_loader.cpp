// The bad-plugin matrix: one purpose-built plugin per failure mode, each
// rejected with a message naming the file and the reason, after which the
// host and every other plugin keep working.
#include "test_util.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <npubridge/support/error.h>

using namespace npub;
using namespace npub::test;

namespace {

// Runs testc::scale through the good C plugin: proof the host still works.
void expect_host_still_works(Runtime& rt) {
  sim::Device* dev = &rt.devices().at(0);
  Tensor x = Tensor::from_values({3}, DType::kFloat32, {1, 2, 3}, dev);
  TensorOutputs outs(rt.devices());
  NpubValue args[] = {tensor_value(x.dl()), double_value(2.0)};
  NpubValue rets[1] = {};
  rt.dispatcher().call("testc::scale", args, 2, rets, 1, &outs);
  expect_values(outs[0], {2, 4, 6});
}

struct BadCase {
  const char* file;      // test plugin (without lib/.so), or a path
  const char* expected;  // substring of the rejection message
};

class BadPlugin : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadPlugin, IsRejectedWithItsReasonAndTheHostKeepsWorking) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));
  const BadCase& c = GetParam();
  const std::string path = std::string(c.file).find('/') != std::string::npos ? c.file : test_plugin(c.file);
  LoadResult r = rt->loader().load(path);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("plugin '" + path + "' rejected: "), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(c.expected), std::string::npos) << "message was: " << r.error;
  // Nothing of the rejected plugin stays registered.
  for (const reg::OpEntry* op : rt->registry().ops())
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU)) EXPECT_EQ(k->plugin_name(), "good_c");
  EXPECT_TRUE(rt->registry().fusion_patterns().empty());  // a pattern staged before the error too
  ASSERT_EQ(rt->loader().plugins().size(), 1u);
  ASSERT_EQ(rt->loader().failures().size(), 1u);
  expect_host_still_works(*rt);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, BadPlugin,
    ::testing::Values(
        BadCase{"/nonexistent/dir/libmissing.so", "no such file"},
        BadCase{NPUB_TEST_PLUGIN_DIR "/libnot_a_library.so", "not a shared library (no ELF header)"},
        BadCase{NPUB_TEST_PLUGIN_DIR, "is a directory, not a shared library"},
        BadCase{"npub_test_bad_no_entry", "entry symbol 'npub_plugin_init_v1' not found"},
        BadCase{"npub_test_bad_wrong_major_symbol",
                "built for plugin ABI major 2 (exports 'npub_plugin_init_v2'), but this host supports ABI "
                "major 1"},
        BadCase{"npub_test_bad_struct_too_small",
                "NpubPluginApi.struct_size is 16 but ABI 1.0 requires at least 48 (struct too small)"},
        BadCase{"npub_test_bad_api_major_mismatch",
                "NpubPluginApi.abi_major is 7 but this host supports ABI major 1"},
        BadCase{"npub_test_bad_null_initialize", "required function NpubPluginApi.initialize is NULL"},
        BadCase{"npub_test_bad_entry_returns_null", "npub_plugin_init_v1() returned NULL"},
        BadCase{"npub_test_bad_bad_name",
                "NpubPluginApi.name must be 1 to 64 characters of [A-Za-z0-9_] but is 'bad name!'"},
        BadCase{"npub_test_bad_init_error",
                "initialize failed: simulated failure: device firmware not found"},
        BadCase{"npub_test_init_throws",
                "initialize threw an exception: simulated exception from initialize"},
        BadCase{"npub_test_sdk_throws",
                "initialize failed: sdk_throws initialize: simulated SDK init failure"},
        BadCase{"npub_test_bad_bad_schema", "define_op: invalid schema at character 22: expected a type"},
        BadCase{
            "npub_test_bad_schema_conflict",
            "define_op: op 'testc::scale' is already defined (by plugin 'good_c') with a different schema: "
            "existing \"testc::scale(Tensor self, float factor) -> Tensor\", new \"testc::scale(Tensor self, "
            "int factor) -> Tensor\""},
        BadCase{"npub_test_bad_undefined_op",
                "register_kernel: op 'nowhere::undefined_op' is not defined; define its schema with "
                "define_op first"},
        BadCase{"npub_test_bad_duplicate_kernel",
                "register_kernel: duplicate kernel for op 'dup::op' at priority 0 registered twice by this "
                "plugin"},
        BadCase{"npub_test_bad_null_kernel_fn",
                "register_kernel for op 'nullfn::op': required function NpubKernelDesc.fn is NULL"},
        BadCase{"npub_test_bad_kernel_desc_too_small",
                "register_kernel: NpubKernelDesc.struct_size is 16 but ABI 1.0 requires at least 84"},
        BadCase{"npub_test_bad_ignored_error", "define_op: invalid schema at character 13: expected a type"},
        BadCase{"npub_test_bad_derivative_unknown_input",
                "define_derivative for op 'bd::f' (\"self, bias: bd::f_backward(grad, self, w)\"): 'bias' is "
                "not an "
                "argument of bd::f"},
        BadCase{"npub_test_bad_derivative_arity",
                "define_derivative for op 'bd::f' (\"self, w: bd::f_backward(grad, self)\"): backward op "
                "'bd::f_backward' takes 3 arguments but the formula passes 2"},
        BadCase{"npub_test_bad_derivative_returns",
                "define_derivative for op 'bd::f' (\"self: bd::f_backward(grads[0], self, results[1])\"): "
                "'results[1]' but the op has 1 returns"},
        BadCase{"npub_test_bad_meta_undefined_op",
                "register_meta: op 'nowhere::op' is not defined; define its schema with define_op first"},
        BadCase{"npub_test_bad_fusion_pattern_syntax",
                "register_fusion_pattern (plugin 'bad_23'), line 6, pattern 'broken': expected ',' or ')' in "
                "the argument list at the end of the line"},
        BadCase{"npub_test_bad_fusion_pattern_undefined_op",
                "register_fusion_pattern (plugin 'bad_24'), line 3, pattern 'p': the replacement op "
                "'nowhere::op' is not defined (define it before its pattern)"}),
    [](const ::testing::TestParamInfo<BadCase>& info) {
      std::string name = info.param.file;
      name = name.substr(name.find_last_of('/') + 1);
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name + "_" + std::to_string(info.index);
    });

TEST(Loader, DuplicateKernelAcrossPluginsIsRejected) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));
  // Loading the same file twice: the second is rejected by name.
  LoadResult r = rt->loader().load(test_plugin("npub_test_good_c"));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("a plugin named 'good_c' is already loaded from"), std::string::npos) << r.error;
  expect_host_still_works(*rt);
}

TEST(Loader, KernelErrorAtCallTimeNamesOpPluginAndReason) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));
  load_ok(*rt, test_plugin("npub_test_bad_kernel_error"));
  Tensor x = Tensor::from_values({2}, DType::kFloat32, {1, 2}, &rt->devices().at(0));
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  const std::string msg = error_of([&] { rt->dispatcher().call("badk::fail", args, 1, rets, 1, &outs); });
  EXPECT_EQ(msg,
            "op 'badk::fail' failed in the kernel of plugin 'bad_10': simulated failure inside the kernel");
  EXPECT_EQ(rt->dispatcher().stats().front().errors, 1);
  expect_host_still_works(*rt);
}

// ABI 1.2 from a pure C plugin: a meta function gives the outputs' shapes
// without running the kernel (tensors without data), and a derivative
// formula is parsed against both schemas.
TEST(Loader, MetaFunctionsAndDerivativeFormulas) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));
  int64_t shape[] = {3, 4};
  DLTensor meta_only{};
  meta_only.data = nullptr;
  meta_only.device = DLDevice{static_cast<DLDeviceType>(NPUB_DEVICE_NPU), 1};
  meta_only.ndim = 2;
  meta_only.dtype = to_dl(DType::kBFloat16);
  meta_only.shape = shape;
  NpubValue args[] = {tensor_value(&meta_only), double_value(2.0)};
  const auto metas = rt->dispatcher().infer_meta(rt->dispatcher().op("testc::scale"), args, 2);
  ASSERT_EQ(metas.size(), 1u);
  EXPECT_TRUE(metas[0].set);
  EXPECT_EQ(metas[0].dtype, DType::kBFloat16);
  EXPECT_EQ(metas[0].shape, (std::vector<int64_t>{3, 4}));
  // Arguments are validated as for a call.
  EXPECT_EQ(error_of([&] { rt->dispatcher().infer_meta(rt->dispatcher().op("testc::scale"), args, 1); }),
            "op 'testc::scale': expected 2 arguments but found 1 (schema: testc::scale(Tensor self, float "
            "factor) -> Tensor)");
  // In-place ops need none; others without one cannot be traced.
  NpubValue one[] = {tensor_value(&meta_only)};
  EXPECT_EQ(rt->dispatcher().infer_meta(rt->dispatcher().op("testc::add_one_"), one, 1)[0].alias, 0);
  EXPECT_EQ(
      error_of([&] { rt->dispatcher().infer_meta(rt->dispatcher().op("testc::count_positive"), one, 1); }),
      "op 'testc::count_positive' has no meta function: plugin 'good_c' did not register one "
      "(register_meta), "
      "so its outputs' shapes cannot be known without running it");
  const reg::Derivative* d = rt->registry().find("testc::scale")->derivative();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->backward, "testc::scale");
  EXPECT_EQ(d->inputs, (std::vector<int32_t>{0}));
  ASSERT_EQ(d->args.size(), 2u);
  EXPECT_EQ(d->args[0].kind, reg::Derivative::Arg::kGrad);
  EXPECT_EQ(d->args[1].kind, reg::Derivative::Arg::kInput);
  EXPECT_EQ(d->args[1].index, 1);
  EXPECT_EQ(d->plugin, "good_c");
  EXPECT_EQ(rt->registry().find("testc::add_one_")->derivative(), nullptr);
}

TEST(Loader, PureCPluginLoadsAndRuns) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));
  sim::Device* dev = &rt->devices().at(1);
  Tensor x = Tensor::from_values({2, 2}, DType::kFloat32, {-1, 2, 0, 4}, dev);
  // In place, returning its argument.
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testc::add_one_", args, 1, rets, 1, nullptr);
  EXPECT_EQ(rets[0].u.tensor, x.dl());
  expect_values(x, {0, 3, 1, 5});
  // Scalar return.
  NpubValue crets[1] = {};
  rt->dispatcher().call("testc::count_positive", args, 1, crets, 1, nullptr);
  EXPECT_EQ(crets[0].tag, NPUB_VALUE_INT);
  EXPECT_EQ(crets[0].u.i, 3);
  // Host-allocated output lands on the input's device.
  TensorOutputs outs(rt->devices());
  NpubValue sargs[] = {tensor_value(x.dl()), int_value(3)};
  NpubValue srets[1] = {};
  rt->dispatcher().call("testc::scale", sargs, 2, srets, 1, &outs);
  EXPECT_EQ(outs[0].dl()->device.device_id, 1);
  expect_values(outs[0], {0, 9, 3, 15});
}

TEST(Loader, OldMinorAndFuturePluginsBothLoad) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_old_v1_0"));
  load_ok(*rt, test_plugin("npub_test_future"));
  auto future = rt->loader().plugin("future");
  ASSERT_NE(future, nullptr);
  EXPECT_EQ(future->abi_minor, static_cast<uint32_t>(NPUB_ABI_MINOR + 7));
  sim::Device* dev = &rt->devices().at(0);
  Tensor x = Tensor::from_values({3}, DType::kFloat32, {1, -2, 3}, dev);
  Tensor y = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(y.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("old::negate", args, 2, rets, 1, nullptr);
  expect_values(y, {-1, 2, -3});
  Tensor w = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue sargs[] = {tensor_value(x.dl()), tensor_value(w.dl())};
  rt->dispatcher().call("old::negate_sized", sargs, 2, rets, 1, nullptr);  // struct_size 84, not sizeof
  expect_values(w, {-1, 2, -3});
  Tensor z = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue fargs[] = {tensor_value(y.dl()), tensor_value(z.dl())};
  rt->dispatcher().call("future::copy", fargs, 2, rets, 1, nullptr);
  expect_values(z, {-1, 2, -3});
}

// ABI 1.5 appended register_fusion_pattern to NpubHostApi: a plugin built
// against the 1.4 header (no such field) loads and runs as before, and one
// built against 1.5 registers its pattern.
TEST(Loader, AbiOneFourPluginLoadsOnAOneFiveHost) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_old_v1_4"));
  EXPECT_EQ(rt->loader().plugin("old14")->abi_minor, 4u);
  sim::Device* dev = &rt->devices().at(0);
  Tensor x = Tensor::from_values({3}, DType::kFloat32, {1, -2, 3}, dev);
  Tensor y = Tensor::empty({3}, DType::kFloat32, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(y.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("old14::twice", args, 2, rets, 1, nullptr);
  expect_values(y, {2, -4, 6});
  EXPECT_TRUE(rt->registry().fusion_patterns().empty());
}

// ABI 1.6 appended NpubKernelDesc.meta: a plugin built against the 1.5
// header (a kernel description without it) loads and runs, its kernel has
// no meta function of its own, and a metadata call plan's returns come from
// the op's meta function instead.
TEST(Loader, AbiOneFivePluginLoadsOnAOneSixHost) {
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_old_v1_5"));
  EXPECT_EQ(rt->loader().plugin("old15")->abi_minor, 5u);
  sim::Device* dev = &rt->devices().at(0);
  Tensor x = Tensor::from_values({2, 2}, DType::kFloat32, {1, -2, 3, 0.5}, dev);
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(x.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("old15::halve", args, 1, rets, 1, &outs);
  expect_values(outs[0], {0.5, -1, 1.5, 0.25});
  const reg::OpEntry* op = rt->registry().find("old15::halve");
  ASSERT_NE(op, nullptr);
  const reg::KernelList& kernels = op->kernels(NPUB_DEVICE_NPU);
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0]->meta, nullptr);
  Dispatcher& d = rt->dispatcher();
  const CallPlan p = d.plan(d.op("old15::halve"), args, 1, PlanInputs::kMetadata, /*with_returns=*/true);
  ASSERT_EQ(p.plugin(), "old15");
  ASSERT_EQ(p.returns.size(), 1u);
  EXPECT_TRUE(p.returns[0].set);
  EXPECT_EQ(p.returns[0].dtype, DType::kFloat32);
  EXPECT_EQ(p.returns[0].shape, (std::vector<int64_t>{2, 2}));
}

TEST(Loader, AbiOneFivePluginRegistersAFusionPattern) {
  auto rt = make_runtime();
  load_ok(*rt, NPUB_TEST_FUSION_PLUGIN);
  EXPECT_EQ(rt->loader().plugin("testfuse")->abi_minor, static_cast<uint32_t>(NPUB_ABI_MINOR));
  const auto patterns = rt->registry().fusion_patterns();
  ASSERT_EQ(patterns.size(), 1u);
  EXPECT_EQ(patterns[0].name, "testfuse_gelu_mul");
  EXPECT_EQ(patterns[0].plugin, "testfuse");
  EXPECT_EQ(patterns[0].priority, 5);
  ASSERT_EQ(patterns[0].nodes.size(), 2u);
  EXPECT_EQ(patterns[0].nodes[0].op, "aten::gelu");
  EXPECT_EQ(patterns[0].replacement.to_string(), "testfuse::gelu_mul(%a, %b)");
  // The fused op runs: gelu(a) * b.
  sim::Device* dev = &rt->devices().at(0);
  Tensor a = Tensor::from_values({3}, DType::kFloat32, {-1, 0, 2}, dev);
  Tensor b = Tensor::from_values({3}, DType::kFloat32, {3, 5, 0.5}, dev);
  TensorOutputs outs(rt->devices());
  NpubValue args[] = {tensor_value(a.dl()), tensor_value(b.dl())};
  NpubValue rets[1] = {};
  rt->dispatcher().call("testfuse::gelu_mul", args, 2, rets, 1, &outs);
  auto gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  // float32 evaluation of one erf and three products: a few ulp.
  expect_values(outs[0], {gelu(-1) * 3, 0, gelu(2) * 0.5}, 1e-6);
}

TEST(Loader, InTreePluginsContributeTheStandardPatterns) {
  auto rt = make_runtime();
  load_ok(*rt, builtin_plugin("npub_cann_like"));
  load_ok(*rt, builtin_plugin("npub_mindspeed_like"));
  std::vector<std::string> names;
  for (const auto& p : rt->registry().fusion_patterns()) names.push_back(p.plugin + ":" + p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "cann_like:conv2d_bias_relu", "cann_like:conv2d_bias_relu_inplace",
                       "mindspeed_like:rms_norm_cast", "mindspeed_like:rms_norm",
                       "mindspeed_like:add_rms_norm_cast", "mindspeed_like:add_rms_norm",
                       "mindspeed_like:swiglu", "mindspeed_like:sdpa_causal", "mindspeed_like:sdpa"}));
  // Every fused op a pattern rewrites to is differentiable.
  for (const auto& p : rt->registry().fusion_patterns()) {
    const reg::OpEntry* op = rt->registry().find(p.replacement.op);
    ASSERT_NE(op, nullptr) << p.name;
    EXPECT_NE(op->derivative(), nullptr) << p.replacement.op;
  }
}

TEST(Loader, DefaultSearchOrderIsBuiltinThenPluginPath) {
  setenv("NPUB_PLUGIN_PATH",
         (std::string(NPUB_TEST_PLUGIN_DIR) + "/libnpub_test_good_c.so:" + NPUB_TEST_PLUGIN_DIR +
          "/libnpub_test_future.so")
             .c_str(),
         1);
  auto files = PluginLoader::default_candidates();
  unsetenv("NPUB_PLUGIN_PATH");
  ASSERT_EQ(files.size(), 5u);
  EXPECT_NE(files[0].find("libnpub_cann_like.so"), std::string::npos);
  EXPECT_NE(files[1].find("libnpub_mindspeed_like.so"), std::string::npos);
  EXPECT_NE(files[2].find("libnpub_vllm_like.so"), std::string::npos);
  EXPECT_NE(files[3].find("libnpub_test_good_c.so"), std::string::npos);
  EXPECT_NE(files[4].find("libnpub_test_future.so"), std::string::npos);
}

TEST(Loader, PluginDirectoryInPathLoadsEverythingAndReportsEachFailure) {
  // A directory of mostly bad plugins: each is reported, the good ones load,
  // and the one library without any entry symbol is skipped, not rejected
  // (Note [A directory may hold libraries that are not plugins]).
  auto rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_good_c"));  // before the conflicting one
  setenv("NPUB_PLUGIN_PATH", NPUB_TEST_PLUGIN_DIR, 1);
  auto results = rt->loader().load_default();
  unsetenv("NPUB_PLUGIN_PATH");
  int ok = 0, bad = 0, skipped = 0;
  for (const auto& r : results) (r.ok ? ok : r.skipped ? skipped : bad) += 1;
  EXPECT_GE(ok, 3 + 4);  // 3 built-in + good_c, testsel, future, old, kernel_error...
  EXPECT_GE(bad, 14);
  EXPECT_EQ(skipped, 1);
  const std::string no_entry = test_plugin("npub_test_bad_no_entry");
  ASSERT_EQ(rt->loader().skipped().size(), 1u);
  EXPECT_EQ(rt->loader().skipped()[0].path, no_entry);
  EXPECT_EQ(rt->loader().skipped()[0].error,
            "'" + no_entry + "' skipped: not an npubridge plugin (no npub_plugin_init_v1)");
  EXPECT_EQ(rt->loader().failures().size(), static_cast<size_t>(bad));
  for (const auto& f : rt->loader().failures()) EXPECT_NE(f.path, no_entry);
  // A library exporting another ABI major's entry point is a plugin: rejected.
  bool wrong_major_rejected = false;
  for (const auto& f : rt->loader().failures())
    wrong_major_rejected |= f.path == test_plugin("npub_test_bad_wrong_major_symbol");
  EXPECT_TRUE(wrong_major_rejected);
  EXPECT_NE(rt->loader().plugin("cann_like"), nullptr);
  expect_host_still_works(*rt);
}

TEST(Loader, ALibraryWithoutEntryNamedInPluginPathIsRejected) {
  // Named explicitly, the file is meant to be a plugin: an error, not a skip.
  auto rt = make_runtime();
  const std::string no_entry = test_plugin("npub_test_bad_no_entry");
  setenv("NPUB_PLUGIN_PATH", no_entry.c_str(), 1);
  auto results = rt->loader().load_default();
  unsetenv("NPUB_PLUGIN_PATH");
  ASSERT_FALSE(results.empty());
  const LoadResult& r = results.back();
  EXPECT_EQ(r.path, no_entry);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.error, "plugin '" + no_entry +
                         "' rejected: entry symbol 'npub_plugin_init_v1' not found; a plugin must export it "
                         "(see plugin_api.h)");
  EXPECT_TRUE(rt->loader().skipped().empty());
  ASSERT_EQ(rt->loader().failures().size(), 1u);
}

}  // namespace

// Note [A truncated plugin is rejected before dlopen]: a copy cut short
// would raise SIGBUS inside the dynamic loader; it is rejected instead,
// naming the file and how much of it is missing.
TEST(Loader, TruncatedPluginIsRejectedNotMapped) {
  const std::string good = test_plugin("npub_test_good_c");
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 3000u);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("npub_truncated_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto rt = make_runtime();
  for (size_t keep : {size_t{40}, size_t{100}, size_t{3000}}) {  // header, program headers, segments
    const std::string path = (dir / ("libnpub_truncated_" + std::to_string(keep) + ".so")).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(keep));
    LoadResult r = rt->loader().load(path);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("plugin '" + path + "' rejected: "), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("truncated: the file has " + std::to_string(keep) + " bytes"), std::string::npos)
        << r.error;
  }
  std::filesystem::remove_all(dir);
  load_ok(*rt, good);
  expect_host_still_works(*rt);
}

namespace {
std::unique_ptr<reg::Kernel> test_kernel(int32_t priority) {
  auto k = std::make_unique<reg::Kernel>();
  k->priority = priority;
  k->fn = [](NpubCallContext*, const NpubValue*, int32_t, NpubValue*, int32_t) -> NpubError* {
    return nullptr;
  };
  return k;
}
NpubError* no_meta(NpubMetaContext*, const NpubValue*, int32_t) { return nullptr; }
}  // namespace

// Note [A plugin's registrations commit as one]: a conflict anywhere in a
// plugin's batch (here its last schema, then a kernel) leaves none of its
// ops, kernels or meta functions behind.
TEST(Loader, ACommitConflictLeavesNothingOfThePluginBehind) {
  reg::Registry registry;
  registry.define(reg::parse_schema("t::taken(Tensor self) -> Tensor"), "host");
  auto batch = [] {
    reg::Registrations b;
    b.defined_by = "plugin 'late'";
    b.schemas.push_back(reg::parse_schema("t::fresh(Tensor self) -> Tensor"));
    b.kernels.emplace_back("t::fresh", test_kernel(0));
    b.kernels.emplace_back("t::taken", test_kernel(0));
    b.metas.emplace_back("t::fresh", reg::MetaFunction{&no_meta, nullptr, nullptr});
    return b;
  };
  reg::Registrations conflicting = batch();
  conflicting.schemas.push_back(reg::parse_schema("t::taken(Tensor self, int n) -> Tensor"));
  EXPECT_EQ(error_of([&] { registry.commit(std::move(conflicting)); }),
            "op 't::taken' is already defined (by host) with a different schema: existing "
            "\"t::taken(Tensor self) -> Tensor\", new \"t::taken(Tensor self, int n) -> Tensor\"");
  EXPECT_EQ(registry.find("t::fresh"), nullptr);
  EXPECT_TRUE(registry.find("t::taken")->kernels(NPUB_DEVICE_NPU).empty());

  registry.add_kernel([&] {
    auto k = test_kernel(0);
    k->op = registry.find("t::taken");
    return k;
  }());
  EXPECT_NE(error_of([&] {
              registry.commit(batch());
            }).find("duplicate kernel for op 't::taken' on npu at priority 0"),
            std::string::npos);
  EXPECT_EQ(registry.find("t::fresh"), nullptr);
  EXPECT_EQ(registry.find("t::taken")->kernels(NPUB_DEVICE_NPU).size(), 1u);

  reg::Registrations ok = batch();
  ok.kernels[1].second->priority = 1;
  registry.commit(std::move(ok));
  ASSERT_NE(registry.find("t::fresh"), nullptr);
  EXPECT_EQ(registry.find("t::fresh")->kernels(NPUB_DEVICE_NPU).size(), 1u);
  EXPECT_NE(registry.find("t::fresh")->meta(), nullptr);
  EXPECT_EQ(registry.find("t::fresh")->defined_by(), "plugin 'late'");
  EXPECT_EQ(registry.find("t::taken")->kernels(NPUB_DEVICE_NPU).size(), 2u);
}

// Two threads loading two copies of one plugin at once: loads run one at a
// time, so exactly one wins and the other is turned away by name (before,
// both initialize calls ran together and the loser failed half-committed).
TEST(Loader, ConcurrentLoadsOfOnePluginNameLetExactlyOneIn) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("npub_concurrent_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path a = dir / "libcopy_a.so", b = dir / "libcopy_b.so";
  fs::copy_file(test_plugin("npub_test_good_c"), a, fs::copy_options::overwrite_existing);
  fs::copy_file(test_plugin("npub_test_good_c"), b, fs::copy_options::overwrite_existing);
  ScopedEnv slow("NPUB_TEST_GOOD_C_INIT_DELAY_MS", "20");  // both initialize calls would overlap
  for (int round = 0; round < 5; ++round) {
    auto rt = make_runtime();
    LoadResult ra, rb;
    std::thread ta([&] { ra = rt->loader().load(a.string()); });
    std::thread tb([&] { rb = rt->loader().load(b.string()); });
    ta.join();
    tb.join();
    ASSERT_NE(ra.ok, rb.ok) << ra.error << " / " << rb.error;
    const LoadResult& lost = ra.ok ? rb : ra;
    const fs::path& winner = ra.ok ? a : b;
    EXPECT_NE(lost.error.find("a plugin named 'good_c' is already loaded from '" + winner.string() + "'"),
              std::string::npos)
        << lost.error;
    expect_host_still_works(*rt);
  }
  fs::remove_all(dir);
}
