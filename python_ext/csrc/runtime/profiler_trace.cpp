// npu work in torch.profiler traces: the dispatcher's trace hooks
// (npubridge/dispatcher/trace.h) as RecordFunction user scopes, so that
// torch.profiler.profile(activities=[CPU, PrivateUse1]) records each plugin
// kernel run ("cann_like: aten::mm.out"), each host fallback ("fallback:
// aten::foo") and each dtype conversion ("convert: float16->float32") as a
// slice of its own, nested in time under the torch op that made it (kernels
// run inline on the calling thread: Note [Kernels run inline, in stream
// order]), and export_chrome_trace writes them as user_annotation events.
//
// Note [Trace slices only while a profiler records]
// The hooks are set when the module loads; their `active` predicate is
// at::hasCallbacks(), false unless a profiler (or another RecordFunction
// observer) is registered, so outside profiling the dispatcher builds no
// names and allocates nothing (Note [Trace hooks cost one load when off]).
// A scope whose RecordFunction is not active (sampled out, or an observer
// of other scopes) is dropped at once.
#include <ATen/record_function.h>

#include <npubridge/dispatcher/trace.h>

#include <memory>
#include <string>

namespace npub::torch_backend {

namespace {

bool trace_active() { return at::hasCallbacks(); }

void* trace_begin(trace::Kind, const std::string& name) {
  auto rf = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!rf->isActive()) return nullptr;
  rf->before(name);
  return rf.release();
}

// The RecordFunction's destructor ends it (on this thread, as it began).
void trace_end(void* token) { delete static_cast<at::RecordFunction*>(token); }

const trace::Hooks kHooks{&trace_active, &trace_begin, &trace_end};

const bool kInstalled = [] {
  trace::set_hooks(&kHooks);
  return true;
}();

}  // namespace

}  // namespace npub::torch_backend
