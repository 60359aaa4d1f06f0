"""Fusion patterns as data (docs/graph-mode.md, "Fusion patterns").

The table and its parsed form (npubridge._C._fusion_patterns): the in-tree
plugins' patterns, a third-party plugin's pattern contributed through the C
ABI (tests/plugins/fusion_plugin.cpp, ABI 1.5), host registration from
Python and its errors. A plugin loads only at start-up (NPUB_PLUGIN_PATH)
and a registered pattern stays for the process, so those checks run in one
child process of their own; the parse errors change nothing and run here."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import npubridge  # noqa: F401
from npubridge import _C

# CMake passes the path (tests/CMakeLists.txt, NPUB_PY_ENV); run by hand
# from a build tree, the plugin sits beside the staged package.
_BUILD = pathlib.Path(npubridge.__file__).resolve().parents[2]
FUSION_PLUGIN = os.environ.get("NPUB_TEST_FUSION_PLUGIN",
                               str(_BUILD / "tests" / "plugins_fusion" / "libnpub_test_fusion.so"))


def _by_name():
    return {p["name"]: p for p in _C._fusion_patterns()}


def test_in_tree_plugins_list_the_standard_patterns():
    ps = _by_name()
    expected = {"conv2d_bias_relu": "cann_like", "conv2d_bias_relu_inplace": "cann_like",
                "rms_norm": "mindspeed_like", "rms_norm_cast": "mindspeed_like",
                "add_rms_norm": "mindspeed_like", "add_rms_norm_cast": "mindspeed_like",
                "swiglu": "mindspeed_like", "sdpa": "mindspeed_like", "sdpa_causal": "mindspeed_like"}
    assert {n: ps[n]["plugin"] for n in expected if n in ps} == expected
    # The cast variants are tried before the plain ones, add_rms_norm after rms_norm.
    assert ps["rms_norm_cast"]["priority"] > ps["rms_norm"]["priority"] > ps["add_rms_norm_cast"]["priority"] \
        > ps["add_rms_norm"]["priority"]


def test_the_parsed_form_of_rms_norm():
    p = _by_name()["rms_norm"]
    assert [(n["out"], n["op"]) for n in p["nodes"]] == [
        ("sq", "aten::pow.Tensor_Scalar"), ("var", "aten::mean.dim"), ("ve", "aten::add.Tensor"),
        ("r", "aten::rsqrt"), ("n", "aten::mul.Tensor"), ("y", "aten::mul.Tensor")]
    assert p["nodes"][0]["args"] == [{"kind": "value", "name": "x"}, {"kind": "const", "value": 2}]
    assert p["nodes"][1]["args"][1:] == [{"kind": "const", "value": [-1]}, {"kind": "const", "value": True}]
    assert p["nodes"][2]["args"][1] == {"kind": "capture", "name": "eps"}
    assert all(n["ret"] == 0 for n in p["nodes"])
    assert p["replacement"] == {"kind": "call", "op": "mindspeed_like::npu_rms_norm", "ret": 0,
                                "args": [{"kind": "value", "name": "x"}, {"kind": "value", "name": "gamma"},
                                         {"kind": "capture", "name": "eps"}]}
    assert p["extra_outputs"] == []
    assert p["text"].startswith("pattern rms_norm priority 20\n") and p["text"].endswith("end\n")


def test_multi_output_nested_call_and_size_arguments():
    ps = _by_name()
    add = ps["add_rms_norm"]
    assert add["nodes"][1]["op"] == "mindspeed_like::npu_rms_norm" and add["nodes"][1]["ret"] == 0
    assert add["replacement"]["op"] == "mindspeed_like::npu_add_rms_norm"
    assert add["extra_outputs"] == [{"name": "s", "ret": 2}]
    cat = ps["swiglu"]["replacement"]["args"][0]
    assert cat == {"kind": "call", "op": "aten::cat", "ret": 0,
                   "args": [{"kind": "list", "items": [{"kind": "value", "name": "a"},
                                                       {"kind": "value", "name": "b"}]},
                            {"kind": "const", "value": -1}]}
    sdpa = ps["sdpa_causal"]
    assert sdpa["nodes"][0]["args"][3:] == [{"kind": "const", "value": None}, {"kind": "const", "value": 0.0},
                                            {"kind": "const", "value": True}, {"kind": "capture", "name": "scale"}]
    fa = sdpa["replacement"]["args"]
    assert fa[3] == {"kind": "size", "name": "q", "dim": 1}
    assert fa[4] == {"kind": "const", "value": "BNSD"}
    assert fa[-1] == {"kind": "const", "value": 2}  # sparse_mode 2: causal


@pytest.mark.parametrize("text,message", [
    ("pattern p\n  %a = aten::relu(%x\n  => cann_like::conv2d_bias_relu(%a, %a, %a)\nend\n",
     "fusion pattern text, line 2, pattern 'p': expected ',' or ')' in the argument list at the end of the line"),
    ("pattern p\n  %a = aten::relu(%x)\n  => nowhere::fused(%a)\nend\n",
     "fusion pattern text, line 3, pattern 'p': the replacement op 'nowhere::fused' is not defined (define it "
     "before its pattern)"),
    ("pattern p\n  %a = aten::relu(%x)\n  => mindspeed_like::npu_swiglu(%a, -1, 3)\nend\n",
     "fusion pattern text, line 3, pattern 'p': the replacement op 'mindspeed_like::npu_swiglu' takes 1 to 2 "
     "arguments but the pattern passes 3"),
    ("pattern p\n  %a = aten::relu(%x)\n  => mindspeed_like::npu_swiglu(%b)\nend\n",
     "fusion pattern text, line 3, pattern 'p': the replacement uses '%b', which the subgraph does not bind"),
    ("pattern p\n  %a = aten::relu(%x)\n  => mindspeed_like::npu_swiglu(%a)\n",
     "fusion pattern text, line 3, pattern 'p': missing 'end' of the pattern that starts at line 1"),
    ("pattern swiglu\n  %a = aten::relu(%x)\n  => mindspeed_like::npu_swiglu(%a)\nend\n",
     "fusion pattern 'swiglu' is already registered (by plugin 'mindspeed_like')"),
])
def test_bad_host_patterns_raise_value_errors_naming_the_line_and_pattern(text, message):
    before = _C._fusion_patterns()
    with pytest.raises(ValueError) as e:
        _C._register_fusion_pattern(text)
    assert str(e.value) == message
    assert _C._fusion_patterns() == before  # nothing added


# --- in a child process: the third-party plugin and host registration ---

_CHILD = """
import json, torch, npubridge
from npubridge import _C
out = {}
out["testfuse"] = [p for p in _C._fusion_patterns() if p["plugin"] == "testfuse"]
out["registered"] = _C._register_fusion_pattern('''
# a host pattern: two in one text
pattern host_relu_swiglu priority 3
  %r = aten::relu(%a)
  %y = aten::mul.Tensor(%r, %b)
  => mindspeed_like::npu_swiglu(aten::cat([%a, %b], -1), -1)
end
pattern host_gelu_mul_tanh
  %g = aten::gelu(%a, "tanh")
  %y = aten::mul.Tensor(%b, %g)
  => testfuse::gelu_mul(%a, %b)
end
''')
out["after"] = [(p["name"], p["plugin"]) for p in _C._fusion_patterns()]
try:
    _C._register_fusion_pattern("pattern host_relu_swiglu\\n %a = aten::relu(%x)\\n => testfuse::gelu_mul(%a, %a)\\nend")
