// Ops whose results are random: the in-place random fills and dropout,
// judged by their properties (the distribution's moments, dropout's mask
// and scale), and dropout's backward, which is not random.
#include "sample_kit.h"

#include <cmath>
#include <string>

namespace npub::conformance {
namespace {

SampleFn random_fill_spec(std::vector<std::vector<IValue>> params) {
  return [params](ScalarType dt) {
    std::vector<Sample> out;
    for (const auto& p : params) {
      std::vector<IValue> args{make({256, 256}, dt)};
      for (const auto& v : p) args.push_back(v);
      args.push_back(IValue());  // generator
      std::string name = "large, params";
      for (const auto& v : p) name += " " + std::to_string(v.toDouble());
      out.push_back({name, args});
      std::vector<IValue> small = args;
      small[0] = make({3, 5}, dt);
      out.push_back({"small", small});
    }
    return out;
  };
}

SampleFn dropout_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"p 0.5 large", {make({256, 512}, dt), IValue(0.5), IValue(true)}});
    out.push_back({"p 0.1 large", {make({256, 512}, dt), IValue(0.1), IValue()}});
    out.push_back({"p 0.9", {make({64, 64}, dt), IValue(0.9), IValue(true)}});
    out.push_back({"p 0", {make({5, 7}, dt), IValue(0.0), IValue(true)}});
    out.push_back({"p 1", {make({5, 7}, dt), IValue(1.0), IValue(true)}});
    out.push_back({"not training", {make({5, 7}, dt), IValue(0.5), IValue(false)}});
    out.push_back({"0-d", {make({}, dt), IValue(0.5), IValue(true)}});
    out.push_back({"p 1.5 (error)", {make({5}, dt), IValue(1.5), IValue(true)}});
    return out;
  };
}

// native_dropout_backward(grad_output, mask, scale): kept and dropped
// elements with dropout's scales (1 / (1 - p), and 0 for p = 1).
SampleFn dropout_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"p 0.3", {make({64, 33}, dt), make({64, 33}, at::kBool), IValue(1 / 0.7)}});
    out.push_back({"p 0.5 3-d", {make({4, 5, 6}, dt), make({4, 5, 6}, at::kBool), IValue(2.0)}});
    out.push_back({"p 1", {make({5, 7}, dt), make({5, 7}, at::kBool), IValue(0.0)}});
    out.push_back({"0-d", {make({}, dt), make({}, at::kBool), IValue(2.0)}});
    out.push_back({"mask of another shape (error)", {make({5}, dt), make({4}, at::kBool), IValue(2.0)}});
    return out;
  };
}

// random_.from: (self, int from, int? to, *, Generator? generator); judged by its properties.
SampleFn random_from_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    const bool small = dt == at::kByte || dt == at::kChar || dt == at::kBool || dt == at::kBFloat16;
    const int64_t lo = dt == at::kByte || dt == at::kBool ? 0 : -5, hi = dt == at::kBool ? 2
                                                                         : small         ? 100
                                                                                         : 1000;
    out.push_back({"large, [" + std::to_string(lo) + ", " + std::to_string(hi) + ")",
                   {make({256, 256}, dt), lo, hi, IValue()}});
    out.push_back({"small", {make({3, 5}, dt), lo, hi, IValue()}});
    out.push_back({"from == to (error)", {make({4}, dt), int64_t{3}, int64_t{3}, IValue()}});
    return out;
  };
}

// Mean and spread of a random fill against its distribution (6 sigma).
std::string check_moments(const at::Tensor& t, double mean, double sd, double lo, double hi) {
  const at::Tensor d = t.to(at::kDouble);
  if (d.numel() == 0) return "";
  if (d.min().item<double>() < lo || d.max().item<double>() > hi)
    return "values outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (d.numel() < 1000) return "";
  const double m = d.mean().item<double>(), s = d.std().item<double>();
  const double tol = 6 * sd / std::sqrt(static_cast<double>(d.numel())) + 1e-2 * std::fabs(sd);
  if (std::fabs(m - mean) > tol)
    return "mean " + std::to_string(m) + ", expected " + std::to_string(mean) + " +- " + std::to_string(tol);
  if (sd > 0 && std::fabs(s - sd) > 0.05 * sd)
    return "std " + std::to_string(s) + ", expected " + std::to_string(sd) + " +- 5%";
  return "";
}

}  // namespace

