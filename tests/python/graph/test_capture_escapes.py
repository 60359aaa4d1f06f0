"""Work a capture cannot see (Note [Work a capture cannot see],
device_sim/graph_capture.h) raises instead of running once at capture and
never at replay, and a replay shows in the profiler trace."""
import copy
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import npubridge  # noqa: F401


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).npu()


def test_whole_step_capture_with_backward_is_an_error_not_zero_grads():
    # torch.cuda's whole-network recipe: warm up on a side stream, zero_grad(set_to_none=True), capture
    # forward + backward. Autograd runs the npu backward on its device thread (on the forward's stream),
    # which this per-thread capture does not record: refused, never silently gradient-free.
    m = _mlp()
    ref = copy.deepcopy(m)
    sx = torch.randn(4, 16).npu()
    s = torch.npu.Stream()
    s.wait_stream(torch.npu.current_stream())
    with torch.npu.stream(s):
        for _ in range(2):
            m.zero_grad(set_to_none=True)
            m(sx).sum().backward()
    torch.npu.current_stream().wait_stream(s)
    m.zero_grad(set_to_none=True)
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"npu:0 graph capture: op 'aten::[^']+'.* was issued to the capturing "
                                           r"stream from a thread that is not capturing .*backward"):
        with torch.npu.graph(g):
            m(sx).sum().backward()
    assert not g.capturing()
    # The device keeps working and eager training steps stay right afterwards.
    m.zero_grad(set_to_none=True)
    m(sx).sum().backward()
    ref(sx).sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad.cpu(), q.grad.cpu())  # same kernels in the same order: bit-equal


def test_a_backward_of_a_forward_made_before_the_capture_is_refused_not_zero_grads():
    # The forward ran before the capture, on the default stream: the engine makes the gradient seed
    # (ones_like) in the capture, where it is recorded and not run, makes the forward's stream wait for it,
    # and runs the backward there on its device thread. That backward ran at capture on a seed never
    # written (w.grad [0, 0, 0], no error) and never at replay. The waiting stream joins the capture
    # (Note [A stream that waits on a capture joins it]), so the backward is refused as a larger one is.
    w = torch.ones(3, device="npu", requires_grad=True)
    loss = (w * 2).sum()
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"npu:0 graph capture: op 'aten::[^']+'.* was issued, from a thread "
                                           r"that is not capturing, to npu:0 stream 0, which joined the "
                                           r"capture .*backward"):
        with torch.npu.graph(g):
            loss.backward()
    assert not g.capturing()
    with pytest.raises(RuntimeError, match="invalid|nothing was captured"):
        g.replay()
    # Outside a capture the same backward gives the CPU's gradient, and the default stream is its own again.
    w.grad = None
    (w * 2).sum().backward()
    assert w.grad.cpu().tolist() == [2.0, 2.0, 2.0]
    g.reset()
    with torch.no_grad(), torch.npu.graph(g):
        y = w * 3
    g.replay()
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]
    z = torch.ones(2, device="npu") * 5  # the default stream runs eagerly again
    assert z.cpu().tolist() == [5.0, 5.0]


def test_captures_cannot_nest_and_the_message_says_so():
    x = torch.ones(3, device="npu")
    outer, inner = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"torch.npu.graph: captures cannot nest: this thread is already "
                                           r"capturing a graph on npu:0") as e:
        with torch.npu.graph(outer):
            x * 2
            with torch.npu.graph(inner):
                x * 3
    assert "synchronize" not in str(e.value)
    assert not outer.capturing() and not inner.capturing()
    # capture_begin itself says the same.
    g1, g2 = torch.npu.NPUGraph(), torch.npu.NPUGraph()
    g1.capture_begin()
    try:
        with pytest.raises(RuntimeError, match="captures cannot nest"):
            g2.capture_begin()
    finally:
        g1.capture_end()
    assert torch.equal((x * 2).cpu(), torch.full((3,), 2.0))


def test_forward_only_capture_under_grad_still_replays():
    # Capturing a forward with autograd on (no backward inside) is not affected.
    m = _mlp()
    sx = torch.randn(4, 16).npu()
    m(sx)
    g = torch.npu.NPUGraph()
    with torch.no_grad(), torch.npu.graph(g):
        y = m(sx)
    x = torch.randn(4, 16).npu()
    sx.copy_(x)
    g.replay()
    with torch.no_grad():
        assert torch.equal(y.cpu(), m(x).cpu())


@pytest.mark.skipif(torch.npu.device_count() < 2, reason="needs two npu devices")
@pytest.mark.parametrize("op", ["add", "mul_scalar"])
def test_work_on_another_device_inside_a_capture_names_the_op_and_both_devices(op):
    x = torch.full((4,), 2.0, device="npu:1")
    g = torch.npu.NPUGraph()
    with pytest.raises(RuntimeError, match=r"on npu:1 is not allowed while capturing.*this thread captures on "
                                           r"npu:0"):
        with torch.npu.graph(g):
            if op == "add":
                x + x
            else:
                x * 2
    assert not g.capturing()
    assert torch.equal((x + x).cpu(), torch.full((4,), 4.0))  # both devices keep working
    assert torch.equal((torch.ones(2, device="npu:0") * 3).cpu(), torch.full((2,), 3.0))


def test_replay_is_a_profiler_slice_with_the_replayed_kernels_under_it(tmp_path):
    x, w = torch.randn(8, 8).npu(), torch.randn(8, 8).npu()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = (x @ w).relu()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.NPU]) as p:
        g.replay()
        torch.npu.synchronize()
    path = tmp_path / "trace.json"
    p.export_chrome_trace(str(path))
    # The host track (cat user_annotation; the kineto device track repeats them).
    slices = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"
              and e.get("cat") == "user_annotation"]
    replay = [e for e in slices if e["name"].startswith("NPUGraph.replay")]
    assert len(replay) == 1, [e["name"] for e in slices]
    r = replay[0]
    kernels = [e for e in slices if e["name"].startswith("cann_like: ")]
    assert sorted(e["name"] for e in kernels) == ["cann_like: aten::mm.out", "cann_like: aten::relu"]
    for k in kernels:  # nested in time under the replay
        assert r["ts"] <= k["ts"] and k["ts"] + k["dur"] <= r["ts"] + r["dur"], (k, r)
    assert torch.equal(y.cpu(), (x @ w).relu().cpu())