except ValueError as e:
    out["again"] = str(e)
a = torch.randn(4, 6, dtype=torch.float64)
b = torch.randn(4, 6, dtype=torch.float64)
y = torch.ops.testfuse.gelu_mul(a.to("npu"), b.to("npu")).cpu()
out["max_err"] = (y - torch.nn.functional.gelu(a) * b).abs().max().item()
out["meta"] = list(torch.ops.testfuse.gelu_mul(a.to("meta"), b.to("meta")).shape)
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def child():
    assert os.path.isfile(FUSION_PLUGIN), f"NPUB_TEST_FUSION_PLUGIN={FUSION_PLUGIN}: no such file"
    env = dict(os.environ, NPUB_PLUGIN_PATH=FUSION_PLUGIN, NPUB_LOG_LEVEL="error")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_a_third_party_plugin_contributes_its_pattern_through_the_abi(child):
    [p] = child["testfuse"]
    assert p["name"] == "testfuse_gelu_mul" and p["priority"] == 5
    assert [n["op"] for n in p["nodes"]] == ["aten::gelu", "aten::mul.Tensor"]
    assert p["replacement"] == {"kind": "call", "op": "testfuse::gelu_mul", "ret": 0,
                                "args": [{"kind": "value", "name": "a"}, {"kind": "value", "name": "b"}]}
    # Its fused op is the plugin's own, with a meta function: float64 erf
    # and one product against PyTorch's, a few ulp of values below ~10.
    assert child["max_err"] < 1e-13
    assert child["meta"] == [4, 6]


