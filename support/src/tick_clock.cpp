#include <npubridge/support/tick_clock.h>

#include <thread>

namespace npub {

namespace {
struct Origin {
  int64_t ticks = TickClock::now();
  std::chrono::steady_clock::time_point time = std::chrono::steady_clock::now();
};
// Taken when the library loads, so that later calibration spans a long time.
const Origin g_origin;
}  // namespace

double TickClock::ns_per_tick() {
#if defined(__x86_64__)
  // At least 2 ms of span for a ratio good to ~0.1%.
  auto elapsed = std::chrono::steady_clock::now() - g_origin.time;
  if (elapsed < std::chrono::milliseconds(2)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2) - elapsed);
    elapsed = std::chrono::steady_clock::now() - g_origin.time;
  }
  const int64_t ticks = now() - g_origin.ticks;
  if (ticks <= 0) return 1.0;
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
         static_cast<double>(ticks);
#else
  return 1.0;
#endif
}

}  // namespace npub
