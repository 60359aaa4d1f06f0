// Helpers shared by the unit tests: an isolated runtime, plugin paths, and a
// small "host framework" whose implementations serve as the fallback.
#pragma once

#include <npubridge/dispatcher/runtime.h>
#include <npubridge/dispatcher/value.h>
#include <npubridge/support/error.h>

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace npub::test {

std::string test_plugin(const std::string& name);     // tests/plugins/lib<name>.so
std::string builtin_plugin(const std::string& name);  // lib/npubridge/plugins/lib<name>.so

// A runtime with no plugins loaded, 2 devices of `memory` bytes, 2 threads.
std::unique_ptr<Runtime> make_runtime(uint64_t memory = 1ull << 30);
// Loads a plugin and fails the test with the loader's message if rejected.
void load_ok(Runtime& rt, const std::string& path);

// The test host's own implementations (the fallback): testsel ops, testc
// ops and aten::add.out / aten::mul.out on same-shape tensors. Records the
// ops it served.
struct ReferenceHost {
  std::vector<std::string> served;
  std::vector<std::string> reasons;  // FallbackCall::reason of each
  std::vector<void*> host_calls;     // FallbackCall::host_call of each
  void install(Dispatcher& d, bool keeps_aliasing = false);
};

// The fixture of the dispatcher, resolved-call and graph-capture tests: a
// runtime (make_runtime) with the testsel test plugin and cann_like loaded,
// the ReferenceHost as its fallback, and its device 0.
class TestselAndCannLike : public ::testing::Test {
 protected:
  void SetUp() override;
  // A float32 tensor on `dev` holding `values`.
  Tensor f32(const std::vector<int64_t>& shape, const std::vector<double>& values) const;

  std::unique_ptr<Runtime> rt;
  ReferenceHost host;
  sim::Device* dev = nullptr;
};

// Sets an environment variable for a scope; the previous value (or its
// absence) comes back at the end. A null value unsets it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 0);

// A sum of products computed in fp32 and rounded once to `dtype`, checked
// against its float64 value: |got - exact| <= k * 2^-24 * magnitude + ulp,
// where magnitude is the sum of the terms' absolute values (|A||B| for a
// product) and ulp is numerics::ulp in `dtype` (0 for an integer dtype).
// Returns "" or a message naming the element.
std::string check_sum_of_products(const std::vector<double>& got, const std::vector<double>& exact,
                                  const std::vector<double>& magnitude, int64_t k, DType dtype);
// The exception message of f(), or "" when it did not throw npub::Error.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace npub::test
