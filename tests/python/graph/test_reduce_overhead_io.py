"""mode="reduce-overhead" and graphed_callable make a replayed call look like
a normal one (Note [Graphed callables], npubridge/_graphs.py): input
mutations reach the caller's tensors, outputs keep their aliasing,
parameters are used in place (not copied per call), a host fallback runs the
normal program with the reason reported, and a new batch size under
automatic dynamic shapes captures again. Results are compared with eager npu
(bit-equal: the replay runs the same plugin kernels on the same values)."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import npubridge
from npubridge import _graphs


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield


def _calls(c, make_args, n=3):
    return [c(*make_args(i)) for i in range(n)]


def test_input_mutations_reach_the_callers_tensors():
    def f(x, y):
        x.add_(y)
        y.mul_(2).sub_(1)
        return x * 2

    c = torch.compile(f, backend="npu", mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        for i in range(4):  # call 0 runs the program, 1 captures, 2.. replay
            x, y = torch.randn(4).npu(), torch.randn(4).npu()
            rx, ry = x.clone(), y.clone()
            out = c(x, y)
            rout = f(rx, ry)
            assert torch.equal(out.cpu(), rout.cpu()), i
            assert torch.equal(x.cpu(), rx.cpu()), i
            assert torch.equal(y.cpu(), ry.cpu()), i


def test_a_returned_input_is_the_callers_tensor_with_its_new_values():
    def f(x):
        x.add_(1)
        return x, x.t()

    c = torch.compile(f, backend="npu", mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(4, 4).npu()
            ref = x.clone().add_(1)
            o, ot = c(x)
            assert torch.equal(x.cpu(), ref.cpu()), i
            assert torch.equal(o.cpu(), ref.cpu()) and torch.equal(ot.cpu(), ref.t().cpu()), i
            x.mul_(3)  # the outputs alias x, as in eager
            assert torch.equal(ot.cpu(), x.t().cpu()), i


def test_outputs_that_alias_each_other_keep_aliasing():
    def f(x):
        y = x * 2
        return y, y.view(-1), y[1:]

    c = torch.compile(f, backend="npu", mode="reduce-overhead", dynamic=False)
    held = []
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(4, 4).npu()
            a, b, s = c(x)
            assert torch.equal(a.cpu(), (x * 2).cpu()), i
            assert (b.stride(), s.stride(), s.storage_offset()) == ((1,), (4, 1), 4)
            a.add_(10)
            assert torch.equal(b.cpu(), a.reshape(-1).cpu()) and torch.equal(s.cpu(), a[1:].cpu()), i
            held.append((x, a))
    for x, a in held:  # each call's outputs are its own (later replays do not overwrite them)
        assert torch.equal(a.cpu(), (x * 2 + 10).cpu())


def test_graphed_callable_uses_in_place_inputs_without_copies_and_recaptures_on_a_new_address():
    torch.manual_seed(0)
    w = torch.randn(8, 8).npu()

    def f(x, w):
        return (x @ w).relu()

    x0 = torch.randn(4, 8).npu()
    g = _graphs.graphed_callable(f, [x0, w], in_place=[1])
    assert g.static_inputs[1] is w
    w.mul_(0.5)  # an optimizer step in place: the replay reads it
    x = torch.randn(4, 8).npu()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        out = g(x, w)
    assert torch.equal(out.cpu(), f(x, w).cpu())
    assert sum(e.name == "aten::copy_" for e in p.events()) == 1  # x only, not w
    w2 = torch.randn(8, 8).npu()  # another address: captured again, with a copy
    assert torch.equal(g(x, w2).cpu(), f(x, w2).cpu())
    assert torch.equal(g(x, w).cpu(), f(x, w).cpu())


def test_reduce_overhead_does_not_copy_the_parameters_per_call():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).npu()
    c = torch.compile(m, backend="npu", mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        c(torch.randn(4, 64).npu())
        c(torch.randn(4, 64).npu())
        x = torch.randn(4, 64).npu()
        with profile(activities=[ProfilerActivity.CPU]) as p:
            out = c(x)
        assert torch.equal(out.cpu(), m(x).cpu())
        assert sum(e.name == "aten::copy_" for e in p.events()) <= 1  # the activation, not 4 parameters
        m[0].weight.mul_(2)  # in place: seen by the replay
        assert torch.equal(c(x).cpu(), m(x).cpu())
    report = npubridge.compile_report(c)
    assert "replayed" in str(report)


def test_a_graph_with_a_host_fallback_runs_the_normal_program_and_reports_why():
    class F(torch.nn.Module):  # a module: compile_report takes the compiled model
        def forward(self, x):
            return torch.special.i1e(x * 2) + 1

    f = F()
    c = torch.compile(f, backend="npu", mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(8).npu()
            assert torch.equal(c(x).cpu(), f(x).cpu())  # the same fallback and kernels as eager
    text = str(npubridge.compile_report(c))
    assert "not used: the capture failed" in text and "special_i1e" in text, text


def test_a_new_batch_size_under_automatic_dynamic_shapes_captures_again():
    torch.manual_seed(0)
    m = torch.nn.Linear(16, 8).npu()
    c = torch.compile(m, backend="npu", mode="reduce-overhead")
    with torch.no_grad():
        for bs in (4, 6, 5, 6, 5, 7):
            x = torch.randn(bs, 16).npu()
            assert torch.equal(c(x).cpu(), m(x).cpu()), bs


def test_a_buffer_updated_in_place_matches_eager_after_replays():
    # A step counter / cache in a buffer: captured in place (stable address), written by the replay.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(4))
            self.w = torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            self.count.add_(1)
            return x @ self.w * self.count

    torch.manual_seed(0)
    m = M().npu()
    e = M().npu()
    e.load_state_dict(m.state_dict())
    c = torch.compile(m, backend="npu", mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(2, 4).npu()
            assert torch.equal(c(x).cpu(), e(x).cpu()), i
            assert torch.equal(m.count.cpu(), e.count.cpu()), i
    assert "replayed" in str(npubridge.compile_report(c))
