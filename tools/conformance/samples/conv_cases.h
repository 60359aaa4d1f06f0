// The convolution cases of npub-conformance: 2-d and 3-d, strided, padded,
// dilated, grouped, depthwise and transposed. conv_pool.cpp samples ATen's
// convolution with them, and cann_like's conv2d_bias_relu takes the 2-d ones
// that are not transposed (plugins/cann_like/conformance/samples.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace npub::conformance {

struct ConvCase {
  std::string name;
  std::vector<int64_t> x, w;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
  bool transposed = false;
  std::vector<int64_t> output_padding = {};  // zeros of the spatial rank when empty
  std::vector<int64_t> out_pad() const {
    return output_padding.empty() ? std::vector<int64_t>(x.size() - 2, 0) : output_padding;
  }
  int64_t out_channels() const { return transposed ? w[1] * groups : w[0]; }
};
inline std::vector<ConvCase> conv_cases() {
  return {{"3x3 pad 1", {2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
          {"stride 2, no bias", {1, 4, 9, 7}, {6, 4, 3, 3}, {2, 2}, {0, 0}, {1, 1}, 1, false},
          {"dilation 2, pad 2", {2, 2, 10, 10}, {3, 2, 3, 3}, {1, 1}, {2, 2}, {2, 2}, 1, true},
          {"groups 2, 1x1", {2, 4, 5, 5}, {6, 2, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2, true},
          {"depthwise", {1, 4, 6, 6}, {4, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4, true},
          {"rectangular kernel", {1, 3, 7, 9}, {2, 3, 2, 4}, {1, 2}, {1, 0}, {1, 1}, 1, true},
          {"larger", {4, 16, 28, 28}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
          {"3-d", {2, 3, 5, 6, 4}, {4, 3, 3, 2, 3}, {1, 2, 1}, {1, 0, 1}, {1, 1, 1}, 1, true},
          {"3-d groups 2, dilation 2",
           {1, 4, 7, 6, 6},
           {6, 2, 2, 3, 2},
           {1, 1, 2},
           {0, 1, 0},
           {2, 1, 1},
           2,
           false},
          {"transposed stride 2", {2, 4, 5, 6}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, true, true, {1, 1}},
          {"transposed groups 2, dilation 2",
           {2, 4, 5, 6},
           {4, 3, 3, 2},
           {2, 1},
           {0, 1},
           {2, 2},
           2,
           false,
           true,
           {1, 0}},
          {"transposed 3-d",
           {1, 2, 3, 4, 3},
           {2, 3, 3, 3, 3},
           {2, 2, 2},
           {1, 1, 1},
           {1, 1, 1},
           1,
           true,
           true,
           {1, 0, 1}}};
}

}  // namespace npub::conformance
