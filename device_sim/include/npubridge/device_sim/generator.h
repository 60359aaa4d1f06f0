// A device's random number generator: a Philox-4x32-10 stream given by a
// seed and the next unused 128-bit counter, as PyTorch's CUDA generator.
#pragma once

#include <cstdint>
#include <mutex>

namespace npub::sim {

// Note [Random numbers are counter ranges]
// A kernel that draws random numbers reserves a range of counters
// (philox_reserve in the plugin ABI) and computes every number from
// (seed, counter) alone (npubridge/philox.hpp): the result does not depend
// on how many compute threads split the work, concurrent reservations get
// disjoint ranges, and the same seed with the same sequence of
// reservations gives the same numbers. Each device owns a default
// generator; a host makes more (torch.Generator(device="npu")) and binds one
// to the calls it makes (npub::ScopedCallGenerator).
class Generator {
 public:
  struct State {
    uint64_t seed;
    uint64_t offset;  // the next unused counter
  };
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;  // PyTorch's default

  explicit Generator(uint64_t seed = kDefaultSeed) : state_{seed, 0} {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Seeds the stream and starts it at counter 0.
  void manual_seed(uint64_t seed);
  State state() const;
  void set_state(const State& state);
  // Moves the stream to counter `offset`, keeping the seed.
  void set_offset(uint64_t offset);
  // Reserves `count` counters: the seed and the first of them.
  State reserve(uint64_t count);

 private:
  mutable std::mutex mu_;
  State state_;
};

}  // namespace npub::sim