void add_random_samples(SampleTable& t) {
  t.samples("aten::random_.from", random_from_spec());
  t.samples("aten::native_dropout", dropout_spec());
  t.samples("aten::native_dropout_backward", dropout_backward_spec());
  t.samples("aten::uniform_", random_fill_spec({{IValue(0.0), IValue(1.0)}, {IValue(-2.0), IValue(3.0)}}));
  t.samples("aten::normal_", random_fill_spec({{IValue(0.0), IValue(1.0)}, {IValue(2.0), IValue(0.5)}}));
  t.samples("aten::bernoulli_.float", random_fill_spec({{IValue(0.3)}, {IValue(0.9)}}));
  t.samples("aten::exponential_", random_fill_spec({{IValue(1.0)}, {IValue(2.5)}}));
  t.property("aten::uniform_",
             [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
               const double lo = a[1].toDouble(), hi = a[2].toDouble();
               if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes()))
                 return "expected self back";
               return check_moments(got[0], (lo + hi) / 2, (hi - lo) / std::sqrt(12.0), lo, hi);
             });
  t.property("aten::normal_",
             [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
               if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes()))
                 return "expected self back";
               return check_moments(got[0], a[1].toDouble(), a[2].toDouble(), -1e30, 1e30);
             });
  t.property("aten::bernoulli_.float",
             [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
               const double p = a[1].toDouble();
               if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes()))
                 return "expected self back";
               const at::Tensor d = got[0].to(at::kDouble);
               if (!d.eq(0).logical_or(d.eq(1)).all().item<bool>()) return "values other than 0 and 1";
               return check_moments(got[0], p, std::sqrt(p * (1 - p)), 0, 1);
             });
  t.property("aten::exponential_",
             [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
               // Exp(lambda): mean and standard deviation 1 / lambda, never 0
               // (ATen's exponential_ excludes it: vLLM's sampler divides by it).
               const double l = a[1].toDouble();
               if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes()))
                 return "expected self back";
               if (!got[0].to(at::kDouble).gt(0).all().item<bool>()) return "a value <= 0";
               return check_moments(got[0], 1 / l, 1 / l, 0, 1e30);
             });
  t.property("aten::random_.from",
             [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
               const double lo = static_cast<double>(a[1].toInt()),
                            hi = static_cast<double>(a[2].toInt()) - 1;
               if (got.size() != 1 || !got[0].sizes().equals(a[0].toTensor().sizes()))
                 return "expected self back";
               const at::Tensor d = got[0].to(at::kDouble);
               if (!at::equal(d, d.floor())) return "values that are not integers";
               // The discrete uniform distribution on [lo, hi].
               const double n = hi - lo + 1;
               return check_moments(got[0], (lo + hi) / 2, std::sqrt((n * n - 1) / 12), lo, hi);
             });
  t.property(
      "aten::native_dropout",
      [](const std::vector<IValue>& a, const std::vector<at::Tensor>& got) -> std::string {
        const at::Tensor x = a[0].toTensor();
        const double p = a[1].toDouble();
        const bool train = a[2].isNone() || a[2].toBool();
        if (got.size() != 2) return "expected (output, mask)";
        const at::Tensor out = got[0], mask = got[1];
        if (mask.scalar_type() != at::kBool) return "mask is not bool";
        if (!out.sizes().equals(x.sizes()) || !mask.sizes().equals(x.sizes()))
          return "output or mask shape differs from input";
        if (out.scalar_type() != x.scalar_type()) return "output dtype differs from input";
        if (!train || p == 0) {
          if (!mask.all().item<bool>()) return "mask must be all true when not training or p == 0";
          if (!at::equal(out, x)) return "output must equal input when not training or p == 0";
          return "";
        }
        const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
        const at::Tensor expect = (x.to(at::kDouble) * mask.to(at::kDouble) * scale).to(x.scalar_type());
        if (!at::allclose(out.to(at::kDouble), expect.to(at::kDouble), 1e-3, 1e-6))
          return "output != input * mask / (1 - p)";
        const double n = static_cast<double>(x.numel());
        if (n >= 1000) {
          const double kept = mask.to(at::kDouble).sum().item<double>();
          const double mean = n * (1 - p), sd = std::sqrt(n * p * (1 - p));
          if (std::fabs(kept - mean) > 6 * sd + 1)
            return "kept " + std::to_string(kept) + " of " + std::to_string(n) + " elements; expected " +
                   std::to_string(mean) + " +- 6 sigma (" + std::to_string(6 * sd) + ")";
        }
        return "";
      });
}

}  // namespace npub::conformance
