// The instruction-set cap a plugin reads from its own environment variable
// (NPUB_CANN_MAX_ISA, NPUB_MINDSPEED_MAX_ISA): one parser, so that every
// in-tree plugin reads the setting as the host reads its own.
#pragma once

namespace plugin_kernels {

// Highest level a plugin's own loops may use, in increasing order.
enum class IsaCap : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// Reads `variable`: surrounding white space aside, exactly one of
// baseline, avx2, avx512, or unset/empty (no cap: kAvx512). Anything else
// throws npub::sdk::Error naming the variable, the accepted values and
// what was found, so that the plugin's initialize fails and the host
// rejects that plugin alone (Note [A plugin's bad setting rejects that
// plugin only], dispatcher/src/plugin_loader.cpp).
IsaCap isa_cap_from_environment(const char* variable);

}  // namespace plugin_kernels
