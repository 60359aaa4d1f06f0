// cann_like: the basic operator library (the role of CANN's aclnn ops).
// Built against the plugin C ABI only.
#pragma once

#include <npubridge/plugin_sdk.hpp>

namespace cann_like {

void register_elementwise(npub::sdk::Registrar& r);
void register_matmul(npub::sdk::Registrar& r);

}  // namespace cann_like
