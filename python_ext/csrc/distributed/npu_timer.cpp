// DDP's timer for npu modules: c10d's Reducer takes a Timer from
// TimerRegistry for the device type of the module's parameters; without one
// for PrivateUse1, DDP warns "Time stats are currently only collected for
// CPU and CUDA devices" and its logging data (ddp._get_ddp_logging_data())
// has no forward, backward or communication times. The registration runs
// when npubridge._C_dist is loaded, which is when the "npu" backend is first
// created, so before any DDP can be built on it.
//
// The Reducer records its events on the host thread that reaches each point
// (forward start, backward compute start/end, first bucket's communication,
// the end of the last), while the work runs later on the device's streams:
// like CUDA's timer, this one records a device event on the current stream
// at each point, so that a difference measures the device's time between
// them, not the host's queueing.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <memory>
#include <optional>

namespace npub::dist {

namespace {

class NpuTimer final : public c10d::Timer {
 public:
  explicit NpuTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host time, which DDP's overlap figures use
    c10::DeviceGuard guard(device_);
    const c10::Stream stream =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getStream(guard.current_device());
    at(event).record(stream);
  }

  // Called by DDP at the start of a later forward, when the events of the
  // iteration before have mostly completed: waiting for them is cheap.
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& a = at(start);
    c10::Event& b = at(end);
    // Without a backward (eval, no_sync) some events were never recorded.
    if (!a.was_marked_for_recording() || !b.was_marked_for_recording()) return std::nullopt;
    a.synchronize();
    b.synchronize();
    const double ms = a.elapsedTime(b);
    // The end recorded in an earlier iteration than the start (DDP's
    // no_sync iterations record the start only): no figure for this one.
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  static c10::Event make() {
    return c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT);
  }
  c10::Event& at(Event event) { return events_.at(static_cast<size_t>(event)); }

  const c10::Device device_;
  // One per Timer::Event (kForwardStart .. kBackwardCommEnd), re-recorded
  // every iteration; BACKEND_DEFAULT: the flag c10::Event needs for
  // elapsedTime.
  std::array<c10::Event, 5> events_{make(), make(), make(), make(), make()};
};

}  // namespace

}  // namespace npub::dist

// In c10d: the macro names the registry unqualified.
namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, npub::dist::NpuTimer);
}  // namespace c10d
