// The fused RNN cells on the CPU (see rnn_cells.h). The workspace the
// forward saves has the layout the plugins' kernels use, so a forward and a
// backward served by different sides meet (Note [The fused RNN cells'
// workspace] in plugins/cann_like/src/rnn.cpp).
#include "aten/rnn_cells.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace npub::torch_backend {

namespace {

at::Tensor on_cpu(const c10::IValue& v) {
  if (v.isNone()) return at::Tensor();
  const at::Tensor& t = v.toTensor();
  return t.defined() ? t.cpu() : t;
}

at::Tensor plus_bias(const at::Tensor& gates, const at::Tensor& bias) {
  return bias.defined() ? gates + bias : gates;
}

// (hy, cy, workspace [i, f, g, o]) as ATen's CPU LSTMCell computes them.
std::vector<at::Tensor> lstm_cell(const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& cx,
                                  const at::Tensor& ib, const at::Tensor& hb) {
  const auto gates = plus_bias(ig, ib) + plus_bias(hg, hb);
  const auto chunks = gates.chunk(4, 1);
  const auto i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  const auto cy = f * cx + i * g;
  return {o * cy.tanh(), cy, at::cat({i, f, g, o}, 1)};
}

// (grad_gates, grad_cx, grad_bias): the derivative of lstm_cell.
std::vector<at::Tensor> lstm_cell_backward(at::Tensor ghy, at::Tensor gcy, const at::Tensor& cx,
                                           const at::Tensor& cy, const at::Tensor& ws, bool has_bias) {
  if (!ghy.defined()) ghy = at::zeros_like(cx);
  if (!gcy.defined()) gcy = at::zeros_like(cx);
  const auto w = ws.chunk(4, 1);
  const auto &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const auto t = cy.tanh();
  const auto dc = ghy * o * (1 - t * t) + gcy;
  const auto grad_gates =
      at::cat({dc * g * i * (1 - i), dc * cx * f * (1 - f), dc * i * (1 - g * g), ghy * t * o * (1 - o)}, 1);
  return {grad_gates, dc * f, has_bias ? grad_gates.sum(0) : at::Tensor()};
}

// (hy, workspace [r, z, n, hx, hidden n-gate]) as ATen's CPU GRUCell computes them.
std::vector<at::Tensor> gru_cell(const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& hx,
                                 const at::Tensor& ib, const at::Tensor& hb) {
  const auto in = plus_bias(ig, ib).chunk(3, 1);
  const auto hid = plus_bias(hg, hb).chunk(3, 1);
  const auto r = (in[0] + hid[0]).sigmoid();
  const auto z = (in[1] + hid[1]).sigmoid();
  const auto n = (in[2] + r * hid[2]).tanh();
  return {(hx - n) * z + n, at::cat({r, z, n, hx, hid[2]}, 1)};
}

// (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::vector<at::Tensor> gru_cell_backward(const at::Tensor& ghy, const at::Tensor& ws, bool has_bias) {
  const auto w = ws.chunk(5, 1);
  const auto &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  const auto dn = ghy * (1 - z) * (1 - n * n);
  const auto dz = ghy * (hx - n) * z * (1 - z);
  const auto dr = dn * hn * r * (1 - r);
  const auto gi = at::cat({dr, dz, dn}, 1);
  const auto gh = at::cat({dr, dz, dn * r}, 1);
  return {gi, gh, ghy * z, has_bias ? gi.sum(0) : at::Tensor(), has_bias ? gh.sum(0) : at::Tensor()};
}

}  // namespace

bool is_fused_rnn_cell(const c10::OperatorName& name) {
  if (!name.overload_name.empty()) return false;
  return name.name == "aten::_thnn_fused_lstm_cell" ||
         name.name == "aten::_thnn_fused_lstm_cell_backward_impl" ||
         name.name == "aten::_thnn_fused_gru_cell" || name.name == "aten::_thnn_fused_gru_cell_backward";
}

void run_fused_rnn_cell_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.schema().operator_name().name;
  const size_t nargs = op.schema().arguments().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= nargs, "npubridge: ", name, ": the stack lacks its arguments");
  const std::vector<c10::IValue> a(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end());
  stack->resize(stack->size() - nargs);
  std::vector<at::Tensor> out;
  if (name == "aten::_thnn_fused_lstm_cell")
    out = lstm_cell(on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]));
  else if (name == "aten::_thnn_fused_lstm_cell_backward_impl")
    out = lstm_cell_backward(on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]),
                             a[5].toBool());
  else if (name == "aten::_thnn_fused_gru_cell")
    out = gru_cell(on_cpu(a[0]), on_cpu(a[1]), on_cpu(a[2]), on_cpu(a[3]), on_cpu(a[4]));
  else
    out = gru_cell_backward(on_cpu(a[0]), on_cpu(a[1]), a[2].toBool());
  for (auto& t : out) stack->emplace_back(std::move(t));
}

}  // namespace npub::torch_backend
