// Precision-check mode: run the kernel and the host framework's fallback on
// the same inputs and judge every output under the op's error model
// (error_bound.h): the fallback also runs on float64 copies of the inputs
// (and on their absolute values for sums), where the host can.
#include "call_state.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/dispatcher/error_bound.h>
#include <npubridge/dispatcher/tensor.h>
#include <npubridge/support/error.h>
#include <npubridge/support/shape.h>
#include "logging.h"

#include <cmath>
#include <cstdio>
#include <exception>

namespace npub {

namespace {

// Set while this thread runs a check's references: the calls the host makes
// inside them (its copies to and from the device) are not checked in turn.
thread_local bool tls_in_reference = false;

class InReference {
 public:
  InReference() : was_(tls_in_reference) { tls_in_reference = true; }
  ~InReference() { tls_in_reference = was_; }
  InReference(const InReference&) = delete;
  InReference& operator=(const InReference&) = delete;

 private:
  bool was_;
};

}  // namespace

bool Dispatcher::checking_reference() { return tls_in_reference; }

namespace {

// PyTorch's c10::ScalarType numbers, as a ScalarType argument carries them
// (plugin_api.h's value table): the floating ones, and float64.
constexpr int64_t kTorchFloat16 = 5, kTorchFloat32 = 6, kTorchFloat64 = 7, kTorchBFloat16 = 15;

bool is_torch_floating_scalar_type(int64_t t) {
  return t == kTorchFloat16 || t == kTorchFloat32 || t == kTorchFloat64 || t == kTorchBFloat16;
}

// Once per op: why the check leaves its calls unjudged.
void warn_unjudged(const reg::OpEntry& op, const std::string& why) {
  if (!op.stats().unjudged_warned.exchange(true))
    log().warn("precision check: op '{}' is not judged: {}", op.name(), why);
}

}  // namespace

std::string PrecisionMismatch::message() const {
  if (!note.empty())
    return "precision check failed for op '" + op + "' (plugin '" + plugin + "'), " + output + ": " + note;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "precision check failed for op '%s' (plugin '%s'), %s: %lld of %lld elements "
                "exceed their error bound against the host framework; worst at flat index %lld: kernel %.9g, "
                "reference %.9g (abs error %.3g, rel error %.3g, bound %.3g",
                op.c_str(), plugin.c_str(), output.c_str(), static_cast<long long>(num_mismatched),
                static_cast<long long>(numel), static_cast<long long>(worst_index), kernel_value,
                reference_value, abs_error, rel_error, bound);
  return std::string(buf) + (derivation.empty() ? "" : ": " + derivation) + ")";
}

void PrecisionMismatch::take(const numerics::Verdict& v) {
  num_mismatched = v.mismatched;
  worst_index = v.worst_index;
  kernel_value = v.got;
  reference_value = v.reference;
  abs_error = v.error;
  rel_error = v.reference != 0 ? v.error / std::fabs(v.reference) : v.error;
  bound = v.bound;
  derivation = v.derivation;
}

void Dispatcher::set_precision_check(const PrecisionCheckConfig& cfg) {
  std::lock_guard<std::mutex> lock(config_mu_);
  precision_ = cfg;
  precision_enabled_.store(cfg.enabled);
}

PrecisionCheckConfig Dispatcher::precision_check() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return precision_;
}

std::vector<PrecisionMismatch> Dispatcher::precision_mismatches() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return mismatches_;
}

void Dispatcher::clear_precision_mismatches() {
  std::lock_guard<std::mutex> lock(config_mu_);
  mismatches_.clear();
}

void Dispatcher::record_precision_mismatch(const PrecisionMismatch& m, const reg::OpEntry* counted_on) {
  if (counted_on == nullptr) counted_on = registry_.find(m.op);
  if (counted_on != nullptr) counted_on->stats().precision_mismatches.fetch_add(1);
  log().warn("{}", m.message());
  bool raise = false;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    mismatches_.push_back(m);
    raise = precision_.raise_on_mismatch;
  }
  if (raise) throw Error(ErrorCode::kInternal, m.message());
}

