// npub-conformance's samples and reference of cann_like's own op,
// cann_like::conv2d_bias_relu (plugins/cann_like/src/conv.cpp). Compiled
// into npub-conformance (tools/CMakeLists.txt), not into the plugin.
#include "conv_cases.h"
#include "sample_kit.h"

namespace npub::conformance {
namespace {

SampleFn conv2d_bias_relu_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    for (const ConvCase& c : conv_cases())
      if (c.x.size() == 4 && !c.transposed)
        out.push_back({c.name,
                       {make(c.x, dt), make(c.w, dt), make({c.w[0]}, dt), IValue(c.stride), IValue(c.padding),
                        IValue(c.dilation), c.groups}});
    return out;
  };
}

}  // namespace

void add_cann_like_samples(SampleTable& t) {
  t.samples("cann_like::conv2d_bias_relu", conv2d_bias_relu_spec());
  t.reference("cann_like::conv2d_bias_relu", [](const std::vector<IValue>& a) {
    return std::vector<at::Tensor>{
        at::relu(at::conv2d(a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), a[3].toIntVector(),
                            a[4].toIntVector(), a[5].toIntVector(), a[6].toInt()))};
  });
}

}  // namespace npub::conformance
