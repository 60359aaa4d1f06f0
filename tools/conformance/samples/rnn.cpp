// The fused RNN cells: LSTM and GRU, forward and backward.
#include "sample_kit.h"

#include <stdexcept>

namespace npub::conformance {
namespace {

struct CellCase {
  std::string name;
  int64_t n, h;
  bool bias;
};
std::vector<CellCase> cell_cases() {
  return {{"with biases", 3, 4, true}, {"no biases", 2, 5, false}, {"larger", 64, 96, true}};
}

// LSTM gates [n, 4h] activated as the cell does: i, f, o sigmoid, g tanh.
at::Tensor lstm_workspace(const at::Tensor& gates) {
  auto c = gates.chunk(4, 1);
  return at::cat({c[0].sigmoid(), c[1].sigmoid(), c[2].tanh(), c[3].sigmoid()}, 1);
}

SampleFn lstm_cell_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases())
      out.push_back({c.name,
                     {make({c.n, 4 * c.h}, dt), make({c.n, 4 * c.h}, dt), make({c.n, c.h}, dt),
                      c.bias ? IValue(make({4 * c.h}, dt)) : IValue(),
                      c.bias ? IValue(make({4 * c.h}, dt)) : IValue()}});
    out.push_back({"gates of another hidden size (error)",
                   {make({2, 12}, dt), make({2, 8}, dt), make({2, 3}, dt), IValue(), IValue()}});
    return out;
  };
}

SampleFn lstm_cell_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases()) {
      at::Tensor gates = make({c.n, 4 * c.h}, dt), cx = make({c.n, c.h}, dt);
      at::Tensor ws = lstm_workspace(gates);
      auto a = ws.chunk(4, 1);
      at::Tensor cy = a[1] * cx + a[0] * a[2];
      out.push_back({c.name, {make({c.n, c.h}, dt), make({c.n, c.h}, dt), cx, cy, ws, c.bias}});
    }
    at::Tensor gates = make({3, 8}, dt), cx = make({3, 2}, dt);
    at::Tensor ws = lstm_workspace(gates);
    auto a = ws.chunk(4, 1);
    out.push_back({"no grad_hy", {IValue(), make({3, 2}, dt), cx, a[1] * cx + a[0] * a[2], ws, true}});
    out.push_back({"no grad_cy", {make({3, 2}, dt), IValue(), cx, a[1] * cx + a[0] * a[2], ws, false}});
    return out;
  };
}

SampleFn gru_cell_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases())
      out.push_back({c.name,
                     {make({c.n, 3 * c.h}, dt), make({c.n, 3 * c.h}, dt), make({c.n, c.h}, dt),
                      c.bias ? IValue(make({3 * c.h}, dt)) : IValue(),
                      c.bias ? IValue(make({3 * c.h}, dt)) : IValue()}});
    out.push_back(
        {"a 1-d hx (error)", {make({2, 9}, dt), make({2, 9}, dt), make({3}, dt), IValue(), IValue()}});
    return out;
  };
}

SampleFn gru_cell_backward_spec() {
  return [](ScalarType dt) {
    std::vector<Sample> out;
    if (!is_float(dt)) return out;
    for (const CellCase& c : cell_cases()) {
      // [r, z, n, hx, hidden n-gate]: gates in their ranges, any hx and n-gate.
      at::Tensor rz = make({c.n, 2 * c.h}, dt).sigmoid(), n = make({c.n, c.h}, dt).tanh();
      at::Tensor ws = at::cat({rz, n, make({c.n, c.h}, dt), make({c.n, c.h}, dt)}, 1);
      out.push_back({c.name, {make({c.n, c.h}, dt), ws, c.bias}});
    }
    return out;
  };
}

}  // namespace

