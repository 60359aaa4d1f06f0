// The profiler's device timing for npu (torch.autograd.profiler.profile(
// use_device="npu")): PyTorch's PrivateUse1 profiler stubs, registered when
// the module loads.
//
// Note [Profiled device time is the stream's]
// Without stubs PyTorch's own ones throw from the profiler's op-entry
// callback ("PrivateUse1 used in profiler but not enabled"), which leaves
// each op's start unrecorded: every op reported a CPU time near -7e15 us
// and no device time. As CUDA's stubs do, each profiled op records an event
// on the current stream at entry and at exit; its device time is the time
// between the two events' completions, which the stream reaches in order
// (kernels run inline after the stream drains: Note [Kernels run inline, in
// stream order], dispatcher/src/dispatcher.cpp), so it is never negative
// and covers the op's kernels, its queued copies and the stream's own
// latency. As with CUDA's event pairs, host work inside the op while the
// stream is idle (a first call's meta kernel) counts too.
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "runtime/npu_runtime.h"

#include <functional>
#include <memory>

namespace npub::torch_backend {

namespace {

struct NpuProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const int index = rt().devices().current_device();
    if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
    auto* e = new sim::Event();
    *event = std::shared_ptr<void>(e, [](void* p) { delete static_cast<sim::Event*>(p); });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    e->record(rt().devices().at(index).current_stream());
  }
  // Microseconds, as CUDA's stubs return them.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    auto* s = static_cast<sim::Event*>(start->get());
    auto* e = static_cast<sim::Event*>(end->get());
    s->synchronize();
    e->synchronize();
    return static_cast<float>(s->elapsed_ms(*e) * 1000.0);
  }
  // CUDA marks ranges for NVTX; the simulator has no timeline tool to tell.
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    sim::DeviceSet& devices = rt().devices();
    const int previous = devices.current_device();
    for (int i = 0; i < devices.count(); ++i) {
      devices.set_current_device(i);
      op(i);
    }
    devices.set_current_device(previous);
  }
  void synchronize() const override {
    for (int i = 0; i < rt().devices().count(); ++i) rt().devices().at(i).synchronize();
  }
};

struct RegisterNpuProfilerStubs {
  RegisterNpuProfilerStubs() {
    static NpuProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
RegisterNpuProfilerStubs g_register_profiler_stubs;

}  // namespace

}  // namespace npub::torch_backend
