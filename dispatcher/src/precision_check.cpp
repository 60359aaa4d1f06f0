// Precision-check mode: run the kernel and the host framework's fallback on
// the same inputs and compare every output with per-dtype tolerances.
#include "call_state.h"

#include <npubridge/device_sim/copy_engine.h>
#include <npubridge/dispatcher/dispatcher.h>
#include "logging.h"
#include <npubridge/support/error.h>

#include <cmath>
#include <cstdio>

namespace npub {

std::string PrecisionMismatch::message() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "precision check failed for op '%s' (plugin '%s'), %s: %lld of %lld elements "
                "differ from the host framework; worst at flat index %lld: kernel %.9g, "
                "reference %.9g (abs error %.3g, rel error %.3g)",
                op.c_str(), plugin.c_str(), output.c_str(), static_cast<long long>(num_mismatched),
                static_cast<long long>(numel), static_cast<long long>(worst_index), kernel_value,
                reference_value, abs_error, rel_error);
  return buf;
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
  const int index = cs.device.device_type == NPUB_DEVICE_NPU ? cs.device.device_id : devices_.current_device();
  sim::Device* dev = cs.device.device_type == NPUB_DEVICE_NPU ? &devices_.at(index) : nullptr;
  const auto& sargs = cs.op->schema().arguments;
  const auto& alias = cs.op->return_alias();

  // The reference's inputs: the same values, with private copies of every
  // tensor the op writes (taken before the kernel runs).
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
    if (!sargs[ui].is_write()) continue;
    NpubValue& v = ref_args[ui];
    if (v.tag == NPUB_VALUE_TENSOR) {
      DLTensor* copy = snapshot(v.u.tensor);
      compare.push_back({"argument '" + sargs[ui].name + "'", {v.u.tensor, copy}});
      v.u.tensor = copy;
    } else if (v.tag == NPUB_VALUE_TENSOR_LIST) {
      lists.emplace_back(v.u.tensors, v.u.tensors + v.count);
      for (int32_t j = 0; j < v.count; ++j) {
        DLTensor*& t = lists.back()[static_cast<size_t>(j)];
        if (t == nullptr) continue;
        DLTensor* copy = snapshot(t);
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
      keep.push_back(Tensor::empty(std::vector<int64_t>(t->shape, t->shape + t->ndim), dtype_of(t->dtype), dev));
      ref_rets[ui].u.tensor = keep.back().dl();
    }
  }

  run_kernel(cs, k, convert_from);

  FallbackFn fn;
  PrecisionCheckConfig cfg;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    fn = fallback_;
    cfg = precision_;
  }
  TensorOutputs ref_outputs(devices_);
  fn(*cs.op, ref_args.data(), cs.num_args, ref_rets.data(), cs.num_rets, ref_outputs);
  for (int32_t i = 0; i < cs.num_rets; ++i) {
    const auto ui = static_cast<size_t>(i);
    if (alias[ui] >= 0) continue;  // compared as its argument
    if (cs.rets[i].tag == NPUB_VALUE_TENSOR && ref_rets[ui].tag == NPUB_VALUE_TENSOR)
      compare.push_back({"return " + std::to_string(i), {cs.rets[i].u.tensor, ref_rets[ui].u.tensor}});
  }

  for (auto& [label, pair] : compare) {
    const DLTensor& a = *pair.first;
    const DLTensor& b = *pair.second;
    PrecisionMismatch m;
    m.op = cs.op->name();
    m.plugin = k.plugin_name();
    m.output = label;
    if (a.ndim != b.ndim || !std::equal(a.shape, a.shape + a.ndim, b.shape)) {
      m.worst_index = -1;
      m.num_mismatched = 1;
      std::lock_guard<std::mutex> lock(config_mu_);
      mismatches_.push_back(m);
      log().warn("precision check for op '{}', {}: the kernel's shape differs from the reference's", m.op, label);
      cs.op->stats().precision_mismatches.fetch_add(1);
      continue;
    }
    double atol = cfg.fp32_atol, rtol = cfg.fp32_rtol;
    switch (dtype_of(a.dtype)) {
      case DType::kFloat64: atol = cfg.fp64_atol; rtol = cfg.fp64_rtol; break;
      case DType::kFloat16: atol = cfg.fp16_atol; rtol = cfg.fp16_rtol; break;
      case DType::kBFloat16: atol = cfg.bf16_atol; rtol = cfg.bf16_rtol; break;
      case DType::kFloat32: break;
      default: atol = 0; rtol = 0; break;  // integers and bool: exact
    }
    const std::vector<double> x = sim::read_doubles(a), y = sim::read_doubles(b);
    m.numel = static_cast<int64_t>(x.size());
    double worst = -1;
    for (size_t e = 0; e < x.size(); ++e) {
      const double d = std::fabs(x[e] - y[e]);
      bool bad;
      if (std::isnan(x[e]) || std::isnan(y[e])) bad = std::isnan(x[e]) != std::isnan(y[e]);
      else if (std::isinf(x[e]) || std::isinf(y[e])) bad = x[e] != y[e];
      else bad = d > atol + rtol * std::fabs(y[e]);
      if (!bad) continue;
      ++m.num_mismatched;
      const double score = std::isnan(d) ? INFINITY : d;
      if (score > worst) {
        worst = score;
        m.worst_index = static_cast<int64_t>(e);
        m.kernel_value = x[e];
        m.reference_value = y[e];
        m.abs_error = d;
        m.rel_error = y[e] != 0 ? d / std::fabs(y[e]) : d;
      }
    }
    if (m.num_mismatched == 0) continue;
    cs.op->stats().precision_mismatches.fetch_add(1);
    log().warn("{}", m.message());
    {
      std::lock_guard<std::mutex> lock(config_mu_);
      mismatches_.push_back(m);
    }
    if (cfg.raise_on_mismatch) throw Error(ErrorCode::kInternal, m.message());
  }
}

}  // namespace npub
