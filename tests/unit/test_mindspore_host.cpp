// libnpub_mindspore.so through the C functions MindSpore and
// npubridge.mindspore call: bindings (the layout grammar and its errors),
// AOT calls on raw host buffers, and the routing question.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

extern "C" {
int npub_ms_start(void);
int npub_ms_bind(const char* op, const char* layout, const char* outputs);
const char* npub_ms_last_error(void);
int npub_ms_last_call_error(char* out, int out_len);
int npub_ms_check_layout(const char* op, const char* layout, const char* outputs);
int npub_ms_aot_call(int slot, int nparam, void** params, int* ndims, int64_t** shapes, const char** dtypes);
int npub_ms_plan(int slot, int nparam, const int* ndims, int64_t* const* shapes, const char* const* dtypes,
                 const double* scalars, char* plugin, int plugin_len, char* conversion, int conversion_len,
                 char* reason, int reason_len);
}

namespace {

// The AOT arguments of one call: buffers, ranks, shapes and dtype names.
struct AotCall {
  std::vector<void*> params;
  std::vector<int> ndims;
  std::vector<std::vector<int64_t>> shape_rows;
  std::vector<int64_t*> shapes;
  std::vector<const char*> dtypes;

  void add(void* data, std::vector<int64_t> shape, const char* dtype) {
    params.push_back(data);
    ndims.push_back(static_cast<int>(shape.size()));
    shape_rows.push_back(std::move(shape));
    dtypes.push_back(dtype);
  }
  int run(int slot) {
    shapes.clear();
    for (auto& r : shape_rows) shapes.push_back(r.data());
    return npub_ms_aot_call(slot, static_cast<int>(params.size()), params.data(), ndims.data(), shapes.data(),
                            dtypes.data());
  }
};

class MindSporeHost : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(npub_ms_start(), 0) << npub_ms_last_error(); }
};

std::string bind_error(const char* op, const char* layout, const char* outputs) {
  EXPECT_EQ(npub_ms_bind(op, layout, outputs), -1);
  return npub_ms_last_error();
}

}  // namespace

TEST_F(MindSporeHost, ATransposedProductRunsOnRawBuffers) {
  const int slot = npub_ms_bind("aten::mm.out", "t0 t1T o0", "a2");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  // x (2x3) @ w^T, w (4x3): nn.Dense's product. Small integers: exact.
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, w = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}, out(8, -1.0f);
  AotCall call;
  call.add(x.data(), {2, 3}, "float32");
  call.add(w.data(), {4, 3}, "float32");
  call.add(out.data(), {2, 4}, "float32");
  ASSERT_EQ(call.run(slot), 0) << npub_ms_last_error();
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 6, 4, 5, 6, 15}));
}

TEST_F(MindSporeHost, AScalarArgumentIsReadFromAZeroDimInput) {
  // _softmax.out(self, dim, half_to_float, out): dim from a 0-d int64 input.
  const int slot = npub_ms_bind("aten::_softmax.out", "t0 s1 b:0 o0", "a3");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  std::vector<double> x = {0, 1, 2, 3}, out(4, 0);
  int64_t dim = 0;
  AotCall call;
  call.add(x.data(), {2, 2}, "float64");
  call.add(&dim, {}, "int64");
  call.add(out.data(), {2, 2}, "float64");
  ASSERT_EQ(call.run(slot), 0) << npub_ms_last_error();
  const double e2 = std::exp(2.0);
  for (int c = 0; c < 2; ++c) {  // softmax down each column: (1, e^2) / (1 + e^2)
    EXPECT_NEAR(out[c], 1 / (1 + e2), 1e-15);
    EXPECT_NEAR(out[2 + c], e2 / (1 + e2), 1e-15);
  }
}

TEST_F(MindSporeHost, TheExportedSlotFunctionIsTheAotEntryPoint) {
  // What ops.Custom("libnpub_mindspore.so:npub_ms_slot_<i>") looks up.
  const int slot = npub_ms_bind("aten::relu", "t0", "r0");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  using AotFn = int (*)(int, void**, int*, int64_t**, const char**, void*, void*);
  const std::string name = "npub_ms_slot_" + std::to_string(slot);
  auto fn = reinterpret_cast<AotFn>(dlsym(RTLD_DEFAULT, name.c_str()));
  ASSERT_NE(fn, nullptr) << name << " is not exported";
  ASSERT_EQ(dlsym(RTLD_DEFAULT, "npub_ms_slot_512"), nullptr);  // kNumSlots functions, no more
  std::vector<float> x = {-1, 2}, out(2, 7);
  AotCall call;
  call.add(x.data(), {2}, "float32");
  call.add(out.data(), {2}, "float32");
  call.shapes = {call.shape_rows[0].data(), call.shape_rows[1].data()};
  ASSERT_EQ(
      fn(2, call.params.data(), call.ndims.data(), call.shapes.data(), call.dtypes.data(), nullptr, nullptr),
      0);
  EXPECT_EQ(out, (std::vector<float>{0, 2}));
}

