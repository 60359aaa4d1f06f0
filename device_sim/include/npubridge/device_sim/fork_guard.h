// What a process forked from one that runs the simulated NPU may do with the
// devices it inherited: nothing (Note [A forked child cannot use the npu],
// fork_guard.cpp). Each device object holds a ForkGuard and checks it at its
// entry points, before it takes a lock or waits on a device thread.
#pragma once

#include <cstdint>
#include <string>

namespace npub::sim {

// The error a forked child gets for using an inherited device: npub::Error
// (kUnsupported), "Cannot re-initialize npu in forked subprocess. ..." as
// PyTorch words it for CUDA, then `what` and the reason.
[[noreturn]] void throw_forked_child(const std::string& what);

class ForkGuard {
 public:
  // Registers the process's fork handler (once) and remembers the process
  // this guard was made in.
  ForkGuard();

  // True in a process forked after this guard was made (and in its
  // descendants). Lock-free: safe on any path, destructors and deleters too.
  bool in_forked_child() const noexcept;

  // Throws the forked-child error when in_forked_child(), naming what()
  // (a callable returning e.g. "npu:0": the name is built only then).
  template <typename What>
  void check(What&& what) const {
    if (in_forked_child()) throw_forked_child(what());
  }

 private:
  uint64_t generation_;
};

}  // namespace npub::sim