def test_host_patterns_register_from_python_after_the_plugins(child):
    names = [p["name"] for p in child["registered"]]
    assert names == ["host_relu_swiglu", "host_gelu_mul_tanh"]
    assert child["registered"][0]["priority"] == 3
    assert child["registered"][1]["nodes"][0]["args"][1] == {"kind": "const", "value": "tanh"}
    # Registration order: the plugins' (at start-up), then the host's, with plugin "".
    assert child["after"][-2:] == [["host_relu_swiglu", ""], ["host_gelu_mul_tanh", ""]]
    assert ["testfuse_gelu_mul", "testfuse"] in child["after"]
    assert child["again"] == "fusion pattern 'host_relu_swiglu' is already registered (by the host)"


def test_conv2d_bias_relu_trains_through_its_backward():
    # The rewrite target of conv2d_bias_relu must be differentiable
    # (cann_like::conv2d_bias_relu_backward: relu's mask, then the
    # convolution's backward). Against float64 PyTorch on the CPU: float32
    # sums of 27 products (3 channels x 3x3) and of up to 2*4*4*7 terms for
    # the weight and bias, all values O(10): 1e-5 absolute is ~100 ulp.
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 7, 7), torch.randn(4, 3, 3, 3), torch.randn(4)
    xs, ws, bs = [t.to("npu").requires_grad_() for t in (x, w, b)]
    y = torch.ops.cann_like.conv2d_bias_relu(xs, ws, bs, [2, 1], [1, 1], [1, 1], 1)
    g = torch.randn(y.shape)
    y.backward(g.to("npu"))
    xr, wr, br = [t.double().requires_grad_() for t in (x, w, b)]
    yr = torch.relu(torch.nn.functional.conv2d(xr, wr, br, stride=[2, 1], padding=1))
    yr.backward(g.double())
    for got, ref in ((y, yr), (xs.grad, xr.grad), (ws.grad, wr.grad), (bs.grad, br.grad)):
        torch.testing.assert_close(got.cpu().double(), ref.detach(), atol=1e-5, rtol=0)


# --- each in-tree pattern's replacement computes its subgraph ---
# An interpreter of the parsed form: the subgraph's lines run as ATen ops on
# the CPU in float64 (PyTorch's own result), the replacement as the plugin's
# fused op on the npu, in float64 where the kernel has it (rounding ~1e-16
# relative: 1e-12 leaves room for the different summation orders of rows up
# to 64 long) and float32 for cann_like's convolution (1e-5 absolute: ~100
# ulp of O(10) sums of 27 products).

