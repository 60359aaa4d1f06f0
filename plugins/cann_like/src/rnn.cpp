// The fused LSTM and GRU cells ATen calls for accelerator tensors
// (RNN.cpp's LSTMCell/GRUCell take this path on CUDA, XPU and PrivateUse1):
// the cell's pointwise part after the two gate GEMMs, and its backward.
//
// Note [The fused RNN cells' workspace]
// Forward and backward may run on different implementations (this kernel,
// or the host's fallback when a call is declined), so the workspace the
// forward saves has one layout, the one CUDA's kernels use:
//   LSTM: [N, 4H] = the activated gates i, f, g, o;
//   GRU:  [N, 5H] = r, z, n (activated), hx, and the hidden n-gate
//         (hidden_gates' third chunk plus its bias), which the reset gate
//         multiplies.
#include "elementwise.h"
#include "ops.h"

#include <cmath>

namespace cann_like {

namespace {

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// Checks the gate tensors of a cell with `k` gates against its state [N, H]:
// gates [N, k*H], biases [k*H]. Returns H.
int64_t check_cell(const Call& call, const TensorRef& input_gates, const TensorRef& hidden_gates,
                   const TensorRef& state, const char* state_name, const TensorRef& input_bias,
                   const TensorRef& hidden_bias, int64_t k) {
  for (const auto& [t, name] : {std::pair{input_gates, "input_gates"},
                                std::pair{hidden_gates, "hidden_gates"}, std::pair{state, state_name},
                                std::pair{input_bias, "input_bias"}, std::pair{hidden_bias, "hidden_bias"}})
    require_f32(call, t, name);
  if (state.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT, std::string(state_name) +
                                             ": expected a 2-d [batch, hidden] tensor but found " +
                                             shape_str(state.sizes()));
  const int64_t n = state.size(0), h = state.size(1);
  check_out(call, input_gates, {n, k * h}, "input_gates");
  check_out(call, hidden_gates, {n, k * h}, "hidden_gates");
  if (input_bias.defined() != hidden_bias.defined())
    call.fail(NPUB_ERR_INVALID_ARGUMENT, "input_bias and hidden_bias: expected both or neither");
  if (input_bias.defined()) {
    check_out(call, input_bias, {k * h}, "input_bias");
    check_out(call, hidden_bias, {k * h}, "hidden_bias");
  }
  return h;
}

// The gates' pre-activation value of column c in row r: input + hidden + biases.
struct Gates {
  const float *ig, *hg, *ib, *hb;
  int64_t width;
  float input(int64_t r, int64_t c) const { return ig[r * width + c] + (ib != nullptr ? ib[c] : 0.0f); }
  float hidden(int64_t r, int64_t c) const { return hg[r * width + c] + (hb != nullptr ? hb[c] : 0.0f); }
};

Gates gates_of(const TensorRef& ig, const TensorRef& hg, const TensorRef& ib, const TensorRef& hb) {
  return {ig.data<float>(), hg.data<float>(), ib.defined() ? ib.data<float>() : nullptr,
          hb.defined() ? hb.data<float>() : nullptr, ig.size(1)};
}

int64_t rows_per_task(int64_t h) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(h, 1)); }

// aten::_thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
//     -> (hy, cy, workspace)
void lstm_cell(Call& call) {
  TensorRef ig = call.tensor(0), hg = call.tensor(1), cx = call.tensor(2);
  TensorRef ib = call.optional_tensor(3), hb = call.optional_tensor(4);
  const int64_t h = check_cell(call, ig, hg, cx, "cx", ib, hb, 4);
  const int64_t n = cx.size(0);
  TensorRef hy = call.output(0, {n, h}, cx.dtype());
  TensorRef cy = call.output(1, {n, h}, cx.dtype());
  TensorRef ws = call.output(2, {n, 4 * h}, cx.dtype());
  const Gates g = gates_of(ig, hg, ib, hb);
  const float* c0 = cx.data<float>();
  float *hp = hy.data<float>(), *cp = cy.data<float>(), *wp = ws.data<float>();
  call.parallel_for(0, n, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const float i = sigmoid(g.input(r, j) + g.hidden(r, j));
        const float f = sigmoid(g.input(r, h + j) + g.hidden(r, h + j));
        const float c = std::tanh(g.input(r, 2 * h + j) + g.hidden(r, 2 * h + j));
        const float o = sigmoid(g.input(r, 3 * h + j) + g.hidden(r, 3 * h + j));
        const float next = f * c0[r * h + j] + i * c;
        cp[r * h + j] = next;
        hp[r * h + j] = o * std::tanh(next);
        float* w = wp + r * 4 * h;
        w[j] = i;
        w[h + j] = f;
        w[2 * h + j] = c;
        w[3 * h + j] = o;
      }
  });
}

