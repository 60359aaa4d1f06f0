#include <npubridge/dispatcher/dispatcher.h>
#include <npubridge/support/error.h>
#include <npubridge/support/tick_clock.h>

#include <algorithm>
#include <iterator>

namespace npub {

DLTensor* TensorOutputs::allocate(int32_t ret_index, const DLDevice& device, int32_t ndim,
                                  const int64_t* shape, DLDataType dtype) {
  if (ret_index < 0) throw Error(ErrorCode::kInternal, "TensorOutputs: negative return index");
  if (tensors_.size() <= static_cast<size_t>(ret_index)) tensors_.resize(static_cast<size_t>(ret_index) + 1);
  sim::Device* dev = device.device_type == NPUB_DEVICE_NPU ? &devices_.at(device.device_id) : nullptr;
  tensors_[static_cast<size_t>(ret_index)] =
      Tensor::empty(std::vector<int64_t>(shape, shape + ndim), dtype_of(dtype), dev);
  return tensors_[static_cast<size_t>(ret_index)].dl();
}

Tensor& TensorOutputs::operator[](size_t i) {
  if (tensors_.size() <= i) tensors_.resize(i + 1);
  return tensors_[i];
}

std::vector<OpStatsSnapshot> Dispatcher::stats() const {
  std::vector<OpStatsSnapshot> out;
  const double ns_per_tick = TickClock::ns_per_tick();
  for (const reg::OpEntry* op : registry_.ops()) {
    const reg::OpStats& s = op->stats();
    if (s.calls.load() == 0) continue;
    OpStatsSnapshot snap;
    snap.op = op->name();
    snap.calls = s.calls.load();
    snap.fallbacks = s.fallbacks.load();
    snap.conversions = s.conversions.load();
    snap.errors = s.errors.load();
    snap.precision_mismatches = s.precision_mismatches.load();
    snap.total_ms = static_cast<double>(s.total_ticks.load()) * ns_per_tick / 1e6;
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU))
      snap.kernels.push_back({k->plugin_name(), k->dtypes_string(), k->priority, k->calls.load()});
    out.push_back(std::move(snap));
  }
  std::lock_guard<std::mutex> lock(host_fallback_mu_);
  for (const auto& [name, count] : host_fallbacks_) {
    if (count == 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const OpStatsSnapshot& s) { return s.op == name; });
    if (it == out.end()) {
      out.emplace_back();
      it = std::prev(out.end());
      it->op = name;
    }
    it->calls += count;
    it->fallbacks += count;
  }
  return out;
}

std::map<std::string, std::string> Dispatcher::fallback_reasons() const {
  std::map<std::string, std::string> out;
  for (const reg::OpEntry* op : registry_.ops())
    if (std::string why = op->stats().fallback_reason(); !why.empty())
      out.emplace(op->name(), std::move(why));
  return out;
}

bool Dispatcher::record_host_fallback(std::string_view op) {
  std::lock_guard<std::mutex> lock(host_fallback_mu_);
  auto it = host_fallbacks_.find(op);
  if (it != host_fallbacks_.end()) {
    ++it->second;
    return false;
  }
  host_fallbacks_.emplace(std::string(op), 1);
  return true;
}

void Dispatcher::reset_stats() {
  for (reg::OpEntry* op : registry_.ops()) {
    op->stats().reset();
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_NPU)) const_cast<reg::Kernel*>(k)->calls = 0;
    for (const reg::Kernel* k : op->kernels(NPUB_DEVICE_CPU)) const_cast<reg::Kernel*>(k)->calls = 0;
  }
  // Counts back to zero; the entries stay, so that the op is not warned of
  // again (as the dispatcher's own fallback_warned).
  std::lock_guard<std::mutex> lock(host_fallback_mu_);
  for (auto& entry : host_fallbacks_) entry.second = 0;
}

int64_t Dispatcher::total_fallbacks() const {
  int64_t n = 0;
  for (const reg::OpEntry* op : registry_.ops()) n += op->stats().fallbacks.load();
  std::lock_guard<std::mutex> lock(host_fallback_mu_);
  for (const auto& [name, count] : host_fallbacks_) n += count;
  return n;
}

}  // namespace npub
