// Trace hooks: the dispatcher marks each plugin kernel run, each host
// fallback and each dtype conversion as a begin/end pair a host turns into
// profiler slices (the PyTorch extension: RecordFunction user scopes while
// torch.profiler runs, python_ext/csrc/runtime/profiler_trace.cpp).
//
// Note [Trace hooks cost one load when off]
// The dispatch path is hot (tens of nanoseconds a call). With no hooks set,
// a Scope is one relaxed atomic load of a null pointer and a branch: the
// slice's name is not even built. A host sets hooks (static storage) and
// their `active` predicate decides per call whether anyone is listening, so
// the name string is built only while a profiler records.
#pragma once

#include <atomic>
#include <string>

namespace npub::trace {

enum class Kind : int {
  kKernel = 0,      // "<plugin>: <op>", a plugin kernel's run
  kFallback = 1,    // "fallback: <op>", the host framework's implementation
  kConversion = 2,  // "convert: float16->float32", staging to or from a kernel's dtype
  kReplay = 3,      // "NPUGraph.replay", a captured graph's replay (its kernels nest under it)
};

struct Hooks {
  bool (*active)();                                    // is anyone recording now (cheap)
  void* (*begin)(Kind kind, const std::string& name);  // returns a token for end (may be null)
  void (*end)(void* token);
};

// Sets the hooks (static storage; null turns tracing off). Thread-safe.
void set_hooks(const Hooks* hooks);

namespace detail {
extern std::atomic<const Hooks*> g_hooks;
}

// One slice, begun when constructed and ended when destroyed (also by an
// exception). `name` is a callable returning the slice's name, called only
// while hooks are set and active.
class Scope {
 public:
  template <typename NameFn>
  Scope(Kind kind, NameFn&& name) {
    const Hooks* h = detail::g_hooks.load(std::memory_order_acquire);  // a plain load on x86
    if (h == nullptr || !h->active()) return;
    hooks_ = h;
    token_ = h->begin(kind, name());
  }
  ~Scope() {
    if (hooks_ != nullptr) hooks_->end(token_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const Hooks* hooks_ = nullptr;
  void* token_ = nullptr;
};

}  // namespace npub::trace
