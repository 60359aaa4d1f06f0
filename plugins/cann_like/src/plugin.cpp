#include <plugin_kernels/gemm.h>
#include <plugin_kernels/isa.h>

#include "ops.h"

namespace {
void init(npub::sdk::Registrar& r) {
  plugin_kernels::gemm_pin_libraries();
  plugin_kernels::configure_isa_from_environment("cann_like");
  cann_like::register_copy(r);
  cann_like::register_binary(r);
  cann_like::register_bitwise(r);
  cann_like::register_unary(r);
  cann_like::register_reduce(r);
  cann_like::register_scan(r);
  cann_like::register_softmax(r);
  cann_like::register_matmul(r);
  cann_like::register_nn(r);
  cann_like::register_dropout(r);
  cann_like::register_batch_norm(r);
  cann_like::register_index(r);
  cann_like::register_sort(r);
  cann_like::register_conv(r);
  cann_like::register_pooling(r);
  cann_like::register_random(r);
  cann_like::register_rnn(r);
  cann_like::register_amp(r);
  cann_like::register_norm(r);
  cann_like::register_histogram(r);
  cann_like::register_grouped_mm(r);
  cann_like::register_triangular(r);
  cann_like::register_fusion_patterns(r);  // last: the patterns name the ops above
}
}  // namespace

NPUB_DEFINE_PLUGIN(cann_like, "0.2.0", init)