TEST_F(MindSporeHost, BadLayoutsAreRefusedNamingTheOpTheTokenAndTheArgument) {
  struct Case {
    const char *op, *layout, *outputs, *why;
  };
  const Case cases[] = {
      {"nosuch::op", "t0", "r0", "unknown op: no loaded plugin defines it"},
      {"mindspeed_like::npu_swiglu", "t0 o0", "r0",
       "token 'o0' for argument 'dim': the schema's argument is not a Tensor"},
      {"aten::relu", "t0", "r3", "output token 'r3': the op has 1 return(s)"},
      {"aten::relu", "tx", "r0", "token 'tx': expected an index after its letter, found 'x'"},
      {"aten::relu", "t99999", "r0", "token 't99999': expected an index after its letter, found '99999'"},
      {"aten::gelu.out", "t0 i:5 o0", "a2",
       "token 'i:5' for argument 'approximate': i: is an int and the argument is not"},
      {"mindspeed_like::npu_swiglu", "t0 str:abc", "r0",
       "token 'str:abc' for argument 'dim': the argument is not a str"},
      {"aten::native_layer_norm", "t0 l:1.x t1 t2 f:1e-5", "r0",
       "token 'l:1.x' for argument 'normalized_shape': malformed integer 'x'"},
      {"aten::mm.out", "t0 t1 o0", "a2.1",
       "output token 'a2.1': argument 'out' is not a Tensor[] to take an element of"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(bind_error(c.op, c.layout, c.outputs), std::string("npubridge.mindspore: cannot bind '") +
                                                         c.op + "' with layout '" + c.layout + "': " + c.why);
  const std::string missing = bind_error("aten::mm.out", "t0 t1", "a2");
  EXPECT_NE(missing.find("argument 'out' has no default and the layout leaves it out"), std::string::npos)
      << missing;
}

TEST_F(MindSporeHost, ACallThatDoesNotFitItsBindingFailsNamingTheOp) {
  const int slot = npub_ms_bind("aten::mm.out", "t0 t1 o0", "a2");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  std::vector<float> x(6), w(6), out(4);
  AotCall two;
  two.add(x.data(), {2, 3}, "float32");
  two.add(out.data(), {2, 2}, "float32");
  EXPECT_EQ(two.run(slot), 1);
  EXPECT_EQ(std::string(npub_ms_last_error()),
            "npubridge.mindspore: op 'aten::mm.out': the custom op passes 2 tensors and the binding expects "
            "2 inputs "
            "and 1 outputs");

  AotCall mismatched;  // (2x3) @ (2x3): the dispatcher's own check
  mismatched.add(x.data(), {2, 3}, "float32");
  mismatched.add(w.data(), {2, 3}, "float32");
  mismatched.add(out.data(), {2, 2}, "float32");
  EXPECT_EQ(mismatched.run(slot), 1);
  EXPECT_NE(std::string(npub_ms_last_error()).find("mm"), std::string::npos) << npub_ms_last_error();

  AotCall unknown_dtype;
  unknown_dtype.add(x.data(), {2, 3}, "complex64");
  unknown_dtype.add(w.data(), {3, 2}, "float32");
  unknown_dtype.add(out.data(), {2, 2}, "float32");
  EXPECT_EQ(unknown_dtype.run(slot), 1);
  EXPECT_EQ(std::string(npub_ms_last_error()),
            "npubridge.mindspore: op 'aten::mm.out': tensor 0 has dtype 'complex64', which npubridge does "
            "not know");
}

TEST_F(MindSporeHost, ThePlanSaysWhichPluginServesOrWhyNone) {
  const int slot = npub_ms_bind("aten::relu", "t0", "r0");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  std::vector<int64_t> shape = {4};
  int64_t* shapes[] = {shape.data(), shape.data()};
  int ndims[] = {1, 1};
  double scalars[] = {0, 0};
  char plugin[64], conversion[64], reason[512];
  const char* f32[] = {"float32", "float32"};
  EXPECT_EQ(npub_ms_plan(slot, 2, ndims, shapes, f32, scalars, plugin, 64, conversion, 64, reason, 512), 1);
  EXPECT_EQ(std::string(plugin), "cann_like");
  EXPECT_EQ(std::string(conversion), "");
  const char* b8[] = {"bool", "bool"};
  EXPECT_EQ(npub_ms_plan(slot, 2, ndims, shapes, b8, scalars, plugin, 64, conversion, 64, reason, 512), 0);
  EXPECT_EQ(std::string(reason).rfind("no kernel accepts dtype bool", 0), 0u) << reason;
}

TEST_F(MindSporeHost, AFailedCallIsReportedToEveryThread) {
  const int slot = npub_ms_bind("aten::mm.out", "t0 t1 o0", "a2");
  ASSERT_GE(slot, 0) << npub_ms_last_error();
  std::vector<float> x(6), out(4);
  std::thread worker([&] {  // MindSpore runs AOT kernels on threads of its own
    AotCall bad;
    bad.add(x.data(), {2, 3}, "complex64");
    bad.add(x.data(), {3, 2}, "float32");
    bad.add(out.data(), {2, 2}, "float32");
    EXPECT_EQ(bad.run(slot), 1);
  });
  worker.join();
  char message[512];
  npub_ms_last_call_error(message, sizeof message);
  EXPECT_EQ(std::string(message),
            "npubridge.mindspore: op 'aten::mm.out': tensor 0 has dtype 'complex64', which npubridge does "
            "not know");
}

TEST_F(MindSporeHost, CheckingALayoutBindsNothing) {
  const int before = npub_ms_bind("aten::relu", "t0", "r0");
  ASSERT_GE(before, 0) << npub_ms_last_error();
  EXPECT_EQ(npub_ms_check_layout("aten::relu", "t0", "r0"), 0);
  EXPECT_EQ(npub_ms_check_layout("aten::relu", "t0 t1", "r0"), -1);
  EXPECT_EQ(npub_ms_bind("aten::relu", "t0", "r0"), before + 1);
}