// aten::_thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
//     -> (grad_gates, grad_cx, grad_bias)
void lstm_cell_backward(Call& call) {
  TensorRef ghy = call.optional_tensor(0), gcy = call.optional_tensor(1);
  TensorRef cx = call.tensor(2), cy = call.tensor(3), ws = call.tensor(4);
  const bool has_bias = call.bool_arg(5);
  for (const auto& [t, name] : {std::pair{ghy, "grad_hy"}, std::pair{gcy, "grad_cy"}, std::pair{cx, "cx"},
                                std::pair{cy, "cy"}, std::pair{ws, "workspace"}})
    require_f32(call, t, name);
  if (cx.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "cx: expected a 2-d [batch, hidden] tensor but found " + shape_str(cx.sizes()));
  const int64_t n = cx.size(0), h = cx.size(1);
  check_out(call, cy, {n, h}, "cy");
  check_out(call, ws, {n, 4 * h}, "workspace");
  if (ghy.defined()) check_out(call, ghy, {n, h}, "grad_hy");
  if (gcy.defined()) check_out(call, gcy, {n, h}, "grad_cy");
  TensorRef gg = call.output(0, {n, 4 * h}, cx.dtype());
  TensorRef gcx = call.output(1, {n, h}, cx.dtype());
  TensorRef gb = has_bias ? call.output(2, {4 * h}, cx.dtype()) : TensorRef();
  const float* gh = ghy.defined() ? ghy.data<float>() : nullptr;
  const float* gc = gcy.defined() ? gcy.data<float>() : nullptr;
  const float *c0 = cx.data<float>(), *c1 = cy.data<float>(), *wp = ws.data<float>();
  float *gp = gg.data<float>(), *gcxp = gcx.data<float>();
  call.parallel_for(0, n, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const int64_t e = r * h + j;
        const float* w = wp + r * 4 * h;
        const float i = w[j], f = w[h + j], c = w[2 * h + j], o = w[3 * h + j];
        const float t = std::tanh(c1[e]);
        const float dh = gh != nullptr ? gh[e] : 0.0f;
        const float dc = dh * o * (1.0f - t * t) + (gc != nullptr ? gc[e] : 0.0f);
        float* d = gp + r * 4 * h;
        d[j] = dc * c * i * (1.0f - i);
        d[h + j] = dc * c0[e] * f * (1.0f - f);
        d[2 * h + j] = dc * i * (1.0f - c * c);
        d[3 * h + j] = dh * t * o * (1.0f - o);
        gcxp[e] = dc * f;
      }
  });
  if (has_bias) channel_sums(gp, n, 4 * h, 1, gb.data<float>());
}

// aten::_thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
//     -> (hy, workspace)
void gru_cell(Call& call) {
  TensorRef ig = call.tensor(0), hg = call.tensor(1), hx = call.tensor(2);
  TensorRef ib = call.optional_tensor(3), hb = call.optional_tensor(4);
  const int64_t h = check_cell(call, ig, hg, hx, "hx", ib, hb, 3);
  const int64_t n = hx.size(0);
  TensorRef hy = call.output(0, {n, h}, hx.dtype());
  TensorRef ws = call.output(1, {n, 5 * h}, hx.dtype());
  const Gates g = gates_of(ig, hg, ib, hb);
  const float* h0 = hx.data<float>();
  float *hp = hy.data<float>(), *wp = ws.data<float>();
  call.parallel_for(0, n, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const float reset = sigmoid(g.input(r, j) + g.hidden(r, j));
        const float update = sigmoid(g.input(r, h + j) + g.hidden(r, h + j));
        const float hidden_n = g.hidden(r, 2 * h + j);
        const float candidate = std::tanh(g.input(r, 2 * h + j) + reset * hidden_n);
        const float prev = h0[r * h + j];
        hp[r * h + j] = candidate + update * (prev - candidate);
        float* w = wp + r * 5 * h;
        w[j] = reset;
        w[h + j] = update;
        w[2 * h + j] = candidate;
        w[3 * h + j] = prev;
        w[4 * h + j] = hidden_n;
      }
  });
}

