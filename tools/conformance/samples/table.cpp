// npub-conformance's sample table: every family's samples, references and
// property checks (sample_kit.h says how a family registers them), built
// once, on first use.
#include "sample_kit.h"

namespace npub::conformance {

namespace {

const SampleTable& table() {
  static const SampleTable t = [] {
    SampleTable t;
    add_copy_fill_samples(t);
    add_binary_samples(t);
    add_unary_samples(t);
    add_reduction_samples(t);
    add_normalization_samples(t);
    add_matmul_samples(t);
    add_indexing_samples(t);
    add_loss_samples(t);
    add_random_samples(t);
    add_conv_pool_samples(t);
    add_rnn_samples(t);
    add_amp_samples(t);
    add_cann_like_samples(t);
    add_mindspeed_like_samples(t);
    add_vllm_like_samples(t);
    return t;
  }();
  return t;
}

}  // namespace

const std::map<std::string, SampleFn>& sample_specs() { return table().sample_specs(); }
const std::map<std::string, ReferenceFn>& reference_library() { return table().references(); }
const std::map<std::string, PropertyFn>& property_checks() { return table().properties(); }

}  // namespace npub::conformance
