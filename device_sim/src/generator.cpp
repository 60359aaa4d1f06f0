#include <npubridge/device_sim/generator.h>

namespace npub::sim {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = {seed, 0};
}

Generator::State Generator::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void Generator::set_state(const State& state) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = state;
}

void Generator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.offset = offset;
}

Generator::State Generator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  const State out = state_;
  state_.offset += count;
  return out;
}

}  // namespace npub::sim
