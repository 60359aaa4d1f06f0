#include "sample_kit.h"

#include <ATen/CPUGeneratorImpl.h>

#include <limits>
#include <stdexcept>
#include <utility>

namespace npub::conformance {

namespace {

uint64_t g_seed = 0;

template <typename Fn>
void add_once(std::map<std::string, Fn>& table, const char* what, const std::string& op, Fn fn) {
  if (!table.emplace(op, std::move(fn)).second)
    throw std::logic_error("npub-conformance: two " + std::string(what) + " for " + op +
                           " (each op belongs to one sample family)");
}

}  // namespace

void SampleTable::samples(const std::string& op, SampleFn fn) {
  add_once(samples_, "sample specifications", op, std::move(fn));
}
void SampleTable::reference(const std::string& op, ReferenceFn fn) {
  add_once(references_, "references", op, std::move(fn));
}
void SampleTable::property(const std::string& op, PropertyFn fn) {
  add_once(properties_, "property checks", op, std::move(fn));
}

void seed_samples(const std::string& key) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  g_seed = h;
}

uint64_t next_seed() { return g_seed = g_seed * 6364136223846793005ULL + 1442695040888963407ULL; }
at::Generator sample_generator() { return at::detail::createCPUGenerator(next_seed()); }

at::Tensor make(at::IntArrayRef shape, ScalarType dt, int kind) {
  at::Generator gen = at::detail::createCPUGenerator(next_seed());
  at::Tensor t;
  if (dt == at::kBool) {
    t = at::randint(0, 2, shape, gen, at::TensorOptions().dtype(at::kLong)).to(at::kBool);
  } else if (is_float(dt)) {
    t = (at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble)) * 6 - 3);
    if (kind == 1) t = t.abs() + 0.25;
    t = t.to(dt);
    if (kind == 2 && t.numel() >= 8) {
      auto flat = t.view({-1});
      flat[0] = std::numeric_limits<double>::quiet_NaN();
      flat[1] = std::numeric_limits<double>::infinity();
      flat[2] = -std::numeric_limits<double>::infinity();
      flat[3] = 0.0;
      flat[4] = -0.0;
    }
  } else {
    const bool unsigned_t = dt == at::kByte;
    const int64_t lo = kind == 1 ? 1 : (unsigned_t ? 0 : -9);
    t = at::randint(lo, 10, shape, gen, at::TensorOptions().dtype(at::kLong)).to(dt);
  }
  return t;
}

at::Tensor make_t(int64_t a, int64_t b, ScalarType dt, int kind) { return make({b, a}, dt, kind).t(); }
at::Tensor make_sliced(int64_t a, int64_t b, ScalarType dt, int kind) {
  return make({a, 2 * b}, dt, kind).slice(1, 0, 2 * b, 2);
}

at::Tensor long_tensor(std::vector<int64_t> v, std::vector<int64_t> shape) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).reshape(shape);
}
at::Tensor rand_index(std::vector<int64_t> shape, int64_t bound, ScalarType dt) {
  at::Generator gen = at::detail::createCPUGenerator(next_seed());
  return at::randint(0, std::max<int64_t>(bound, 1), shape, gen, at::TensorOptions().dtype(at::kLong)).to(dt);
}

at::Tensor empty_out(ScalarType dt) { return at::empty({0}, at::TensorOptions().dtype(dt)); }

ScalarType out_dtype(OutRule rule, ScalarType result) {
  switch (rule) {
    case OutRule::boolean:
      return at::kBool;
    case OutRule::float_if_int:
      return at::isIntegralType(result, true) ? at::kFloat : result;
    case OutRule::int64_if_int:
      return at::isIntegralType(result, true) ? at::kLong : result;
    default:
      return result;
  }
}

std::vector<at::Tensor> unary_inputs(ScalarType dt) {
  std::vector<at::Tensor> v{make({5, 7}, dt), make({}, dt),          make({0}, dt),
                            make_t(6, 5, dt), make_sliced(4, 6, dt), make({256, 512}, dt)};
  if (is_float(dt)) v.push_back(make({4, 4}, dt, 2));
  return v;
}
const char* const kUnaryNames[7] = {"[5,7]", "0-d", "empty", "transposed", "sliced", "large", "inf/nan/-0"};

SampleFn error_cases_for(SampleFn fn, std::function<bool(ScalarType)> refused) {
  return [fn = std::move(fn), refused = std::move(refused)](ScalarType dt) {
    std::vector<Sample> out = fn(dt);
    if (refused(dt))
      for (Sample& sm : out) sm.name += " (error)";
    return out;
  };
}

}  // namespace npub::conformance
