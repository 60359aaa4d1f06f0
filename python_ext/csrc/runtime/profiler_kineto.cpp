// The npu as a kineto device (torch 2.13's REGISTER_PRIVATEUSE1_PROFILER):
// with ProfilerActivity.NPU (PrivateUse1) among a torch.profiler's
// activities, kineto configures a session of this profiler, and every slice
// the trace hooks see while it records (profiler_trace.cpp) is also logged
// as a CONCURRENT_KERNEL activity on the npu's own track (pid: the device
// index, as kineto places CUDA devices; one row per device), so Perfetto
// shows the kernels, conversions and fallbacks beside the host thread.
//
// Note [One clock for both tracks]
// Device slices are stamped with c10::getTime(), the clock torch's profiler
// stamps its CPU events with, so the npu track lines up with the ops.
#ifndef USE_KINETO
#define USE_KINETO  // the header declares the registry only under it; torch is built with kineto
#define NPUB_UNDEF_USE_KINETO
#endif
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#ifdef NPUB_UNDEF_USE_KINETO
#undef USE_KINETO
#undef NPUB_UNDEF_USE_KINETO
#endif

#include <c10/util/ApproximateClock.h>
#include <output_base.h>

#include "runtime/profiler_trace.h"

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <vector>

// Note [The session returns no CPU trace buffer]
// IActivityProfilerSession::getTraceBuffer returns a unique_ptr to kineto's
// CpuTraceBuffer, whose definition torch does not ship; returning one needs
// its (never run) destructor. The session has no CPU events to hand over and
// always returns null, so an empty definition, visible to this library only
// (-fvisibility=hidden), completes the type for that one instantiation: no
// object of it is ever created or destroyed here.
namespace libkineto {
struct CpuTraceBuffer {};
}  // namespace libkineto

namespace npub::torch_backend {

namespace {

struct DeviceSlice {
  std::string name;
  int64_t start_ns, end_ns;
  int device;
};

std::atomic<bool> g_recording{false};
std::mutex g_mu;
std::vector<DeviceSlice> g_slices;  // guarded by g_mu

class NpuSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_slices.clear();
    }
    start_ns_ = c10::getTime();
    g_recording.store(true, std::memory_order_release);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    g_recording.store(false, std::memory_order_release);
    end_ns_ = c10::getTime();
    std::lock_guard<std::mutex> lock(g_mu);
    slices_.swap(g_slices);
    status_ = libkineto::TraceStatus::READY;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override {
    span_ = std::make_unique<libkineto::TraceSpan>(start_ns_, end_ns_, "npu");
    for (const DeviceSlice& s : slices_) {
      libkineto::GenericTraceActivity a(*span_, libkineto::ActivityType::CONCURRENT_KERNEL, s.name);
      a.startTime = s.start_ns;
      a.endTime = s.end_ns;
      a.device = s.device;
      a.resource = 0;
      a.log(logger);
    }
  }
  // The track's name in Perfetto (kineto asks once per session: the first
  // device's; the slices of others land on their own pid, unnamed).
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "npu", "npu:0 (npubridge)"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {libkineto::ResourceInfo{0, 0, 0, "kernels (inline, stream order)"}};
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

 private:
  int64_t start_ns_ = 0, end_ns_ = 0;
  std::vector<DeviceSlice> slices_;
  std::unique_ptr<libkineto::TraceSpan> span_;
};

class NpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return types_; }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<NpuSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"npubridge_npu"};
  std::set<libkineto::ActivityType> types_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(NpuActivityProfiler);

}  // namespace

bool npu_trace_recording() { return g_recording.load(std::memory_order_relaxed); }

void npu_trace_add(std::string name, int64_t start_ns, int64_t end_ns, int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_recording.load(std::memory_order_relaxed))
    g_slices.push_back({std::move(name), start_ns, end_ns, device});
}

}  // namespace npub::torch_backend
