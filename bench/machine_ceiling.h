// What this machine can do at best, measured in the same run as the
// benchmarks, so that a kernel's GFLOP/s or GB/s reads as a fraction of it.
#pragma once

namespace npub::bench {

struct MachineCeiling {
  double fp32_gflops = 0;  // fused multiply-adds in registers, all threads
  double bf16_gflops = 0;  // bf16 dot products (vdpbf16ps) in registers; 0 without AVX512-BF16
  double memory_gbps = 0;  // STREAM triad over 3 x 128 MiB floats, 12 bytes an element, all threads
  const char* isa = "";    // the vector width the peaks were measured at
};

// Runs each probe on `threads` threads (~0.1 s each) and keeps the best of 3.
MachineCeiling measure_machine_ceiling(int threads);

}  // namespace npub::bench
