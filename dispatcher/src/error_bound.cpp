// The comparison of Note [The error model] (error_bound.h): ulps, the
// per-element bound, and the verdict with the derivation of its worst
// element. The per-op entries are in error_models.cpp.
#include <npubridge/dispatcher/error_bound.h>

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/registry/schema.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace npub::numerics {

namespace {

struct Format {
  int precision;  // significand bits, the implicit one included
  int emin;       // exponent of the smallest normal
  double max;     // largest finite value
};

Format format_of(DType d) {
  switch (d) {
    case DType::kFloat64:
      return {53, -1022, std::numeric_limits<double>::max()};
    case DType::kFloat16:
      return {11, -14, 65504.0};
    case DType::kBFloat16:
      return {8, -126, 3.3895313892515355e38};
    default:
      return {24, -126, static_cast<double>(std::numeric_limits<float>::max())};
  }
}

// The magnitude at which round-to-nearest in d gives infinity.
double overflow_threshold(DType d) {
  const Format f = format_of(d);
  return f.max + std::ldexp(0.5, std::ilogb(f.max) - f.precision + 1);
}

const char* kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::kExact:
      return "exact";
    case ErrorKind::kSameDtype:
      return "same-dtype reference";
    case ErrorKind::kRounded:
      return "elementwise, rounded once";
    case ErrorKind::kAccumulated:
      return "accumulated";
    case ErrorKind::kHostCalibrated:
      return "host-calibrated";
  }
  return "?";
}

const char* magnitude_name(Magnitude m) {
  switch (m) {
    case Magnitude::kAbsInputs:
      return "sum|terms| (the op on |inputs|)";
    case Magnitude::kResult:
      return "|reference|";
    case Magnitude::kScale:
      return "max |input or result|";
  }
  return "?";
}

// kHostCalibrated (Note [The error model]): ulps at the element and at the
// tensor's largest value, and the multiple of the host's own worst error
// over the tensor. Another correct summation order lands a few times
// further from the exact result than the host did, not orders of
// magnitude; and where it does so varies (softmax gradients: wherever the
// cancellation is worst), so the calibration is tensor-wide, not per
// element.
constexpr double kHostUlps = 4, kHostLargestUlps = 2, kHostFactor = 4;

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

double round_to(DType d, double x) {
  if (!std::isfinite(x) || x == 0 || d == DType::kFloat64) return x;
  const Format f = format_of(d);
  const int e = std::max(std::ilogb(x), f.emin);
  const double scaled = std::nearbyint(std::ldexp(x, f.precision - 1 - e));
  return std::ldexp(scaled, e - f.precision + 1);
}

// ---------------------------------------------------------------------------
// CallArgs
// ---------------------------------------------------------------------------

NpubValue CallArgs::get(const char* name) const {
  for (size_t i = 0; i < schema_.arguments.size() && static_cast<int32_t>(i) < num_args_; ++i)
    if (schema_.arguments[i].name == name) return args_[i];
  NpubValue none{};
  none.tag = NPUB_VALUE_NONE;
  return none;
}

int64_t CallArgs::size(const char* name, int64_t dim) const {
  const NpubValue v = get(name);
  if (v.tag != NPUB_VALUE_TENSOR || v.u.tensor == nullptr) return 1;
  const DLTensor& t = *v.u.tensor;
  if (dim < 0) dim += t.ndim;
  if (dim < 0 || dim >= t.ndim) return 1;
  return t.shape[dim];
}

int64_t CallArgs::numel(const char* name) const {
  const NpubValue v = get(name);
  if (v.tag != NPUB_VALUE_TENSOR || v.u.tensor == nullptr) return 1;
  int64_t n = 1;
  for (int32_t d = 0; d < v.u.tensor->ndim; ++d) n *= v.u.tensor->shape[d];
  return n;
}

int64_t CallArgs::reduced(const char* tensor, const char* dims) const {
  const NpubValue t = get(tensor);
  if (t.tag != NPUB_VALUE_TENSOR || t.u.tensor == nullptr) return 1;
  const int32_t ndim = t.u.tensor->ndim;
  const NpubValue d = get(dims);
  std::vector<int64_t> list;
  if (d.tag == NPUB_VALUE_INT) list.push_back(d.u.i);
  if (d.tag == NPUB_VALUE_INT_LIST) list.assign(d.u.ints, d.u.ints + d.count);
  if (list.empty()) return numel(tensor);
  int64_t n = 1;
  for (int64_t dim : list) n *= size(tensor, dim < 0 ? dim + ndim : dim);
  return n;
}

