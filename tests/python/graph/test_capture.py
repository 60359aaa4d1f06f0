"""torch.npu.NPUGraph, torch.npu.graph and torch.accelerator.Graph: capture
and replay of small op sequences against eager npu (bit-equal: the replay runs
the same plugin kernels on the same values), static inputs updated in place,
the private pool and its sharing, and the operations a capture forbids, each
raising an error naming it, with the device working afterwards."""
import pytest
import torch

import npubridge
from npubridge import _graphs

FORBIDDEN_TAIL = "the capture was ended and the graph is invalid"


def mlp(x, w1, w2):
    return torch.relu(x @ w1 + 0.5) @ w2 * 2.0


@pytest.fixture
def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 16).npu(), torch.randn(16, 32).npu(), torch.randn(32, 8).npu()


def test_replay_equals_eager_and_follows_inputs_updated_in_place(inputs):
    x, w1, w2 = inputs
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = mlp(x, w1, w2)
    assert torch.npu.is_current_stream_capturing() is False
    assert g.nodes()[0] == "kernel cann_like: aten::mm.out"
    for step in range(3):
        x.copy_(torch.randn(4, 16).npu())
        g.replay()
        # Same kernels, same order, same values: bit-equal.
        assert torch.equal(y.cpu(), mlp(x, w1, w2).cpu()), step


def test_nothing_runs_at_capture(inputs):
    x, w1, _ = inputs
    out = torch.zeros(4, 32).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        torch.mm(x, w1, out=out)
    assert torch.count_nonzero(out.cpu()) == 0  # recorded, not run
    g.replay()
    assert torch.equal(out.cpu(), (x @ w1).cpu())


def test_capture_records_device_copies_and_fills():
    src = torch.arange(6.0).npu().view(2, 3)
    dst = torch.empty(3, 2).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        dst.copy_(src.t())
        z = torch.zeros(5, device="npu")  # pool memory, filled at replay
        z.fill_(7.0)
    src.add_(1.0)
    g.replay()
    assert torch.equal(dst.cpu(), (torch.arange(6.0).view(2, 3) + 1).t())
    assert torch.equal(z.cpu(), torch.full((5,), 7.0))


def test_accelerator_graph_drives_the_same_capture(inputs):
    x, w1, w2 = inputs
    g = torch.accelerator.Graph()
    with g:
        y = mlp(x, w1, w2)
    x.mul_(3.0)
    g.replay()
    assert torch.equal(y.cpu(), mlp(x, w1, w2).cpu())
    assert g.pool()[0] != 0
    g.reset()


def test_pool_is_held_until_reset_and_shared_through_a_handle(inputs):
    x, w1, _ = inputs
    handle = torch.npu.graph_pool_handle()
    g1, g2 = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with torch.npu.graph(g1, pool=handle):
        a = x @ w1
    with torch.npu.graph(g2, pool=g1.pool()):
        b = a + 1.0
    assert g1.pool() == handle and g2.pool() == handle
    g1.replay()
    g2.replay()
    assert torch.equal(b.cpu(), (x @ w1 + 1.0).cpu())
    reserved = torch.npu.memory_reserved()
    del a, b
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() == reserved  # the graphs' records still use the pool
    g1.reset()
    g2.reset()
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() < reserved


def test_graphed_callable_returns_clones_of_the_static_outputs(inputs):
    x, w1, w2 = inputs
    f = _graphs.graphed_callable(mlp, (x, w1, w2))
    x2 = torch.randn(4, 16).npu()
    r1 = f(x2, w1, w2)
    r2 = f(x, w1, w2)
    assert torch.equal(r1.cpu(), mlp(x2, w1, w2).cpu())  # not overwritten by the second call
    assert torch.equal(r2.cpu(), mlp(x, w1, w2).cpu())
    # Another shape is captured once more (cached), as CUDA graph trees record one graph per shape.
    x3 = torch.randn(2, 16).npu()
    assert torch.equal(f(x3, w1, w2).cpu(), mlp(x3, w1, w2).cpu())
    assert len(f.captures) == 2
    assert torch.equal(f(x2, w1, w2).cpu(), mlp(x2, w1, w2).cpu())
    with pytest.raises(TypeError, match=r"graphed callable: expected 3 inputs but found 2"):
        f(x, w1)


def test_make_graphed_callables(inputs):
    x, w1, w2 = inputs
    lin = torch.nn.Linear(16, 8).npu()
    g = torch.npu.make_graphed_callables(lin, (x,))
    assert torch.equal(g(x).cpu(), lin(x).detach().cpu())


