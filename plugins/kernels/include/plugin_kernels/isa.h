// The instruction-set levels of the in-tree plugins' own loops: what each
// level means, the one setting that caps it (NPUB_PLUGINS_MAX_ISA), and the
// one way a loop is compiled per level and picked at run time. cann_like,
// mindspeed_like and vllm_like all compile this (plugins/kernels is linked
// into each), so "avx2" means the same thing in all three.
//
// Note [One ISA layer for the in-tree plugins]
// The plugins are built for baseline x86-64 (SSE2: 4-wide float vectors,
// std::fma a library call). A loop that must run wider is written once, as
// an always-inline body, and compiled once per level by run_at_kernel_isa
// (or PLUGIN_KERNELS_ISA_DISPATCH for a plain function), which calls the
// variant for kernel_isa(): the CPU's level, capped by NPUB_PLUGINS_MAX_ISA.
// The variants are picked here, at run time, rather than by the loader's
// ifunc resolution (target_clones), which follows the CPU alone and cannot
// be capped. The correctness suite must pass on whichever path a CPU takes,
// so tests force every path down to the portable one: these loops through
// NPUB_PLUGINS_MAX_ISA, oneDNN (the GEMM: plugin_kernels/gemm.h) through
// ONEDNN_MAX_CPU_ISA, ATen (the reference) through ATEN_CPU_CAPABILITY
// (tests/CMakeLists.txt: the *_baseline_isa and *_portable_isa tests).
// A level is a set of CPU features, each a superset of the one below:
//   kBaseline  x86-64 (SSE2).
//   kAvx2      AVX2, FMA and F16C: the vector features of x86-64-v3, which
//              every CPU with AVX2 since Haswell and Zen 1 has.
//   kAvx512    kAvx2's and AVX-512 F, BW, DQ and VL: the vector features
//              of x86-64-v4 but CD, which every AVX-512 server CPU since
//              Skylake-SP has.
// A body compiled for kAvx2 may contract a * b + c into one FMA (GCC does
// under -ffp-contract=fast, its default): one rounding less than the
// baseline variant, which every error bound allows. A file whose results
// must round where the source rounds turns contraction off
// (mindspeed_like's Adam kernels).
#pragma once

#include <utility>

// Always inlined: a body is inlined into each per-level variant, and
// compiled there with that variant's instruction set (a call would run it
// at the baseline level).
#define PLUGIN_KERNELS_INLINE inline __attribute__((always_inline))

// The features of each level, as target attributes (Note [One ISA layer for
// the in-tree plugins]).
#define PLUGIN_KERNELS_AVX2_FEATURES "avx2,fma,f16c"
#define PLUGIN_KERNELS_AVX512_FEATURES "avx512f,avx512bw,avx512dq,avx512vl," PLUGIN_KERNELS_AVX2_FEATURES
#define PLUGIN_KERNELS_TARGET_AVX2 __attribute__((target(PLUGIN_KERNELS_AVX2_FEATURES)))
#define PLUGIN_KERNELS_TARGET_AVX512 __attribute__((target(PLUGIN_KERNELS_AVX512_FEATURES)))

namespace plugin_kernels {

// In increasing order; see the Note above for what each level holds.
enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// "baseline", "avx2", "avx512": the values NPUB_PLUGINS_MAX_ISA takes.
const char* isa_name(Isa level);

// The highest level this CPU has (probed once).
Isa cpu_isa();

// Reads NPUB_PLUGINS_MAX_ISA: surrounding white space aside, exactly one of
// baseline, avx2, avx512, or unset/empty (no cap). Anything else throws
// npub::sdk::Error naming the variable, the accepted values and what was
// found, so that the plugin's initialize fails and the host rejects that
// plugin alone (Note [A plugin's bad setting rejects that plugin only],
// dispatcher/src/plugin_loader.cpp); so does a value in one of the
// per-plugin caps this one replaced (NPUB_CANN_MAX_ISA,
// NPUB_MINDSPEED_MAX_ISA, NPUB_VLLM_MAX_ISA), rather than be ignored. Each
// in-tree plugin calls it first in its initialize; the level is the
// plugin's (each plugin links its own copy of this library), so the
// environment of its last initialize holds. Logs the level at info,
// naming `plugin`.
void configure_isa_from_environment(const char* plugin);

// The level the plugin's loops run at: min(cpu_isa(), the cap). Read by
// every kernel call on any thread while an initialize may set it: an atomic.
Isa kernel_isa();

namespace detail {

template <typename Body, typename... Args>
PLUGIN_KERNELS_TARGET_AVX512 decltype(auto) run_avx512(Args&&... args) {
  return Body::template run<Isa::kAvx512>(std::forward<Args>(args)...);
}
template <typename Body, typename... Args>
PLUGIN_KERNELS_TARGET_AVX2 decltype(auto) run_avx2(Args&&... args) {
  return Body::template run<Isa::kAvx2>(std::forward<Args>(args)...);
}
template <typename Body, typename... Args>
decltype(auto) run_baseline(Args&&... args) {
  return Body::template run<Isa::kBaseline>(std::forward<Args>(args)...);
}

}  // namespace detail

// Body::run<L>(args...) compiled for level L = kernel_isa(), at most kTop (a
// body that gains nothing from AVX-512 names kTop = kAvx2 and runs its AVX2
// variant there). Body is a struct with
//   template <Isa L> static PLUGIN_KERNELS_INLINE R run(...);
// L lets a body choose what only some levels have (an F16C conversion,
// float_access.h); a body must not call a function marked for a level above
// L. A lambda cannot be a body: it would not inherit the variant's target.
template <typename Body, Isa kTop = Isa::kAvx512, typename... Args>
PLUGIN_KERNELS_INLINE decltype(auto) run_at_kernel_isa(Args&&... args) {
  const Isa level = kernel_isa();
  if constexpr (kTop >= Isa::kAvx512)
    if (level >= Isa::kAvx512) return detail::run_avx512<Body>(std::forward<Args>(args)...);
  if constexpr (kTop >= Isa::kAvx2)
    if (level >= Isa::kAvx2) return detail::run_avx2<Body>(std::forward<Args>(args)...);
  return detail::run_baseline<Body>(std::forward<Args>(args)...);
}

}  // namespace plugin_kernels

// Defines `ret name params`, which runs `body args` compiled for the level
// kernel_isa() picks (run_at_kernel_isa): the same for a plain
// always-inline function `body` (PLUGIN_KERNELS_INLINE).
#define PLUGIN_KERNELS_ISA_DISPATCH(ret, name, body, params, args) \
  struct name##_isa_body {                                         \
    template <::plugin_kernels::Isa>                               \
    static PLUGIN_KERNELS_INLINE ret run params {                  \
      return body args;                                            \
    }                                                              \
  };                                                               \
  ret name params { return ::plugin_kernels::run_at_kernel_isa<name##_isa_body> args; }