int64_t CallArgs::list_numel(const char* name) const {
  const NpubValue v = get(name);
  int64_t n = 0;
  if (v.tag == NPUB_VALUE_TENSOR_LIST)
    for (int32_t i = 0; i < v.count; ++i) {
      const DLTensor* t = v.u.tensors[i];
      if (t == nullptr) continue;
      int64_t e = 1;
      for (int32_t d = 0; d < t->ndim; ++d) e *= t->shape[d];
      n = std::max(n, e);
    }
  return n;
}

int64_t CallArgs::product(const char* name) const {
  const NpubValue v = get(name);
  int64_t n = 1;
  if (v.tag == NPUB_VALUE_INT_LIST)
    for (int32_t i = 0; i < v.count; ++i) n *= v.u.ints[i];
  if (v.tag == NPUB_VALUE_INT) n = v.u.i;
  return n;
}

// ---------------------------------------------------------------------------
// ulps
// ---------------------------------------------------------------------------

int precision_bits(DType d) { return is_floating(d) ? format_of(d).precision : 0; }

double unit_roundoff(DType d) { return std::ldexp(1.0, -format_of(d).precision); }

double ulp(DType d, double x) {
  const Format f = format_of(d);
  x = std::fabs(x);
  if (!std::isfinite(x)) x = f.max;
  x = std::min(x, f.max);
  const int e = x == 0 ? f.emin : std::max(std::ilogb(x), f.emin);
  return std::ldexp(1.0, e - f.precision + 1);
}

DType accumulate_dtype(DType d) { return d == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

// ---------------------------------------------------------------------------
// the verdict
// ---------------------------------------------------------------------------

std::string Verdict::message() const {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%lld of %lld elements exceed their error bound; worst at flat index %lld: got %.9g, reference %.9g",
      static_cast<long long>(mismatched), static_cast<long long>(numel), static_cast<long long>(worst_index),
      got, reference);
  return std::string(buf) + " (error " + fmt(error) + " > bound " + fmt(bound) + ": " + derivation + ")";
}

