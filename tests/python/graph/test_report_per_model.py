"""compile_report's graph breaks are the compiled model's own (Note [Graph
breaks per compiled model], report.py), an unlowered graph's nodes are not
fallbacks, and a compiled plain function has a report."""
import pytest
import torch

import npubridge


class _Breaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        print("sum", y.sum().item())  # two breaks: .item(), then print
        return y.relu()


class _NoBreak(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).relu()


def test_graph_breaks_are_per_model(capsys):
    torch.manual_seed(0)
    a, b = _Breaks().npu(), _NoBreak().npu()
    ca = torch.compile(a, backend="npu")
    cb = torch.compile(b, backend="npu")
    x = torch.randn(2, 8).npu()
    with torch.no_grad():
        got_a, got_b = ca(x), cb(x)
        assert torch.equal(got_a.cpu(), a(x).cpu()) and torch.equal(got_b.cpu(), b(x).cpu())
    ra, rb = npubridge.compile_report(ca), npubridge.compile_report(cb)
    assert rb["graph_breaks"] == {}, rb["graph_breaks"]
    assert "graph breaks" not in str(rb)
    assert sum(ra["graph_breaks"].values()) == 2, ra["graph_breaks"]
    assert any("item" in why for why in ra["graph_breaks"])


def test_report_of_a_compiled_function():
    def fn(x, y):
        return torch.tanh(x) * y + 1

    c = torch.compile(fn, backend="npu")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    got = c(x.npu(), y.npu())
    want = fn(x.npu(), y.npu())
    assert torch.equal(got.cpu(), want.cpu())
    r = npubridge.compile_report(c)
    assert len(r["graphs"]) == 1 and r["graphs"][0]["parts"]["inference"]["lowered"]
    assert r["fallbacks"] == 0 and r["graph_breaks"] == {}


def test_report_names_what_it_accepts():
    with pytest.raises(TypeError, match=r"torch.compile\(\.\.\., backend='npu'\).*found function"):
        npubridge.compile_report(lambda x: x)
    other = torch.compile(lambda x: x + 1, backend="eager")
    with pytest.raises(TypeError, match="backend 'eager'"):
        npubridge.compile_report(other)


def test_unlowered_graph_is_not_counted_as_fallbacks():
    # A CPU tensor input (a 0-d scale beside an npu tensor, which ATen
    # allows) is not lowered: the loop holds npu tensors only, so the graph
    # runs as the FX graph, each node an eager npu op.
    def fn(x, s):
        return (x * s).relu().sum(0)

    c = torch.compile(fn, backend="npu", dynamic=False)
    x, s = torch.randn(5, 3), torch.tensor(1.5)
    got = c(x.npu(), s)
    assert torch.equal(got.cpu(), fn(x.npu(), s).cpu())
    r = npubridge.compile_report(c)
    parts = [p for g in r["graphs"] for p in g["parts"].values()]
    assert parts and all(p["lowered"] is False for p in parts)
    assert r["fallbacks"] == 0 and r["unlowered_nodes"] == sum(p["nodes"] for p in parts) > 0
    text = str(r)
    assert "0 fallback node(s)" in text and "unlowered: " in text
