#include "test_util.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/error_bound.h>
#include <npubridge/support/error.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace npub::test {

std::string test_plugin(const std::string& name) {
  return std::string(NPUB_TEST_PLUGIN_DIR) + "/lib" + name + ".so";
}
std::string builtin_plugin(const std::string& name) {
  return std::string(NPUB_BUILTIN_PLUGIN_DIR) + "/lib" + name + ".so";
}

std::unique_ptr<Runtime> make_runtime(uint64_t memory) {
  RuntimeOptions o;
  o.devices.num_devices = 2;
  o.devices.memory_bytes = memory;
  o.devices.compute_threads = 2;
  o.load_default_plugins = false;
  o.load_default_op_map = false;
  return std::make_unique<Runtime>(o);
}

void load_ok(Runtime& rt, const std::string& path) {
  LoadResult r = rt.loader().load(path);
  ASSERT_TRUE(r.ok) << r.error;
}

void TestselAndCannLike::SetUp() {
  rt = make_runtime();
  load_ok(*rt, test_plugin("npub_test_testsel"));
  load_ok(*rt, builtin_plugin("npub_cann_like"));
  host.install(rt->dispatcher());
  dev = &rt->devices().at(0);
}

Tensor TestselAndCannLike::f32(const std::vector<int64_t>& shape, const std::vector<double>& values) const {
  return Tensor::from_values(shape, DType::kFloat32, values, dev);
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) {
    had_ = true;
    old_ = old;
  }
  if (value != nullptr)
    setenv(name, value, 1);
  else
    unsetenv(name);
}
ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(name_.c_str(), old_.c_str(), 1);
  else
    unsetenv(name_.c_str());
}

void expect_values(const Tensor& t, const std::vector<double>& expected, double tol) {
  const std::vector<double> got = t.to_doubles();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], tol) << "at flat index " << i;
}

std::string check_sum_of_products(const std::vector<double>& got, const std::vector<double>& exact,
                                  const std::vector<double>& magnitude, int64_t k, DType dtype) {
  if (got.size() != exact.size())
    return "got " + std::to_string(got.size()) + " elements, expected " + std::to_string(exact.size());
  const double u = std::ldexp(1.0, -24);
  for (size_t i = 0; i < got.size(); ++i) {
    const double rounding = is_floating(dtype) ? numerics::ulp(dtype, exact[i]) : 0;
    const double bound = static_cast<double>(std::max<int64_t>(k, 1)) * u * magnitude[i] + rounding;
    const double err = std::fabs(got[i] - exact[i]);
    if (!(err <= bound))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
             std::to_string(exact[i]) + " (error " + std::to_string(err) + " > bound " +
             std::to_string(bound) + ")";
  }
  return "";
}

namespace {

DLTensor* new_output(OutputAllocator& outs, int32_t i, const DLTensor& like, DLDataType dtype) {
  return outs.allocate(i, like.device, like.ndim, like.shape, dtype);
}

}  // namespace

void ReferenceHost::install(Dispatcher& d, bool keeps_aliasing) {
  auto fallback = [this](const FallbackCall& call) {
    const std::string& name = call.op.name();
    const NpubValue* args = call.args;
    NpubValue* rets = call.rets;
    OutputAllocator& outs = call.outputs;
    served.push_back(name);
    reasons.push_back(call.reason);
    host_calls.push_back(call.host_call);
    const DLTensor& x = *args[0].u.tensor;
    std::vector<double> v = sim::read_doubles(x);
    if (name == "testsel::which") {
      sim::write_doubles(*args[1].u.tensor, std::vector<double>(v.size(), -1));
    } else if (name == "testsel::twice") {
      for (double& e : v) e *= 2;
      sim::write_doubles(*args[1].u.tensor, v);
    } else if (name == "testsel::decline") {
      for (double& e : v) e *= 3;
      DLTensor* out = new_output(outs, 0, x, x.dtype);
      sim::write_doubles(*out, v);
      rets[0] = tensor_value(out);
    } else if (name == "testsel::decline_many") {
      for (int32_t i = 0; i < 9; ++i) {
        std::vector<double> w = v;
        for (double& e : w) e *= i + 1;
        DLTensor* out = new_output(outs, i, x, x.dtype);
        sim::write_doubles(*out, w);
        rets[i] = tensor_value(out);
      }
    } else if (name == "testsel::sloppy" || name == "testsel::twice_fn") {
      if (name == "testsel::twice_fn")
        for (double& e : v) e *= 2;
      DLTensor* out = new_output(outs, 0, x, x.dtype);
      sim::write_doubles(*out, v);
      rets[0] = tensor_value(out);
    } else if (name == "aten::add.out" || name == "aten::mul.out") {
      const std::vector<double> w = sim::read_doubles(*args[1].u.tensor);
      if (w.size() != v.size()) throw Error(ErrorCode::kUnsupported, "reference host: same shapes only");
      const double alpha = name == "aten::add.out"
                               ? (args[2].tag == NPUB_VALUE_DOUBLE ? args[2].u.d : double(args[2].u.i))
                               : 0;
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = name == "aten::add.out" ? v[i] + alpha * w[i] : v[i] * w[i];
      sim::write_doubles(*args[name == "aten::add.out" ? 3 : 2].u.tensor, v);
    } else {
      throw Error(ErrorCode::kUnsupported, "reference host has no implementation of " + name);
    }
  };
  d.set_fallback(fallback, keeps_aliasing);
}

}  // namespace npub::test
