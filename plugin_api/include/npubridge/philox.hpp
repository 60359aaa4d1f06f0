// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11), the counter-based generator behind PyTorch's CUDA RNG: a pure
// function of (key = seed, counter), so any element of a random stream can be
// computed independently and in parallel. Header-only; for plugins, with the
// host's NpubHostApi.philox_reserve handing out (seed, counter range).
#ifndef NPUBRIDGE_PHILOX_HPP_
#define NPUBRIDGE_PHILOX_HPP_

#include <array>
#include <cstdint>

namespace npub::philox {

// Four 32-bit outputs of counter `counter` under key `seed`.
inline std::array<uint32_t, 4> block(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// A uniform float in [0, 1) from 32 random bits (24 significant).
inline float uniform(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

}  // namespace npub::philox

#endif  // NPUBRIDGE_PHILOX_HPP_