// aten::_thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
//     -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
void gru_cell_backward(Call& call) {
  TensorRef ghy = call.tensor(0), ws = call.tensor(1);
  const bool has_bias = call.bool_arg(2);
  require_f32(call, ghy, "grad_hy");
  require_f32(call, ws, "workspace");
  if (ghy.dim() != 2)
    call.fail(NPUB_ERR_INVALID_ARGUMENT,
              "grad_hy: expected a 2-d [batch, hidden] tensor but found " + shape_str(ghy.sizes()));
  const int64_t n = ghy.size(0), h = ghy.size(1);
  check_out(call, ws, {n, 5 * h}, "workspace");
  TensorRef gi = call.output(0, {n, 3 * h}, ghy.dtype());
  TensorRef ghg = call.output(1, {n, 3 * h}, ghy.dtype());
  TensorRef ghx = call.output(2, {n, h}, ghy.dtype());
  TensorRef gib = has_bias ? call.output(3, {3 * h}, ghy.dtype()) : TensorRef();
  TensorRef ghb = has_bias ? call.output(4, {3 * h}, ghy.dtype()) : TensorRef();
  const float *gh = ghy.data<float>(), *wp = ws.data<float>();
  float *gip = gi.data<float>(), *ghp = ghg.data<float>(), *ghxp = ghx.data<float>();
  call.parallel_for(0, n, rows_per_task(h), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const float* w = wp + r * 5 * h;
        const float reset = w[j], update = w[h + j], candidate = w[2 * h + j], prev = w[3 * h + j],
                    hidden_n = w[4 * h + j];
        const float d = gh[r * h + j];
        const float d_candidate = d * (1.0f - update) * (1.0f - candidate * candidate);
        const float d_update = d * (prev - candidate) * update * (1.0f - update);
        const float d_reset = d_candidate * hidden_n * reset * (1.0f - reset);
        float* a = gip + r * 3 * h;
        float* b = ghp + r * 3 * h;
        a[j] = b[j] = d_reset;
        a[h + j] = b[h + j] = d_update;
        a[2 * h + j] = d_candidate;
        b[2 * h + j] = d_candidate * reset;
        ghxp[r * h + j] = d * update;
      }
  });
  if (has_bias) {
    channel_sums(gip, n, 3 * h, 1, gib.data<float>());
    channel_sums(ghp, n, 3 * h, 1, ghb.data<float>());
  }
}

}  // namespace

void register_rnn(npub::sdk::Registrar& r) {
  using namespace npub::sdk;
  r.op("aten::_thnn_fused_lstm_cell(Tensor input_gates, Tensor hidden_gates, Tensor cx, Tensor? "
       "input_bias=None, Tensor? hidden_bias=None) -> (Tensor, Tensor, Tensor)",
       &lstm_cell)
      .dtypes({kFloat32})
      .contiguous_only();
  r.op("aten::_thnn_fused_lstm_cell_backward_impl(Tensor? grad_hy, Tensor? grad_cy, Tensor cx, Tensor cy, "
       "Tensor workspace, bool has_bias) -> (Tensor, Tensor, Tensor)",
       &lstm_cell_backward)
      .dtypes({kFloat32})
      .contiguous_only();
  r.op("aten::_thnn_fused_gru_cell(Tensor input_gates, Tensor hidden_gates, Tensor hx, Tensor? "
       "input_bias=None, Tensor? hidden_bias=None) -> (Tensor, Tensor)",
       &gru_cell)
      .dtypes({kFloat32})
      .contiguous_only();
  r.op("aten::_thnn_fused_gru_cell_backward(Tensor grad_hy, Tensor workspace, bool has_bias) -> (Tensor, "
       "Tensor, Tensor, Tensor, Tensor)",
       &gru_cell_backward)
      .dtypes({kFloat32})
      .contiguous_only();
}

}  // namespace cann_like
