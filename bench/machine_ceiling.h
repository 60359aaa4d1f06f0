// What this machine can compute at best, measured in the same run as the
// benchmarks, so that a kernel's GFLOP/s reads as a fraction of it; and, as
// a reference only, the memory bandwidth a STREAM triad reaches.
//
// Note [The triad is a reference, not a memory ceiling]: the compute peaks
// bound every kernel (no kernel issues more FMAs than registers allow), but
// a triad measured once, for a tenth of a second, before the benchmarks on
// a machine other jobs share bounds nothing the kernels reach later: the
// memory system's state moves between the two. The triad was also, until
// this Note, a scalar loop (GCC 12 at -O2 does not vectorise a loop whose trip
// count it cannot prove a multiple of the vector width, and target_clones
// did not change that), which on this machine moves about half of what an
// AVX-512 loop moves: cann_like's vector add, mul and bf16 add reached
// 194-238% of that "ceiling" in bench/results/cann.json. The triad is now
// written with vector intrinsics, as the kernels are, and reported beside
// the results, but no memory-bound case is given a share of it.
#pragma once

namespace npub::bench {

struct MachineCeiling {
  double fp32_gflops = 0;  // fused multiply-adds in registers, all threads
  double bf16_gflops = 0;  // bf16 dot products (vdpbf16ps) in registers; 0 without AVX512-BF16
  double triad_gbps = 0;   // STREAM triad over 3 x 128 MiB floats, 12 bytes an element, all
                           // threads: a reference, not a bound (Note above)
  const char* isa = "";    // the vector width the peaks and the triad were measured at
};

// Runs each probe on `threads` threads (~0.1 s each) and keeps the best of 3.
MachineCeiling measure_machine_ceiling(int threads);

}  // namespace npub::bench
