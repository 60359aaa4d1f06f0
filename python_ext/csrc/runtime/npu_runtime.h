// The process's npubridge runtime (devices, registry, dispatcher) and the
// current npu, as every file of npubridge._C reaches them.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <npubridge/support/error.h>

#include <npubridge/dispatcher/runtime.h>

#include "init.h"

namespace npub::torch_backend {

// The runtime, started at the first call (Note [The runtime starts at the
// first npu use], init.cpp): every way into it from npubridge._C.
// npubridge._C_dist, a module of its own, reaches the runtime that _C
// started (its Python side starts it before making a backend).
#ifdef NPUB_C_DIST
inline Runtime& rt() { return Runtime::global(); }
#else
inline Runtime& rt() {
  ensure_started();
  return Runtime::global();
}
#endif

// Throws the forked-child error naming `op` in a process forked after the
// runtime started (Note [A forked child cannot use the npu],
// device_sim/src/fork_guard.cpp). The bridges check first thing, before
// ATen's meta kernels run: some are Python, and a child can hang in an
// import lock that the fork left held.
inline void check_not_in_bad_fork(const char* op) {
  if (rt().devices().in_forked_child()) sim::throw_forked_child(op);
}

// Runs `fn`, turning npubridge's error into PyTorch's (RuntimeError in
// Python) with the same message.
template <typename Fn>
void rethrow_as_torch(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

inline c10::DeviceIndex current_index() {
  return static_cast<c10::DeviceIndex>(rt().devices().current_device());
}

}  // namespace npub::torch_backend
