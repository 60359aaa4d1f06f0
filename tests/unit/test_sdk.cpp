// The C++ plugin SDK (plugin_sdk.hpp) seen from the host: what a plugin
// hands to KernelBuilder::user_data reaches its kernel and its predicate,
// and the SDK's errors name the op.
#include "test_util.h"

using namespace npub;
using namespace npub::test;

namespace {

class Sdk : public ::testing::Test {
 protected:
  void SetUp() override {
    rt = make_runtime();
    load_ok(*rt, test_plugin("npub_test_user_data"));
    dev = &rt->devices().at(0);
  }
  // Calls `op`(x, out) and returns out.
  Tensor call(const char* op, const Tensor& x, const std::vector<int64_t>& out_shape) {
    Tensor out = Tensor::empty(out_shape, DType::kFloat32, dev);
    NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
    NpubValue rets[1] = {};
    rt->dispatcher().call(op, args, 2, rets, 1, nullptr);
    return out;
  }
  std::unique_ptr<Runtime> rt;
  sim::Device* dev = nullptr;
};

TEST_F(Sdk, KernelAndPredicateGetTheUserDataThePluginGave) {
  // 4 elements: the predicate of the priority-10 kernel (factor 3) accepts.
  Tensor small = Tensor::from_values({4}, DType::kFloat32, {1, 2, 3, 4}, dev);
  expect_values(call("userdata::scale", small, {4}), {3, 6, 9, 12});
  // 5 elements: it declines, and the general kernel (factor 2) serves.
  Tensor big = Tensor::from_values({5}, DType::kFloat32, {1, 2, 3, 4, 5}, dev);
  expect_values(call("userdata::scale", big, {5}), {2, 4, 6, 8, 10});
  // The same body registered for another op, with its own user data.
  expect_values(call("userdata::scale_too", small, {4}), {5, 10, 15, 20});
}

TEST_F(Sdk, ErrorsOfABodySharedByTwoOpsNameTheOpCalled) {
  Tensor x = Tensor::from_values({2}, DType::kFloat32, {1, 2}, dev);
  EXPECT_EQ(
      error_of([&] { call("userdata::scale", x, {3}); }),
      "op 'userdata::scale' failed in the kernel of plugin 'userdata': userdata::scale: out: expected shape "
      "[2] but found [3]");
  EXPECT_EQ(error_of([&] { call("userdata::scale_too", x, {3}); }),
            "op 'userdata::scale_too' failed in the kernel of plugin 'userdata': userdata::scale_too: out: "
            "expected "
            "shape [2] but found [3]");
}

TEST_F(Sdk, OpDefinesTheSchemaAndRegistersItsKernelWithTheChainedSettings) {
  // r.op("userdata::scale_too(...)", &scale).dtypes({kFloat32}): the op
  // exists under the schema's name, and the kernel takes float32 only.
  ASSERT_NE(rt->registry().find("userdata::scale_too"), nullptr);
  Tensor x = Tensor::from_values({2}, DType::kFloat64, {1, 2}, dev);
  Tensor out = Tensor::empty({2}, DType::kFloat64, dev);
  NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
  NpubValue rets[1] = {};
  EXPECT_EQ(error_of([&] { rt->dispatcher().call("userdata::scale_too", args, 2, rets, 1, nullptr); }),
            "op 'userdata::scale_too' is not supported on npu:0: no kernel accepts dtype float64 (plugin "
            "'userdata': {float32}), and the host registered no fallback");
}

TEST_F(Sdk, ASecondRuntimeLoadingTheSamePluginGetsTheSameKernels) {
  // The runtimes share the library, and with it the SDK's table of kernel
  // entries (Note [One C entry per SDK kernel]); the second initialisation
  // finds its (op, body) pairs there.
  auto second = make_runtime();
  load_ok(*second, test_plugin("npub_test_user_data"));
  for (Runtime* runtime : {rt.get(), second.get()}) {
    sim::Device* device = &runtime->devices().at(0);
    Tensor x = Tensor::from_values({2}, DType::kFloat32, {1, 2}, device);
    Tensor out = Tensor::empty({2}, DType::kFloat32, device);
    NpubValue args[] = {tensor_value(x.dl()), tensor_value(out.dl())};
    NpubValue rets[1] = {};
    runtime->dispatcher().call("userdata::scale_too", args, 2, rets, 1, nullptr);
    expect_values(out, {5, 10});
  }
}

}  // namespace
