// A cheap monotonic tick counter for per-call statistics: the TSC on x86-64
// (~8 ns to read, against ~17 ns for steady_clock here), steady_clock
// nanoseconds elsewhere. Ticks convert to nanoseconds with a ratio measured
// against steady_clock over the process's lifetime so far.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace npub {

class TickClock {
 public:
  static int64_t now() noexcept {
#if defined(__x86_64__)
    return static_cast<int64_t>(__rdtsc());
#else
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
#endif
  }
  // Nanoseconds per tick (1.0 where ticks are nanoseconds).
  static double ns_per_tick();
};

}  // namespace npub
