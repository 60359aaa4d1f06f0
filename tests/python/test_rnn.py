"""LSTM and GRU on npu against the CPU. ATen runs an accelerator tensor's
RNN step through the fused cells _thnn_fused_lstm_cell/_thnn_fused_gru_cell
(and their backwards), which the CPU lacks: cann_like serves them in float32
(half types converted), and any other call runs on the CPU composed of ATen's
ops (Note [Ops the CPU lacks]). Judged by npubridge's error model against
float64 (conftest.assert_matches)."""
import pytest
import torch

import npubridge
from conftest import assert_matches

CELLS = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}
FUSED = {"lstm": ("aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl"),
         "gru": ("aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward")}


def make(kind, bias, batch_first, device, dtype):
    torch.manual_seed(0)
    return CELLS[kind](5, 6, num_layers=2, bias=bias, batch_first=batch_first,
                       bidirectional=True).to(device=device, dtype=dtype)


def forward_and_grads(kind, bias, batch_first, x, *params):
    """Outputs, final states and the gradients of the input and of every
    parameter, flattened into one tensor, on the inputs' device and dtype."""
    m = make(kind, bias, batch_first, x.device, x.dtype)
    with torch.no_grad():
        for p, v in zip(m.parameters(), params):
            p.copy_(v)
    x = x.detach().requires_grad_()
    out, state = m(x)
    states = state if isinstance(state, tuple) else (state,)
    # A weighted sum, so that every output element has its own gradient.
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).reshape(out.shape)
    loss = (out * w).sum() + sum((s * s).sum() for s in states)
    grads = torch.autograd.grad(loss, [x, *m.parameters()])
    return torch.cat([t.reshape(-1) for t in (out, *states, *grads)])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_forward_and_backward_run_on_the_plugin_and_match_the_cpu(kind, bias, batch_first):
    x = torch.randn(3, 4, 5)
    params = [p.detach().clone() for p in make(kind, bias, batch_first, "cpu", torch.float32).parameters()]
    npubridge.reset_stats()
    got = forward_and_grads(kind, bias, batch_first, x.npu(), *[p.npu() for p in params])
    assert_matches(got, lambda *t: forward_and_grads(kind, bias, batch_first, *t), x, *params)
    stats = npubridge.stats()
    for op in FUSED[kind]:
        assert stats[op]["native"].get("cann_like", 0) > 0, (op, stats.get(op))
        assert stats[op]["fallbacks"] == 0, (op, stats[op])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_float64_falls_back_to_the_cpu_with_the_same_values(kind):
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    params = [p.detach().clone() for p in make(kind, True, False, "cpu", torch.float64).parameters()]
    npubridge.reset_stats()
    got = forward_and_grads(kind, True, False, x.npu(), *[p.npu() for p in params])
    want = forward_and_grads(kind, True, False, x, *params)
    # The fallback runs ATen's own float64 CPU ops on the same inputs, in
    # the order ATen's CPU cell computes them.
    torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-12)
    stats = npubridge.stats()
    for op in FUSED[kind]:
        assert stats[op]["fallbacks"] > 0, (op, stats.get(op))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bfloat16_runs_converted_to_float32(kind):
    x = torch.randn(2, 3, 5).bfloat16()
    m = make(kind, True, False, "cpu", torch.bfloat16)
    params = [p.detach().clone() for p in m.parameters()]

    def forward(x, *params):
        m = make(kind, True, False, x.device, x.dtype)
        with torch.no_grad():
            for p, v in zip(m.parameters(), params):
                p.copy_(v)
            return m(x)[0]

    assert_matches(forward(x.npu(), *[p.npu() for p in params]), forward, x, *params)


def test_the_plugin_and_the_fallback_agree_on_the_workspace():
    """A forward on one side and its backward on the other (Note [The fused
    RNN cells' workspace]): cann_like serves float32, the CPU fallback
    float64. The fallback's forward and backward are checked against
    autograd through the cell's formula in float64; cann_like's float32
    workspace fed to the fallback's backward gives cann_like's own backward
    (up to the float32 rounding of the workspace: a few units of 2**-24 on
    values of order 1)."""
    torch.manual_seed(1)
    n, h = 3, 4
    ig, hg, cx = torch.randn(n, 4 * h).double(), torch.randn(n, 4 * h).double(), torch.randn(n, h).double()
    ib, hb = torch.randn(4 * h).double(), torch.randn(4 * h).double()
    ghy, gcy = torch.randn(n, h).double(), torch.randn(n, h).double()
    cell = torch.ops.aten._thnn_fused_lstm_cell
    backward = torch.ops.aten._thnn_fused_lstm_cell_backward_impl

    hy64, cy64, ws64 = cell(*(t.npu() for t in (ig, hg, cx, ib, hb)))
    grad64 = backward(ghy.npu(), gcy.npu(), cx.npu(), cy64, ws64, True)
    leaves = [t.clone().requires_grad_() for t in (ig, hg, cx)]
    i, f, g, o = (leaves[0] + leaves[1] + ib + hb).chunk(4, 1)
    c_next = f.sigmoid() * leaves[2] + i.sigmoid() * g.tanh()
    h_next = o.sigmoid() * c_next.tanh()
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hy64.cpu(), h_next.detach(), **exact)
    torch.testing.assert_close(cy64.cpu(), c_next.detach(), **exact)
    d_gates, _, d_cx = torch.autograd.grad([h_next, c_next], leaves, [ghy, gcy])
    torch.testing.assert_close(grad64[0].cpu(), d_gates, **exact)
    torch.testing.assert_close(grad64[1].cpu(), d_cx, **exact)
    torch.testing.assert_close(grad64[2].cpu(), d_gates.sum(0), **exact)

    hy32, cy32, ws32 = cell(*(t.float().npu() for t in (ig, hg, cx, ib, hb)))
    native = backward(ghy.float().npu(), gcy.float().npu(), cx.float().npu(), cy32, ws32, True)
    crossed = backward(ghy.npu(), gcy.npu(), cx.npu(), cy32.double(), ws32.double(), True)
    f32 = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hy32.cpu().double(), h_next.detach(), **f32)
    for a, b in zip(native, crossed):
        torch.testing.assert_close(a.cpu().double(), b.cpu(), **f32)


