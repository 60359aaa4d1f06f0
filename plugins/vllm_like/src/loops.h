// vllm_like's names for what plugins/kernels shares: the ISA levels its
// loops are compiled for (plugin_kernels/isa.h: the element loops for AVX2
// and baseline x86-64, the attention loops for AVX-512 as well), typed
// element access (float_access.h) and the vectorisable math (vec_math.h).
#pragma once

#include <plugin_kernels/float_access.h>
#include <plugin_kernels/isa.h>
#include <plugin_kernels/vec_math.h>

namespace vllm_like {

using plugin_kernels::Isa;
using plugin_kernels::run_at_kernel_isa;

}  // namespace vllm_like
