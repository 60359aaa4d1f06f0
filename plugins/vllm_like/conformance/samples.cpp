// npub-conformance's samples and reference of vllm_like::silu_and_mul
// (plugins/vllm_like). Compiled into npub-conformance (tools/CMakeLists.txt),
// not into the plugin.
#include "sample_kit.h"

#include <stdexcept>

namespace npub::conformance {
namespace {

SampleFn silu_and_mul_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    out.push_back({"[4,32]", {at::empty({4, 16}, at::TensorOptions().dtype(dt)), make({4, 32}, dt)}});
    out.push_back({"[2,3,64]", {at::empty({2, 3, 32}, at::TensorOptions().dtype(dt)), make({2, 3, 64}, dt)}});
    out.push_back(
        {"odd last dim (error)", {at::empty({4, 2}, at::TensorOptions().dtype(dt)), make({4, 5}, dt)}});
    return out;
  };
}

}  // namespace

void add_vllm_like_samples(SampleTable& t) {
  t.samples("vllm_like::silu_and_mul", silu_and_mul_spec());
  t.reference("vllm_like::silu_and_mul", [](const std::vector<IValue>& a) {
    at::Tensor in = a[1].toTensor();
    const int64_t d = in.size(-1) / 2;
    if (in.size(-1) % 2 != 0) throw std::invalid_argument("input's last dimension must be even");
    return std::vector<at::Tensor>{at::silu(in.narrow(-1, 0, d)) * in.narrow(-1, d, d)};
  });
}

}  // namespace npub::conformance
