"""torch.compile(backend="npu") on small models: compiled vs eager npu and
float64 CPU, forward and backward; a recompile on a new shape; a graph
break; conv + bias + relu fused to cann_like::conv2d_bias_relu."""
import copy
import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

import npubridge

_DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "python_ext", "examples", "train_demo.py")
_spec = importlib.util.spec_from_file_location("train_demo", _DEMO)
train_demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_demo)

U32 = 2.0 ** -24  # float32 unit roundoff


def _step(model, x, y):
    """One training step's loss, logits and parameter gradients."""
    model.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    return out.detach(), loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def _compiled_eager_and_float64(model, x, y):
    """One training step of `model` (on npu) compiled, eager, and on a float64
    copy on the CPU, for the fixtures below."""
    compiled = npubridge.compile(model)
    got = _step(compiled, x.npu(), y.npu())
    eager = _step(model, x.npu(), y.npu())
    ref = _step(copy.deepcopy(model).cpu().double(), x.double(), y)
    return {"model": model, "compiled": compiled, "got": got, "eager": eager, "ref": ref}


def _assert_near_f64(got, ref64, eager, what):
    # The compiled graph runs float32 kernels like eager: its error against the
    # float64 result must be of eager's size. 2x eager's error plus a few
    # roundings of the largest value (ops the compiler reorders or fuses)
    # bounds it without hiding a wrong result (a wrong one is off by O(|ref|)).
    err = (got.double().cpu() - ref64).abs().max().item()
    eager_err = (eager.double().cpu() - ref64).abs().max().item()
    bound = 2 * eager_err + 8 * U32 * ref64.abs().max().item()
    assert err <= bound, f"{what}: error {err:.3g} against float64, bound {bound:.3g} (eager's error {eager_err:.3g})"


def _assert_step_near_f64(run):
    """A fixture's compiled step, logits and every gradient, against float64
    (_assert_near_f64)."""
    (out, _, grads), (eout, _, egrads), (rout, _, rgrads) = run["got"], run["eager"], run["ref"]
    _assert_near_f64(out, rout, eout, "logits")
    for (name, _), g, eg, rg in zip(run["model"].named_parameters(), grads, egrads, rgrads):
        _assert_near_f64(g, rg, eg, f"grad {name}")


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = train_demo.make_model().npu()
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    return {**_compiled_eager_and_float64(model, x, y), "x": x, "y": y}


def test_mlp_forward_and_backward_equal_eager_bit_for_bit(mlp):
    # The same plugin kernels in the same order as eager: the same bits.
    (out, loss, grads), (eout, eloss, egrads) = mlp["got"], mlp["eager"]
    assert torch.equal(out.cpu(), eout.cpu())
    assert torch.equal(loss.cpu(), eloss.cpu())
    for (name, _), g, eg in zip(mlp["model"].named_parameters(), grads, egrads):
        assert torch.equal(g.cpu(), eg.cpu()), name


def test_mlp_matches_float64_cpu(mlp):
    _assert_step_near_f64(mlp)


def test_mlp_report_lists_forward_and_backward(mlp):
    report = npubridge.compile_report(mlp["compiled"])
    assert len(report["graphs"]) == 1
    parts = report["graphs"][0]["parts"]
    assert set(parts) == {"forward", "backward"}
    assert all(p["nodes"] > 0 for p in parts.values())
    assert report["patterns_fired"] == {}
    text = str(report)
    assert "forward:" in text and "backward:" in text


def test_mlp_new_batch_size_recompiles_and_stays_right(mlp):
    compiled, model = mlp["compiled"], mlp["model"]
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    before = len(npubridge.compile_report(compiled)["graphs"])
    out, _, grads = _step(compiled, x.npu(), y.npu())
    eout, _, egrads = _step(model, x.npu(), y.npu())
    graphs = npubridge.compile_report(compiled)["graphs"]
    assert len(graphs) == before + 1  # Dynamo's shape guard failed: a second graph
    assert graphs[-1]["input_shapes"][2] == (8, 16) or (8, 16) in graphs[-1]["input_shapes"]
    assert torch.equal(out.cpu(), eout.cpu())
    for g, eg in zip(grads, egrads):
        assert torch.equal(g.cpu(), eg.cpu())
    # The first shape still runs its own graph, without another compile.
    _step(compiled, mlp["x"].npu(), mlp["y"].npu())
    assert len(npubridge.compile_report(compiled)["graphs"]) == before + 1