def test_the_plugin_and_the_fallback_agree_on_the_gru_workspace():
    """GRU's [r, z, n, hx, hidden n-gate] workspace from cann_like's float32
    forward, fed to the CPU fallback's float64 backward, gives cann_like's
    own backward (up to the float32 rounding of the workspace); the
    fallback's float64 forward and backward match autograd through the
    cell's formula."""
    torch.manual_seed(3)
    n, h = 3, 4
    ig, hg, hx = torch.randn(n, 3 * h).double(), torch.randn(n, 3 * h).double(), torch.randn(n, h).double()
    ib, hb = torch.randn(3 * h).double(), torch.randn(3 * h).double()
    ghy = torch.randn(n, h).double()
    cell = torch.ops.aten._thnn_fused_gru_cell
    backward = torch.ops.aten._thnn_fused_gru_cell_backward

    hy64, ws64 = cell(*(t.npu() for t in (ig, hg, hx, ib, hb)))
    grad64 = backward(ghy.npu(), ws64, True)
    leaves = [t.clone().requires_grad_() for t in (ig, hg, hx)]
    ir, iz, i_n = (leaves[0] + ib).chunk(3, 1)
    hr, hz, h_n = (leaves[1] + hb).chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    cand = (i_n + r * h_n).tanh()
    h_next = (leaves[2] - cand) * z + cand
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hy64.cpu(), h_next.detach(), **exact)
    d_ig, d_hg, d_hx = torch.autograd.grad(h_next, leaves, ghy)
    for got, want in zip(grad64, (d_ig, d_hg, d_hx, d_ig.sum(0), d_hg.sum(0))):
        torch.testing.assert_close(got.cpu(), want, **exact)

    hy32, ws32 = cell(*(t.float().npu() for t in (ig, hg, hx, ib, hb)))
    native = backward(ghy.float().npu(), ws32, True)
    crossed = backward(ghy.npu(), ws32.double(), True)
    f32 = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hy32.cpu().double(), h_next.detach(), **f32)
    for a, b in zip(native, crossed):
        torch.testing.assert_close(a.cpu().double(), b.cpu(), **f32)


@pytest.mark.parametrize("cell", [torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell])
def test_the_cell_modules_match_the_cpu(cell):
    torch.manual_seed(2)
    m = cell(5, 6)
    x, h = torch.randn(4, 5), torch.randn(4, 6)
    state = (h, torch.randn(4, 6)) if cell is torch.nn.LSTMCell else h

    def run(x, state, *params):
        mm = cell(5, 6).to(x.device, x.dtype)
        with torch.no_grad():
            for p, v in zip(mm.parameters(), params):
                p.copy_(v)
        out = mm(x, state)
        return torch.cat([t.reshape(-1) for t in (out if isinstance(out, tuple) else (out,))])

    params = [p.detach() for p in m.parameters()]
    npu_state = tuple(s.npu() for s in state) if isinstance(state, tuple) else state.npu()
    got = run(x.npu(), npu_state, *[p.npu() for p in params])
    host = run(x, state, *params)
    wide_state = tuple(s.double() for s in state) if isinstance(state, tuple) else state.double()
    wide = run(x.double(), wide_state, *[p.double() for p in params])
    msg = npubridge._C.judge(got.cpu(), host, wide)
    assert not msg, msg


def test_bad_gate_shapes_name_the_op_and_the_argument():
    with pytest.raises(RuntimeError, match=r"_thnn_fused_lstm_cell: hidden_gates: expected shape \[2, 12\]"):
        torch.ops.aten._thnn_fused_lstm_cell(torch.randn(2, 12).npu(), torch.randn(2, 8).npu(),
                                             torch.randn(2, 3).npu())
    with pytest.raises(RuntimeError, match=r"_thnn_fused_gru_cell: hx: expected a 2-d"):
        torch.ops.aten._thnn_fused_gru_cell(torch.randn(2, 9).npu(), torch.randn(2, 9).npu(),
                                            torch.randn(3).npu())