CASES = [
    ("aten::_local_scalar_dense (.item())", lambda x: x.sum().item()),
    ("a copy from npu to cpu", lambda x: x.cpu()),
    ("a copy from cpu to npu", lambda x: torch.ones(3).to("npu")),
    ("synchronize of npu:0", lambda x: torch.npu.synchronize()),
    ("synchronize of npu:0 stream", lambda x: torch.npu.current_stream().synchronize()),
    ("event synchronize", lambda x: torch.npu.current_stream().record_event().synchronize()),
    ("op 'aten::nonzero'", lambda x: torch.nonzero(x)),
    # an op no plugin serves runs on PyTorch's CPU fallback
    ("op 'aten::erfinv.out'", lambda x: torch.special.erfinv(x * 0.1)),
    ("op 'aten::normal_'", lambda x: x.normal_(generator=torch.Generator(device="npu").manual_seed(1))),
]


@pytest.mark.parametrize("what,fn", CASES, ids=[c[0] for c in CASES])
def test_forbidden_operations_raise_naming_the_op_and_the_device_keeps_working(inputs, what, fn):
    x, w1, _ = inputs
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError) as err:
        with torch.npu.graph(g):
            y = x @ w1
            fn(x)
    msg = str(err.value)
    assert msg.startswith(f"npu:0 graph capture: {what}"), msg
    assert "is not allowed while capturing a graph (" in msg and FORBIDDEN_TAIL in msg, msg
    assert not torch.npu.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="the graph is invalid"):
        g.replay()
    # The device keeps working, and the graph can capture again after reset.
    assert torch.equal((x @ w1).cpu(), x.cpu() @ w1.cpu()) or torch.allclose(
        (x @ w1).cpu(), x.cpu() @ w1.cpu(), atol=1e-5)
    torch.npu.synchronize()
    g.reset()
    with torch.npu.graph(g):
        y = x @ w1
    g.replay()
    assert torch.equal(y.cpu(), (x @ w1).cpu())


def test_random_ops_on_the_default_generator_draw_afresh_each_replay():
    out = torch.empty(64).npu()
    torch.npu.manual_seed(3)
    first = torch.empty(64).npu().uniform_().cpu()
    second = torch.empty(64).npu().uniform_().cpu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out.uniform_()
    torch.npu.manual_seed(3)
    g.replay()
    assert torch.equal(out.cpu(), first)
    g.replay()
    assert torch.equal(out.cpu(), second)


def test_an_exception_in_the_body_ends_the_capture(inputs):
    x, w1, _ = inputs
    g = torch.npu.NPUGraph()
    with pytest.raises(KeyError):
        with torch.npu.graph(g):
            _ = x @ w1
            raise KeyError("user error")
    assert not torch.npu.is_current_stream_capturing()
    assert torch.equal((x + 1).cpu(), x.cpu() + 1)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(TypeError, match="torch.npu.graph: expected an NPUGraph but found int"):
        torch.npu.graph(3)
    with pytest.raises(ValueError, match="capture_error_mode: expected 'default', 'global', 'thread_local' or "
                                         "'relaxed' but found 'nope'"):
        torch.npu.NPUGraph().capture_begin(capture_error_mode="nope")
    with pytest.raises(RuntimeError, match="graph replay: nothing was captured"):
        torch.npu.NPUGraph().replay()
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match="graph capture_end: no capture is open on this graph"):
        g.capture_end()


def test_index_copy_kernel_matches_the_cpu():
    # The StaticCache's update (test_decode_replay) runs on this kernel.
    torch.manual_seed(1)
    base = torch.randn(2, 3, 8, 4)
    src = torch.randn(2, 3, 2, 4)
    idx = torch.tensor([5, 1])
    got = base.npu().index_copy_(2, idx.npu(), src.npu()).cpu()
    assert torch.equal(got, base.clone().index_copy_(2, idx, src))
    stats = npubridge.stats()
    assert stats["aten::index_copy.out"]["fallbacks"] == 0


def test_a_resize_inside_a_capture_records_the_storage_copy():
    x = torch.arange(4.0, device="npu")
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        t = x * 2.0
        t.resize_(1024)  # a new storage: the old bytes move at replay, after `x * 2` wrote them
        head = t[:4] + 0.0
    x.add_(1.0)
    g.replay()
    assert torch.equal(head.cpu(), (torch.arange(4.0) + 1) * 2)
