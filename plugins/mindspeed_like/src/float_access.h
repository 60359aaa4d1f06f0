// mindspeed_like's names for what plugins/kernels shares: typed element
// access (plugin_kernels/float_access.h), the vectorisable math
// (vec_math.h) and the ISA levels its loops are compiled for (isa.h).
#pragma once

#include <plugin_kernels/float_access.h>
#include <plugin_kernels/isa.h>
#include <plugin_kernels/vec_math.h>

namespace mindspeed_like {

using plugin_kernels::BF16;
using plugin_kernels::blocked_sum;
using plugin_kernels::elements;
using plugin_kernels::exp_nonpositive;
using plugin_kernels::F16;
using plugin_kernels::F32;
using plugin_kernels::F64;
using plugin_kernels::Isa;
using plugin_kernels::run_at_kernel_isa;
using plugin_kernels::sigmoid;
using plugin_kernels::with_float_types;

}  // namespace mindspeed_like