class _Broken(torch.nn.Module):
    """Two pieces with a graph break between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        return self.b(h) * 2


def test_graph_break_runs_both_pieces_and_is_reported():
    torch.manual_seed(1)
    model = _Broken().npu()
    compiled = npubridge.compile(model)
    x = torch.randn(4, 8).npu()
    got = compiled(x)
    got.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x)
    want.sum().backward()
    assert torch.equal(got.cpu(), want.cpu())
    for g, p in zip(grads, model.parameters()):
        assert torch.equal(g.cpu(), p.grad.cpu())
    report = npubridge.compile_report(compiled)
    assert len(report["graphs"]) == 2
    assert any("graph_break" in why or "graph break" in why.lower() for why in report["graph_breaks"])
    assert "graph breaks" in str(report)


class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):
        h = F.relu(self.c1(x))
        h = torch.relu(self.c2(h))
        return self.fc(h.flatten(1))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(2)
    model = _CNN().npu()
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))
    run = _compiled_eager_and_float64(model, x, y)
    with torch.no_grad():
        inference = npubridge.compile(model)
        inf_out = inference(x.npu())
    return {**run, "inference": inference, "inf_out": inf_out, "x": x}


def test_cnn_training_step_matches_eager_and_float64(cnn):
    _assert_step_near_f64(cnn)


def test_cnn_training_fuses_conv_bias_relu(cnn):
    # The fused op has a derivative (cann_like's conv2d_bias_relu_backward),
    # so the rewrite also fires in a training graph.
    assert "cann_like::conv2d_bias_relu" in {d["op"] for d in npubridge._C.derivatives()}
    report = npubridge.compile_report(cnn["compiled"])
    assert report["graphs"][0]["patterns_fired"] == {"conv2d_bias_relu": 2}


def test_cnn_inference_fuses_conv_bias_relu(cnn):
    report = npubridge.compile_report(cnn["inference"])
    g = report["graphs"][0]
    assert g["patterns_fired"] == {"conv2d_bias_relu": 2}
    assert set(g["parts"]) == {"inference"}
    with torch.no_grad():
        eager = cnn["model"](cnn["x"].npu())
        ref = copy.deepcopy(cnn["model"]).cpu().double()(cnn["x"].double())
    _assert_near_f64(cnn["inf_out"], ref, eager, "fused CNN logits")


def test_reduce_overhead_mode_is_reported_and_right(mlp):
    # torch.compile's own spelling reaches the backend with mode=.
    compiled = torch.compile(mlp["model"], backend="npu", mode="reduce-overhead")
    x = mlp["x"][:4].npu()
    with torch.no_grad():
        got = compiled(x)
        got2 = compiled(x)  # a replayed graph returns fresh outputs each call
        want = mlp["model"](x)
    assert torch.equal(got.cpu(), want.cpu()) and torch.equal(got2.cpu(), want.cpu())
    (graph,) = npubridge.compile_report(compiled)["graphs"]
    assert graph["reduce_overhead"] == "replayed (npubridge._graphs.graphed_callable)"
    assert got.data_ptr() != got2.data_ptr()  # clones of the static outputs


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "fast"}, "expected mode to be one of ['default', 'max-autotune', 'max-autotune-no-cudagraphs', "
                       "'reduce-overhead'] or None but found 'fast'"),
    ({"options": {"bogus": 1}}, "unknown option(s) ['bogus']; expected ['partition', 'patterns']"),
    ({"options": {"partition": "x"}}, "expected options['partition'] to be 'min_cut' or 'default' but found 'x'"),
    ({"options": {"patterns": ["rms_nrom"]}}, "unknown pattern(s) ['rms_nrom'] in options['patterns']"),
    ({"options": {"patterns": "rms_norm"}}, "expected options['patterns'] to be True, False or a list of pattern "
                                            "names but found 'rms_norm'"),
])
def test_bad_compile_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError) as err:
        npubridge.compile(torch.nn.Linear(2, 2), **kwargs)
    assert message in str(err.value)


class _MaskedLinear(torch.nn.Module):
    """A mask built with an op no plugin serves (logical_xor: the CPU fallback)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        keep = torch.logical_xor(x > -1, x > 1)  # -1 < x <= 1
        return self.fc(x) * keep


def test_reduce_overhead_runs_the_program_when_the_capture_fails():
    torch.manual_seed(4)
    model = _MaskedLinear().npu()
    x = torch.randn(4, 8).npu()
    compiled = npubridge.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        got, again, want = compiled(x), compiled(x), model(x)
    assert torch.equal(got.cpu(), want.cpu()) and torch.equal(again.cpu(), want.cpu())
    (graph,) = npubridge.compile_report(compiled)["graphs"]
    assert graph["reduce_overhead"].startswith("not used: the capture failed: npu:0 graph capture: op "
                                               "'aten::logical_xor.out' is not allowed while capturing")
