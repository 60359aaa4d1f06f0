// Losses: nll_loss, forward and backward.
#include "sample_kit.h"

namespace npub::conformance {
namespace {

SampleFn nll_loss_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor t = rand_index({6}, 5);
    t[2] = -100;  // ignored
    for (int64_t red : {0, 1, 2}) {
      out.push_back({"[6,5] reduction " + std::to_string(red),
                     {make({6, 5}, dt), t, IValue(), red, int64_t{-100}, empty_out(dt), empty_out(dt)}});
      out.push_back(
          {"weighted, reduction " + std::to_string(red),
           {make({6, 5}, dt, 1), t, make({5}, dt, 1), red, int64_t{-100}, empty_out(dt), empty_out(dt)}});
    }
    out.push_back({"1-d input",
                   {make({5}, dt), long_tensor({3}, {}), IValue(), int64_t{1}, int64_t{-100}, empty_out(dt),
                    empty_out(dt)}});
    out.push_back({"target out of bounds (error)",
                   {make({2, 5}, dt), long_tensor({1, 7}, {2}), IValue(), int64_t{1}, int64_t{-100},
                    empty_out(dt), empty_out(dt)}});
    return out;
  };
}

SampleFn nll_loss_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    at::Tensor t = rand_index({6}, 5);
    t[1] = -100;
    for (int64_t red : {0, 1, 2}) {
      for (bool weighted : {false, true}) {
        at::Tensor x = make({6, 5}, dt);
        at::Tensor w = weighted ? make({5}, dt, 1) : at::Tensor();
        auto fwd = at::nll_loss_forward(x, t, w, red, -100);
        at::Tensor go = red == 0 ? make({6}, dt) : make({}, dt);
        out.push_back({std::string(weighted ? "weighted, " : "") + "reduction " + std::to_string(red),
                       {go, x, t, weighted ? IValue(w) : IValue(), red, int64_t{-100}, std::get<1>(fwd),
                        empty_out(dt)}});
      }
    }
    return out;
  };
}

}  // namespace

void add_loss_samples(SampleTable& t) {
  t.samples("aten::nll_loss_forward.output", nll_loss_spec());
  t.samples("aten::nll_loss_backward.grad_input", nll_loss_backward_spec());
}

}  // namespace npub::conformance