void add_rnn_samples(SampleTable& t) {
  t.samples("aten::_thnn_fused_lstm_cell", lstm_cell_spec());
  t.samples("aten::_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward_spec());
  t.samples("aten::_thnn_fused_gru_cell", gru_cell_spec());
  t.samples("aten::_thnn_fused_gru_cell_backward", gru_cell_backward_spec());
  // ATen's CPU backend has no fused RNN cells (CUDA has them): the
  // reference is ATen's CPU LSTM cell on the summed gates (an identity
  // input weight, no hidden state), and for the backward ATen's own
  // derivative of the cell, _thnn_differentiable_lstm_cell_backward, on
  // gates recovered from the workspace (Note [The fused RNN cells'
  // workspace] in plugins/cann_like/src/rnn.cpp).
  t.reference("aten::_thnn_fused_lstm_cell", [](const std::vector<IValue>& a) {
    at::Tensor ig = a[0].toTensor(), hg = a[1].toTensor(), cx = a[2].toTensor();
    at::Tensor ib = a[3].isNone() ? at::Tensor() : a[3].toTensor();
    at::Tensor hb = a[4].isNone() ? at::Tensor() : a[4].toTensor();
    if (cx.dim() != 2 || !ig.sizes().equals({cx.size(0), 4 * cx.size(1)}) || !hg.sizes().equals(ig.sizes()))
      throw std::invalid_argument("gates must be [batch, 4 * hidden]");
    const int64_t gates = ig.size(1);
    at::Tensor eye = at::eye(gates, ig.options());
    auto [hy, cy] = at::lstm_cell(at::cat({ig, hg}, 1), {at::zeros_like(cx), cx}, at::cat({eye, eye}, 1),
                                  at::zeros({gates, cx.size(1)}, ig.options()), ib, hb);
    at::Tensor sum = ig + hg;
    if (ib.defined()) sum = sum + ib + hb;
    return std::vector<at::Tensor>{hy, cy, lstm_workspace(sum)};
  });
  t.reference("aten::_thnn_fused_lstm_cell_backward_impl", [](const std::vector<IValue>& a) {
    at::Tensor cx = a[2].toTensor(), cy = a[3].toTensor(), ws = a[4].toTensor();
    auto w = ws.chunk(4, 1);
    at::Tensor pre = at::cat({at::logit(w[0]), at::logit(w[1]), at::atanh(w[2]), at::logit(w[3])}, 1);
    auto opt = [](const IValue& v) { return v.isNone() ? std::optional<at::Tensor>() : v.toTensor(); };
    auto r = at::_thnn_differentiable_lstm_cell_backward(opt(a[0]), opt(a[1]), pre, at::zeros_like(pre), {},
                                                         {}, cx, cy);
    std::vector<at::Tensor> out{std::get<0>(r), std::get<2>(r)};
    if (a[5].toBool()) out.push_back(std::get<0>(r).sum(0));
    return out;
  });
  // GRU: ATen's CPU cell computes r = sigmoid(ir + hr), z = sigmoid(iz + hz),
  // n = tanh(in + r * hn), hy = (hx - n) * z + n; the backward is ATen's
  // _thnn_differentiable_gru_cell_backward on gates recovered from the
  // workspace [r, z, n, hx, hn].
  t.reference("aten::_thnn_fused_gru_cell", [](const std::vector<IValue>& a) {
    at::Tensor ig = a[0].toTensor(), hg = a[1].toTensor(), hx = a[2].toTensor();
    if (hx.dim() != 2 || !ig.sizes().equals({hx.size(0), 3 * hx.size(1)}) || !hg.sizes().equals(ig.sizes()))
      throw std::invalid_argument("gates must be [batch, 3 * hidden]");
    if (!a[3].isNone()) ig = ig + a[3].toTensor();
    if (!a[4].isNone()) hg = hg + a[4].toTensor();
    auto i = ig.chunk(3, 1), h = hg.chunk(3, 1);
    at::Tensor r = (i[0] + h[0]).sigmoid(), z = (i[1] + h[1]).sigmoid();
    at::Tensor n = (i[2] + r * h[2]).tanh();
    return std::vector<at::Tensor>{(hx - n) * z + n, at::cat({r, z, n, hx, h[2]}, 1)};
  });
  t.reference("aten::_thnn_fused_gru_cell_backward", [](const std::vector<IValue>& a) {
    at::Tensor ghy = a[0].toTensor();
    auto w = a[1].toTensor().chunk(5, 1);
    at::Tensor zeros = at::zeros_like(w[0]);
    at::Tensor ig = at::cat({at::logit(w[0]), at::logit(w[1]), at::atanh(w[2]) - w[0] * w[4]}, 1);
    at::Tensor hg = at::cat({zeros, zeros, w[4]}, 1);
    auto r = at::_thnn_differentiable_gru_cell_backward(ghy, ig, hg, w[3], {}, {});
    std::vector<at::Tensor> out{std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    if (a[2].toBool()) {
      out.push_back(std::get<0>(r).sum(0));
      out.push_back(std::get<1>(r).sum(0));
    }
    return out;
  });
}

}  // namespace npub::conformance