Verdict compare(const ErrorModel& model, const Comparison& c) {
  Verdict v;
  v.numel = c.numel;
  const DType d = c.dtype;
  const bool floating = is_floating(d);
  ErrorKind kind = floating ? model.kind : ErrorKind::kExact;
  if (kind == ErrorKind::kAccumulated && c.terms == 0) kind = ErrorKind::kExact;
  if (kind == ErrorKind::kHostCalibrated && c.host == nullptr) kind = ErrorKind::kRounded;
  // kHostCalibrated: the host's worst error against the reference, and the
  // largest finite reference value.
  double host_error = 0, largest = 0;
  if (kind == ErrorKind::kHostCalibrated)
    for (int64_t i = 0; i < c.numel; ++i) {
      const double e = std::fabs(c.host[i] - c.reference[i]);
      if (std::isfinite(e)) host_error = std::max(host_error, e);
      if (std::isfinite(c.reference[i])) largest = std::max(largest, std::fabs(c.reference[i]));
    }
  const double calibrated = floating ? kHostLargestUlps * ulp(d, largest) + kHostFactor * host_error : 0;
  const DType acc = model.accumulates_in_output ? d : accumulate_dtype(d);
  const double u_acc = floating ? unit_roundoff(acc) : 0;
  const double k = static_cast<double>(c.terms);
  double gamma = k * u_acc < 1 ? k * u_acc / (1 - k * u_acc) : std::numeric_limits<double>::infinity();
  // A float64 result is held to a float64 reference that carries the same
  // kind of error: the two may differ by twice the bound.
  if (acc == DType::kFloat64) gamma *= 2;
  const double overflow = floating ? overflow_threshold(d) : 0;

  double worst_excess = -1;
  for (int64_t i = 0; i < c.numel; ++i) {
    const double g = c.got[i], y = c.reference[i];
    double bound = 0;
    bool bad;
    if (std::isnan(y) || std::isnan(g)) {
      bad = std::isnan(y) != std::isnan(g);
    } else if (std::isinf(y) || (floating && std::fabs(y) >= overflow)) {
      bad = !(std::isinf(g) && std::signbit(g) == std::signbit(y));
    } else if (std::isinf(g)) {
      bad = true;
    } else {
      const double ulps = floating ? model.ulps * ulp(d, y) : 0;
      switch (kind) {
        case ErrorKind::kExact:
          bound = 0;
          break;
        case ErrorKind::kSameDtype:
          bound = ulps;
          break;
        case ErrorKind::kRounded:
          bound = ulps;
          break;
        case ErrorKind::kAccumulated: {
          double m = c.scale;
          if (model.magnitude == Magnitude::kAbsInputs)
            m = c.magnitude ? std::fabs(c.magnitude[i]) : std::fabs(y);
          if (model.magnitude == Magnitude::kResult) m = std::fabs(y);
          bound = gamma * m + ulps;
          break;
        }
        case ErrorKind::kHostCalibrated:
          bound = kHostUlps * ulp(d, y) + calibrated;
          break;
      }
      bad = !(std::fabs(g - y) <= bound);
      if (bad && kind == ErrorKind::kSameDtype && c.alternative != nullptr &&
          std::isfinite(c.alternative[i])) {
        const double alt = round_to(d, c.alternative[i]);
        bad = !(std::fabs(g - alt) <= (floating ? model.ulps * ulp(d, alt) : 0));
      }
    }
    if (!bad) continue;
    ++v.mismatched;
    const double excess =
        std::isfinite(g - y) ? std::fabs(g - y) - bound : std::numeric_limits<double>::infinity();
    if (excess > worst_excess) {
      worst_excess = excess;
      v.worst_index = i;
      v.got = g;
      v.reference = y;
      v.error = std::fabs(g - y);
      v.bound = bound;
    }
  }
  if (v.mismatched == 0) return v;

  // How the worst element's bound came about.
  const double y = v.reference;
  std::string dt = dtype_name(d);
  switch (kind) {
    case ErrorKind::kExact:
      v.derivation = floating
                         ? std::string("exact (") +
                               (model.why[0] ? model.why : "values are moved or selected, not computed") + ")"
                         : "exact (" + dt + " result)";
      break;
    case ErrorKind::kSameDtype:
    case ErrorKind::kRounded:
      v.derivation = fmt(model.ulps) + " ulp of " + dt + " at |" + fmt(y) + "| (" + kind_name(kind) +
                     (kind == ErrorKind::kSameDtype && c.alternative != nullptr
                          ? ", or of the float64 result rounded to " + dt
                          : "") +
                     ")";
      break;
    case ErrorKind::kAccumulated: {
      double m = c.scale;
      if (model.magnitude == Magnitude::kAbsInputs)
        m = c.magnitude ? std::fabs(c.magnitude[v.worst_index]) : std::fabs(y);
      if (model.magnitude == Magnitude::kResult) m = std::fabs(y);
      v.derivation = "K*u*m + " + fmt(model.ulps) + " ulp, K = " + std::to_string(c.terms) +
                     " terms, u = 2^" + std::to_string(-format_of(acc).precision) + " (" + dtype_name(acc) +
                     " accumulation), m = " + fmt(m) + " = " + magnitude_name(model.magnitude) +
                     ", 1 ulp of " + dt + " = " + fmt(ulp(d, y));
      break;
    }
    case ErrorKind::kHostCalibrated:
      v.derivation = "4 ulp of " + dt + " at |" + fmt(y) + "|, 2 at the largest |value| " + fmt(largest) +
                     ", + 4 * " + fmt(host_error) +
                     " (the host's own worst error against float64; no error model for this op)";
      break;
  }
  if (model.why[0] && kind != ErrorKind::kExact) v.derivation += "; " + std::string(model.why);
  return v;
}

int64_t terms(const ErrorModel& model, const reg::Schema& schema, const NpubValue* args, int32_t num_args) {
  if (model.kind != ErrorKind::kAccumulated) return 0;
  return model.terms ? model.terms(CallArgs(schema, args, num_args)) : 1;
}

double input_scale(const reg::Schema& schema, const NpubValue* args, int32_t num_args) {
  double scale = 0;
  auto visit = [&](const DLTensor* t) {
    if (t == nullptr || !is_floating(dtype_of(t->dtype))) return;
    for (double x : sim::read_doubles(*t))
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  };
  for (int32_t a = 0; a < num_args && static_cast<size_t>(a) < schema.arguments.size(); ++a) {
    if (schema.arguments[a].is_write()) continue;
    if (args[a].tag == NPUB_VALUE_TENSOR) visit(args[a].u.tensor);
    if (args[a].tag == NPUB_VALUE_TENSOR_LIST)
      for (int32_t j = 0; j < args[a].count; ++j) visit(args[a].u.tensors[j]);
  }
  return scale;
}

}  // namespace npub::numerics
