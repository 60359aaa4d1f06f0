// npu work in torch.profiler traces, from the dispatcher's trace hooks
// (npubridge/dispatcher/trace.h): each plugin kernel run ("cann_like:
// aten::mm.out"), each host fallback ("fallback: aten::foo") and each dtype
// conversion ("convert: float16->float32") becomes
//  - a RecordFunction user scope on the calling thread, nested in time under
//    the torch op that made it (kernels run inline on the calling thread:
//    Note [Kernels run inline, in stream order]); export_chrome_trace writes
//    it as a user_annotation event;
//  - with ProfilerActivity.NPU (PrivateUse1) asked for, also a device
//    activity on the npu's own track (profiler_kineto.cpp).
//
// Note [Trace slices only while a profiler records]
// The hooks are set when the module loads; their `active` predicate is
// at::hasCallbacks() (false unless a profiler or another RecordFunction
// observer is registered) or a recording npu session, so outside profiling
// the dispatcher builds no names and allocates nothing (Note [Trace hooks
// cost one load when off]). A scope whose RecordFunction is not active
// (sampled out, or an observer of other scopes) records no host slice.
#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>

#include <npubridge/dispatcher/trace.h>

#include "runtime/npu_runtime.h"
#include "runtime/profiler_trace.h"

#include <memory>
#include <string>

namespace npub::torch_backend {

namespace {

struct Slice {
  std::unique_ptr<at::RecordFunction> host;
  std::string name;       // for the device track
  int64_t start_ns = -1;  // -1: no device slice
  int device = 0;
};

bool trace_active() { return at::hasCallbacks() || npu_trace_recording(); }

void* trace_begin(trace::Kind, const std::string& name) {
  auto s = std::make_unique<Slice>();
  auto rf = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (rf->isActive()) {
    rf->before(name);
    s->host = std::move(rf);
  }
  if (npu_trace_recording()) {
    s->name = name;
    s->device = rt().devices().current_device();
    s->start_ns = c10::getTime();
  }
  if (s->host == nullptr && s->start_ns < 0) return nullptr;
  return s.release();
}

// The RecordFunction ends when destroyed (on this thread, as it began).
void trace_end(void* token) {
  std::unique_ptr<Slice> s(static_cast<Slice*>(token));
  if (s->start_ns >= 0) npu_trace_add(std::move(s->name), s->start_ns, c10::getTime(), s->device);
}

const trace::Hooks kHooks{&trace_active, &trace_begin, &trace_end};

const bool kInstalled = [] {
  trace::set_hooks(&kHooks);
  return true;
}();

}  // namespace

}  // namespace npub::torch_backend
