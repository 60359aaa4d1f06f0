#include "ops.h"

namespace {
void init(npub::sdk::Registrar& r) {
  cann_like::register_elementwise(r);
  cann_like::register_matmul(r);
}
}  // namespace

NPUB_DEFINE_PLUGIN(cann_like, "0.1.0", init)
