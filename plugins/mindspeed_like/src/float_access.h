// mindspeed_like's names for the shared typed element access
// (plugin_kernels/float_access.h).
#pragma once

#include <plugin_kernels/float_access.h>

#include "isa.h"

namespace mindspeed_like {

using plugin_kernels::BF16;
using plugin_kernels::blocked_sum;
using plugin_kernels::elements;
using plugin_kernels::exp_nonpositive;
using plugin_kernels::F16;
using plugin_kernels::F32;
using plugin_kernels::F64;
using plugin_kernels::sigmoid;
using plugin_kernels::with_float_types;

}  // namespace mindspeed_like