def _op(name):
    ns, rest = name.split("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


def _call(name, args):
    """Pattern arguments follow the schema's order, keyword-only ones too
    (sdpa's `scale`): those are passed by name."""
    op = _op(name)
    schema = op._schema.arguments
    pos = [v for v, s in zip(args, schema) if not s.kwarg_only]
    kw = {s.name: v for v, s in zip(args, schema) if s.kwarg_only}
    return op(*pos, **kw)


def _arg(a, env, caps):
    kind = a["kind"]
    if kind == "value":
        return env[a["name"]]
    if kind == "capture":
        return caps[a["name"]]
    if kind == "const":
        return a["value"]
    if kind == "list":
        return [_arg(x, env, caps) for x in a["items"]]
    if kind == "size":
        return env[a["name"]].size(a["dim"])
    assert kind == "call", a
    r = _call(a["op"], [_arg(x, env, caps) for x in a["args"]])
    return r[a["ret"]] if isinstance(r, (tuple, list)) else r


def _check_rewrite(name, inputs, caps, replacement_dtype=torch.float64, subgraph_device="cpu", atol=1e-12):
    p = _by_name()[name]
    env = {k: v.to(subgraph_device) for k, v in inputs.items()}
    for n in p["nodes"]:
        r = _call(n["op"], [_arg(x, env, caps) for x in n["args"]])
        env[n["out"]] = r[n["ret"]] if isinstance(r, (tuple, list)) else r
    rep_env = {k: v.to("npu", replacement_dtype) for k, v in inputs.items()}
    rep_caps = {k: (replacement_dtype if isinstance(v, torch.dtype) else v) for k, v in caps.items()}
    r = _call(p["replacement"]["op"], [_arg(x, rep_env, rep_caps) for x in p["replacement"]["args"]])
    rets = r if isinstance(r, (tuple, list)) else [r]
    pairs = [(rets[p["replacement"]["ret"]], env[p["nodes"][-1]["out"]])]
    pairs += [(rets[e["ret"]], env[e["name"]]) for e in p["extra_outputs"]]
    for got, ref in pairs:
        assert got.shape == ref.shape
        torch.testing.assert_close(got.cpu().double(), ref.cpu().double(), atol=atol, rtol=0)


def _randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_rms_norm_rewrites_compute_their_subgraphs():
    torch.manual_seed(0)
    x, g = _randn(3, 5, 64), _randn(64)
    _check_rewrite("rms_norm", {"x": x, "gamma": g}, {"eps": 1e-6})
    _check_rewrite("rms_norm_cast", {"x": x, "gamma": g}, {"eps": 1e-5, "dtype": torch.float64})


def test_add_rms_norm_rewrites_compute_the_norm_and_the_sum():
    # The subgraph holds the fused npu_rms_norm (the rms_norm rewrite's
    # output): it runs on the npu too.
    torch.manual_seed(0)
    ins = {"x1": _randn(2, 7, 32), "x2": _randn(2, 7, 32), "gamma": _randn(32)}
    _check_rewrite("add_rms_norm", ins, {"eps": 1e-6}, subgraph_device="npu")
    _check_rewrite("add_rms_norm_cast", ins, {"eps": 1e-6, "dtype": torch.float64}, subgraph_device="npu")


def test_swiglu_rewrite_computes_silu_times_b():
    torch.manual_seed(0)
    _check_rewrite("swiglu", {"a": _randn(4, 3, 48), "b": _randn(4, 3, 48)}, {})


def test_sdpa_rewrites_compute_attention():
    torch.manual_seed(0)
    q, k, v = _randn(2, 4, 9, 16), _randn(2, 4, 9, 16), _randn(2, 4, 9, 16)
    for name in ("sdpa", "sdpa_causal"):
        _check_rewrite(name, {"q": q, "k": k, "v": v}, {"scale": 0.3})


def test_conv2d_bias_relu_rewrites_compute_conv_then_relu():
    torch.manual_seed(0)
    ins = {"x": _randn(2, 3, 8, 8), "w": _randn(5, 3, 3, 3), "b": _randn(5)}
    caps = {"stride": [1, 2], "padding": [1, 0], "dilation": [1, 1], "groups": 1}
    for name in ("conv2d_bias_relu", "conv2d_bias_relu_inplace"):
        _check_rewrite(name, ins, caps, replacement_dtype=torch.float32, atol=1e-5)