void Dispatcher::check_precision(CallState& cs, const reg::Kernel& k, DType convert_from) {
  // A random op's reference would draw other numbers (and advance the
  // generator the call's own draws come from): not judged.
  for (const auto& a : cs.op->schema().arguments)
    if (a.type.base == reg::BaseType::kGenerator) {
      warn_unjudged(*cs.op, "a random op: its reference would draw other numbers");
      run_kernel(cs, k, convert_from);
      return;
    }
  const int index =
      cs.device.device_type == NPUB_DEVICE_NPU ? cs.device.device_id : devices_.current_device();
  sim::Device* dev = cs.device.device_type == NPUB_DEVICE_NPU ? &devices_.at(index) : nullptr;
  const auto& sargs = cs.op->schema().arguments;
  const auto& alias = cs.op->return_alias();

  // The reference's inputs: the same values, with private copies of every
  // tensor (taken before the kernel runs): the reference never reads what
  // the kernel wrote (an in-place call's self is its out), and never writes
  // the caller's tensors, not even those an op writes without its schema
  // saying so (native_batch_norm's running statistics).
  std::vector<NpubValue> ref_args(cs.args, cs.args + cs.num_args);
  std::vector<Tensor> keep;
  std::vector<std::pair<std::string, std::pair<DLTensor*, DLTensor*>>> compare;  // label, (kernel, reference)
  auto snapshot = [&](DLTensor* t) {
    Tensor view = Tensor::empty(std::vector<int64_t>(t->shape, t->shape + t->ndim), dtype_of(t->dtype), dev);
    sim::copy_tensor(*view.dl(), *t);
    keep.push_back(view);
    return view.dl();
  };
  std::vector<std::vector<DLTensor*>> lists;
  lists.reserve(static_cast<size_t>(cs.num_args));
  for (int32_t i = 0; i < cs.num_args; ++i) {
    const auto ui = static_cast<size_t>(i);
    const bool written = sargs[ui].is_write();
    NpubValue& v = ref_args[ui];
    if (v.tag == NPUB_VALUE_TENSOR) {
      DLTensor* copy = snapshot(v.u.tensor);
      if (written) compare.push_back({"argument '" + sargs[ui].name + "'", {v.u.tensor, copy}});
      v.u.tensor = copy;
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
      lists.emplace_back(v.u.tensors, v.u.tensors + v.count);
      for (int32_t j = 0; j < v.count; ++j) {
        DLTensor*& t = lists.back()[static_cast<size_t>(j)];
        if (t == nullptr) continue;
        DLTensor* copy = snapshot(t);
        if (written)
          compare.push_back({"argument '" + sargs[ui].name + "'[" + std::to_string(j) + "]", {t, copy}});
        t = copy;
      }
      v.u.tensors = lists.back().data();
    }
  }
  std::vector<NpubValue> ref_rets(cs.rets, cs.rets + cs.num_rets);
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    const auto ui = static_cast<size_t>(i);
    if (alias[ui] >= 0) {
      ref_rets[ui] = ref_args[static_cast<size_t>(alias[ui])];
    } else if (ref_rets[ui].tag == NPUB_VALUE_TENSOR) {
      DLTensor* t = ref_rets[ui].u.tensor;
      keep.push_back(
          Tensor::empty(std::vector<int64_t>(t->shape, t->shape + t->ndim), dtype_of(t->dtype), dev));
      ref_rets[ui].u.tensor = keep.back().dl();
    }
  }

  // The float64 and |inputs| references (Note [The error model] in
  // error_bound.h) run on copies taken before the kernel writes anything.
  const numerics::ErrorModel& model = numerics::error_model(cs.op->name());
  struct WideRun {
    std::vector<NpubValue> args, rets;
    std::vector<std::vector<DLTensor*>> lists;
    std::vector<Tensor> keep;
  };
  auto prepare = [&](bool magnitude) {
    WideRun r;
    r.args.assign(cs.args, cs.args + cs.num_args);
    r.lists.reserve(static_cast<size_t>(cs.num_args));
    // Floating tensors in float64 (by absolute value for the magnitude);
    // other tensors the op writes as private copies, so neither run writes
    // into the kernel's outputs.
    auto widen = [&](DLTensor* t) -> DLTensor* {
      if (t == nullptr) return t;
      const std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
      const DType dt = dtype_of(t->dtype);
      if (!is_floating(dt)) {
        r.keep.push_back(Tensor::empty(shape, dt, dev));
        sim::copy_tensor(*r.keep.back().dl(), *t);
        return r.keep.back().dl();
      }
      std::vector<double> v = sim::read_doubles(*t);
      // A 0-d operand wider than the call (x + 0.1: a Python number comes
      // as a float64 scalar tensor) takes part in the call's dtype, as in
      // ATen's type promotion: its value is that dtype's (the rule of
      // npubridge/torch/error_bound.h's reference_tensor, which the
      // conformance tools' references follow).
      if (t->ndim == 0 && is_floating(cs.dtype) &&
          numerics::precision_bits(dt) > numerics::precision_bits(cs.dtype))
        for (double& x : v) x = numerics::round_to(cs.dtype, x);
      if (magnitude)
        for (double& x : v) x = std::fabs(x);
      r.keep.push_back(Tensor::from_values(shape, DType::kFloat64, v, dev));
      return r.keep.back().dl();
    };
    for (int32_t i = 0; i < cs.num_args; ++i) {
      NpubValue& v = r.args[static_cast<size_t>(i)];
      if (v.tag == NPUB_VALUE_TENSOR) {
        v.u.tensor = widen(v.u.tensor);
      } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
        r.lists.emplace_back(v.u.tensors, v.u.tensors + v.count);
        for (DLTensor*& t : r.lists.back()) t = widen(t);
        v.u.tensors = r.lists.back().data();
      } else if (v.tag == NPUB_VALUE_INT &&
                 sargs[static_cast<size_t>(i)].type.base == reg::BaseType::kScalarType &&
                 is_torch_floating_scalar_type(v.u.i)) {
        v.u.i = kTorchFloat64;  // a floating dtype= argument: the wide run computes in float64 too
      } else if (magnitude && v.tag == NPUB_VALUE_DOUBLE &&
                 sargs[static_cast<size_t>(i)].type.base == reg::BaseType::kScalar) {
        v.u.d = std::fabs(v.u.d);
      } else if (magnitude && v.tag == NPUB_VALUE_INT &&
                 sargs[static_cast<size_t>(i)].type.base == reg::BaseType::kScalar) {
        v.u.i = v.u.i < 0 ? -v.u.i : v.u.i;
      }
    }
    r.rets.assign(cs.rets, cs.rets + cs.num_rets);
    for (int32_t i = 0; i < cs.num_rets; ++i) {
      NpubValue& v = r.rets[static_cast<size_t>(i)];
      if (alias[static_cast<size_t>(i)] >= 0)
        v = r.args[static_cast<size_t>(alias[static_cast<size_t>(i)])];
      else if (v.tag == NPUB_VALUE_TENSOR)
        v.u.tensor = widen(v.u.tensor);
    }
    return r;
  };
  const bool floating_call = [&] {
    for (auto& c : compare)
      if (is_floating(dtype_of(c.second.first->dtype))) return true;
    for (int32_t i = 0; i < cs.num_args; ++i)
      if (cs.args[i].tag == NPUB_VALUE_TENSOR && is_floating(dtype_of(cs.args[i].u.tensor->dtype)))
        return true;
    return false;
  }();
  std::unique_ptr<WideRun> wide, magnitude;
  if (floating_call && numerics::needs_float64(model)) {
    wide = std::make_unique<WideRun>(prepare(false));
    if (numerics::needs_magnitude(model)) magnitude = std::make_unique<WideRun>(prepare(true));
  }
  const int64_t terms = numerics::terms(model, cs.op->schema(), cs.args, cs.num_args);
  // Magnitude::kScale: the inputs' part, read before the kernel writes (the
  // reference's is added per output below).
  const double scale =
      model.kind == numerics::ErrorKind::kAccumulated && model.magnitude == numerics::Magnitude::kScale
          ? numerics::input_scale(cs.op->schema(), cs.args, cs.num_args)
          : 0;

  run_kernel(cs, k, convert_from);

  FallbackFn fn;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    fn = fallback_;
  }
  TensorOutputs ref_outputs(devices_);
  // The reference runs on the dispatcher's own copies: not the host's call.
  const std::string why = "the precision check's reference";
  const InReference in_reference;
  try {
    fn(FallbackCall{*cs.op, ref_args.data(), cs.num_args, ref_rets.data(), cs.num_rets, ref_outputs, why,
                    nullptr});
  } catch (const Error& e) {
    // The host has no implementation of the op to compare with (a plugin's
    // own op; it says so with kUnsupported): the kernel's result stands,
    // unjudged, and the op is named. Any other error of the reference (ATen
    // refusing inputs the kernel took) is the caller's to see.
    if (e.code() != ErrorCode::kUnsupported) throw;
    warn_unjudged(*cs.op, std::string("the host framework cannot run it as a reference (") + e.what() + ")");
    return;
  }
  // The same outputs of a wide run, in `compare`'s order (written tensor
  // arguments, then returns); empty when the host has no float64 kernel.
  auto outputs_of = [&](WideRun* r, TensorOutputs& outs) -> std::vector<DLTensor*> {
    if (r == nullptr) return {};
    try {
      fn(FallbackCall{*cs.op, r->args.data(), cs.num_args, r->rets.data(), cs.num_rets, outs, why, nullptr});
    } catch (const std::exception&) {
      return {};
    }
    std::vector<DLTensor*> o;
    for (int32_t i = 0; i < cs.num_args; ++i) {
      if (!sargs[static_cast<size_t>(i)].is_write()) continue;
      const NpubValue& v = r->args[static_cast<size_t>(i)];
      if (v.tag == NPUB_VALUE_TENSOR) o.push_back(v.u.tensor);
      if (v.tag == NPUB_VALUE_TENSOR_LIST)
        for (int32_t j = 0; j < v.count; ++j)
          if (v.u.tensors[j] != nullptr) o.push_back(v.u.tensors[j]);
    }
    for (int32_t i = 0; i < cs.num_rets; ++i)
      if (alias[static_cast<size_t>(i)] < 0 && cs.rets[i].tag == NPUB_VALUE_TENSOR &&
          ref_rets[static_cast<size_t>(i)].tag == NPUB_VALUE_TENSOR)
        o.push_back(r->rets[static_cast<size_t>(i)].tag == NPUB_VALUE_TENSOR
                        ? r->rets[static_cast<size_t>(i)].u.tensor
                        : nullptr);
    return o;
  };
  TensorOutputs wide_outputs(devices_), magnitude_outputs(devices_);
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    const auto ui = static_cast<size_t>(i);
    if (alias[ui] >= 0) continue;  // compared as its argument
    if (cs.rets[i].tag == NPUB_VALUE_TENSOR && ref_rets[ui].tag == NPUB_VALUE_TENSOR)
      compare.push_back({"return " + std::to_string(i), {cs.rets[i].u.tensor, ref_rets[ui].u.tensor}});
  }

  const std::vector<DLTensor*> wide_refs = outputs_of(wide.get(), wide_outputs);
  const std::vector<DLTensor*> magnitude_refs =
      wide_refs.empty() ? std::vector<DLTensor*>() : outputs_of(magnitude.get(), magnitude_outputs);
  for (size_t slot = 0; slot < compare.size(); ++slot) {
    const std::string& label = compare[slot].first;
    const auto& pair = compare[slot].second;
    const DLTensor& a = *pair.first;
    const DLTensor& b = *pair.second;
    PrecisionMismatch m;
    m.op = cs.op->name();
    m.plugin = k.plugin_name();
    m.output = label;
    if (a.ndim != b.ndim || !std::equal(a.shape, a.shape + a.ndim, b.shape) ||
        dtype_of(a.dtype) != dtype_of(b.dtype)) {
      m.num_mismatched = 1;
      m.note = "the kernel's result is " + std::string(dtype_name(dtype_of(a.dtype))) +
               shape_str(a.shape, a.ndim) + ", the reference's " + dtype_name(dtype_of(b.dtype)) +
               shape_str(b.shape, b.ndim);
      record_precision_mismatch(m, cs.op);
      continue;
    }
    const std::vector<double> x = sim::read_doubles(a), y = sim::read_doubles(b);
    m.numel = static_cast<int64_t>(x.size());
    std::vector<double> w, mag;
    if (slot < wide_refs.size() && wide_refs[slot] != nullptr && wide_refs[slot]->ndim == a.ndim)
      w = sim::read_doubles(*wide_refs[slot]);
    if (slot < magnitude_refs.size() && magnitude_refs[slot] != nullptr)
      mag = sim::read_doubles(*magnitude_refs[slot]);
    if (w.size() != x.size()) w.clear();
    if (mag.size() != x.size()) mag.clear();
    numerics::Comparison c;
    const bool alternative = !w.empty() && model.kind == numerics::ErrorKind::kSameDtype;
    c.got = x.data();
    c.reference = w.empty() || alternative ? y.data() : w.data();
    c.alternative = alternative ? w.data() : nullptr;
    c.host = w.empty() || alternative ? nullptr : y.data();
    c.magnitude = mag.empty() ? nullptr : mag.data();
    c.numel = m.numel;
    c.dtype = dtype_of(a.dtype);
    c.terms = terms;
    c.scale = scale;
    for (double v : w.empty() ? y : w)
      if (std::isfinite(v)) c.scale = std::max(c.scale, std::fabs(v));
    m.take(numerics::compare(model, c));
    if (m.num_mismatched != 0) record_precision_mismatch(m, cs.op);
  }
}

}  // namespace npub
