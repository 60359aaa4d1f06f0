"""Fusion patterns as data (docs/graph-mode.md, "Fusion patterns").

The table and its parsed form (npubridge._C._fusion_patterns): the in-tree
plugins' patterns, a third-party plugin's pattern contributed through the C
ABI (tests/plugins/fusion_plugin.cpp, ABI 1.5), host registration from
Python and its errors. A plugin loads only at start-up (NPUB_PLUGIN_PATH)
and a registered pattern stays for the process, so those checks run in one
child process of their own; the parse errors change nothing and run here.

Then the patterns in the compiler: each rewrite checked numerically against
the unfused subgraph (the same graph compiled with patterns off) and float64
CPU; the matcher's rules (commutative operands, users outside the match,
dtype and meta checks) with the skip reasons; the third-party plugin's
pattern used by torch.compile(backend="npu"). The matcher's guards against
silently wrong rewrites (where lines, mutations and grad-mode switches
inside a match) are in test_pattern_guards.py."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import npubridge
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


def test_where_conditions_in_the_parsed_form():
    ps = _by_name()
    assert ps["rms_norm"]["where"] == [
        {"lhs": {"kind": "dim", "name": "gamma"}, "op": "==", "rhs": {"kind": "const", "value": 1},
         "line": ps["rms_norm"]["where"][0]["line"], "text": "%gamma.dim() == 1"},
        {"lhs": {"kind": "size", "name": "gamma", "dim": 0}, "op": "==", "rhs": {"kind": "size", "name": "x",
         "dim": -1}, "line": ps["rms_norm"]["where"][1]["line"], "text": "%gamma.size(0) == %x.size(-1)"}]
    assert ps["rms_norm_cast"]["where"][0]["lhs"] == {"kind": "capture", "name": "dtype"}
    assert ps["rms_norm_cast"]["where"][0]["rhs"] == {"kind": "dtype", "name": "x"}
    assert ps["add_rms_norm_cast"]["where"][0]["text"] == "$dtype == %s.dtype"
    # npubridge's own patterns are text in the same table (plugin "").
    up = ps["rms_norm_upcast"]
    assert up["plugin"] == "" and "  where $dt0 == float32\n" in up["text"]
    assert up["where"][0]["rhs"] == {"kind": "dtype_name", "name": "float32"}
    assert ps["sdpa_bool_mask"]["plugin"] == ""


def test_the_cli_lists_each_pattern_as_its_text(capsys):
    # python3 -m npubridge graph: the text the table parsed, extra outputs
    # and where lines included.
    from npubridge._compile import cli

    cli.print_patterns()
    out = capsys.readouterr().out
    add = out[out.index("pattern add_rms_norm priority 10"):]
    assert add[:add.index("\nend\n")].endswith("=> %s <- [2]")
    assert "  where %gamma.dim() == 1\n" in out and "# from npubridge (builtin)\npattern rms_norm_upcast" in out


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
    ("pattern p\n  %a = aten::relu(%x)\n  where %x.dim() >= 1\n  => mindspeed_like::npu_swiglu(%a)\nend\n",
     "fusion pattern text, line 3, pattern 'p': expected '==' or '!=' at '>= 1'"),
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


# --- the patterns in the compiler ---

U32 = 2.0 ** -24  # float32 unit roundoff


class _RMSNorm(torch.nn.Module):
    """The composite as models write it; ``swap`` puts gamma second."""

    def __init__(self, dim, swap=False, expose_rsqrt=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.swap, self.expose_rsqrt = swap, expose_rsqrt

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        n = x * r
        y = n * self.weight if self.swap else self.weight * n
        return (y, r) if self.expose_rsqrt else y


class _Block(torch.nn.Module):
    """residual add + RMSNorm, then SwiGLU: the transformer MLP's shape."""

    def __init__(self, dim=32):
        super().__init__()
        self.norm = _RMSNorm(dim)
        self.gate, self.up = torch.nn.Linear(dim, 2 * dim), torch.nn.Linear(dim, 2 * dim)

    def forward(self, x, res):
        s = x + res
        h = self.norm(s)
        return F.silu(self.gate(h)) * self.up(h), s


def _fired(compiled):
    return npubridge.compile_report(compiled)["patterns_fired"]


def _skipped(compiled):
    return npubridge.compile_report(compiled)["graphs"][0]["patterns_skipped"]


def _grads(model, outs, args):
    loss = sum((o * torch.linspace(-1, 1, o.numel(), device=o.device).view(o.shape)).sum() for o in outs)
    params = list(model.parameters())
    return torch.autograd.grad(loss, params + [a for a in args if a.requires_grad])


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = _Block().npu()
    x, res = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    runs = {}
    for name, opts in (("fused", {"patterns": True}), ("unfused", {"patterns": False})):
        compiled = npubridge.compile(model, options=opts)
        args = [x.npu().requires_grad_(), res.npu().requires_grad_()]
        outs = compiled(*args)
        runs[name] = (compiled, [o.detach() for o in outs], _grads(model, outs, args))
    cpu = _Block().double()
    cpu.load_state_dict({k: v.cpu().double() for k, v in model.state_dict().items()})
    args = [x.double().requires_grad_(), res.double().requires_grad_()]
    outs = cpu(*args)
    runs["ref"] = (None, [o.detach() for o in outs], _grads(cpu, outs, args))
    return runs


def test_block_fires_add_rms_norm_and_swiglu(block):
    # rms_norm first, then add_rms_norm over the fused norm (its priority is lower).
    assert _fired(block["fused"][0]) == {"rms_norm": 1, "add_rms_norm": 1, "swiglu": 1}
    assert _fired(block["unfused"][0]) == {}


def test_fused_block_matches_the_unfused_graph_and_float64(block):
    # The fused kernels compute the same sums in float32 in another order:
    # each result within eager-size error of float64, i.e. 2x the unfused
    # graph's error plus 8 roundings of the largest value.
    _, fused_out, fused_grads = block["fused"]
    _, plain_out, plain_grads = block["unfused"]
    _, ref_out, ref_grads = block["ref"]
    for i, (f, p, r) in enumerate(zip(fused_out + list(fused_grads), plain_out + list(plain_grads),
                                      ref_out + list(ref_grads))):
        err = (f.double().cpu() - r).abs().max().item()
        plain_err = (p.double().cpu() - r).abs().max().item()
        assert err <= 2 * plain_err + 8 * U32 * r.abs().max().item(), (i, err, plain_err)


def test_the_residual_sum_is_the_fused_ops_second_output(block):
    # The sum x + res is also returned: the extra output of add_rms_norm
    # replaced it, and adding two floats is exact the same way in both.
    assert torch.equal(block["fused"][1][1].cpu(), block["unfused"][1][1].cpu())


def _compile_run(module, *inputs, grad=False):
    compiled = npubridge.compile(module)
    if grad:
        out = compiled(*inputs)
    else:
        with torch.no_grad():
            out = compiled(*inputs)
    return compiled, out


def test_gamma_on_either_side_matches():
    torch.manual_seed(1)
    x = torch.randn(3, 16).npu()
    for swap in (False, True):
        model = _RMSNorm(16, swap=swap).npu()
        compiled, out = _compile_run(model, x)
        assert _fired(compiled) == {"rms_norm": 1}, swap
        with torch.no_grad():
            eager = model(x)
        # One fused kernel vs five ops: a few float32 roundings of |y|.
        assert (out - eager).abs().max().item() <= 8 * U32 * eager.abs().max().item()


def test_a_value_used_outside_the_match_blocks_the_rewrite():
    torch.manual_seed(2)
    model = _RMSNorm(16, expose_rsqrt=True).npu()
    x = torch.randn(3, 16).npu()
    compiled, (y, r) = _compile_run(model, x)
    assert _fired(compiled) == {}
    skipped = _skipped(compiled)["rms_norm"]
    assert len(skipped) == 1 and next(iter(skipped)).startswith("rsqrt has users outside the match")
    with torch.no_grad():
        ey, er = model(x)
    assert torch.equal(y.cpu(), ey.cpu()) and torch.equal(r.cpu(), er.cpu())  # the unfused ops, unchanged


def test_a_dtype_without_a_kernel_is_skipped_with_the_reason():
    # cann_like's conv2d_bias_relu takes float32 only.
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(2, 4, 3).double().npu()
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64).npu()
    compiled, out = _compile_run(torch.nn.Sequential(conv, torch.nn.ReLU()), x)
    assert _fired(compiled) == {}
    assert _skipped(compiled)["conv2d_bias_relu"] == {
        "cann_like::conv2d_bias_relu has no npu kernel for torch.float64 (takes float32)": 1}
    with torch.no_grad():
        assert torch.equal(out.cpu(), F.relu(conv(x)).cpu())


class _Attention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)


def test_sdpa_with_a_boolean_mask_becomes_flash_attention():
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True  # every row sees a key
    compiled, out = _compile_run(_Attention(), q.npu(), k.npu(), v.npu(), mask.npu())
    assert _fired(compiled) == {"sdpa_bool_mask": 1}
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=0.3)
    # softmax over 5 keys and a 5-term weighted sum in float32: within
    # ~16 roundings of the largest |value| (|P| <= 1, the sums are short).
    assert (out.cpu().double() - ref).abs().max().item() <= 16 * U32 * v.abs().max().item()


def test_sdpa_with_an_additive_mask_stays_unfused():
    # The flash kernel takes a boolean mask only: the pattern's where line
    # leaves a float (additive) one to eager SDPA.
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 4, 8).npu() for _ in range(3))
    mask = torch.randn(1, 1, 4, 4).npu()
    compiled, out = _compile_run(_Attention(), q, k, v, mask)
    assert _fired(compiled) == {}
    assert _skipped(compiled)["sdpa_bool_mask"] == {
        "where %mask.dtype == bool does not hold (float32 == bool is false)": 1}
    with torch.no_grad():
        assert torch.equal(out.cpu(), _Attention()(q, k, v, mask).cpu())


_COMPILE_CHILD = """
import json, torch, npubridge
import torch.nn.functional as F
torch.manual_seed(0)

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8).double(), torch.nn.Linear(8, 8).double()
    def forward(self, x):
        return self.b(x) * F.gelu(self.a(x))  # the pattern's mul, operands swapped

m = M().npu()
x = torch.randn(4, 8, dtype=torch.float64)
compiled = npubridge.compile(m)
y = compiled(x.npu())
y.sum().backward()
grads = [p.grad.cpu() for p in m.parameters()]
cpu = M()
cpu.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
ref = cpu(x)
ref.sum().backward()
report = npubridge.compile_report(compiled)
fw = report["graphs"][0]["parts"]["forward"]["summary"]["nodes"]
bw = report["graphs"][0]["parts"]["backward"]["summary"]["nodes"]
print("RESULT" + json.dumps({
    "fired": report["patterns_fired"],
    "fw": [(n["target"], n["kind"], n["plugin"]) for n in fw if "testfuse" in n["target"]],
    "bw": [(n["target"], n["kind"], n["plugin"]) for n in bw if "testfuse" in n["target"]],
    "err": (y.detach().cpu() - ref.detach()).abs().max().item(),
    "grad_err": max((g - p.grad).abs().max().item() for g, p in zip(grads, cpu.parameters())),
}))
"""


def test_the_compiler_uses_the_third_party_plugins_pattern():
    # A child process: the plugin loads at start-up only (NPUB_PLUGIN_PATH).
    assert os.path.isfile(FUSION_PLUGIN), f"NPUB_TEST_FUSION_PLUGIN={FUSION_PLUGIN}: no such file"
    env = dict(os.environ, NPUB_PLUGIN_PATH=FUSION_PLUGIN, NPUB_LOG_LEVEL="error")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_COMPILE_CHILD)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))[len("RESULT"):])
    assert out["fired"] == {"testfuse_gelu_mul": 1}
    # The forward runs the plugin's fused op, the backward its derivative.
    assert [t for t, _, _ in out["fw"]] == ["testfuse.gelu_mul.default"]
    assert [t for t, _, _ in out["bw"]] == ["testfuse.gelu_mul_backward.default"]
    assert all(kind == "kernel" and plugin == "testfuse" for _, kind, plugin in out["fw"] + out["bw"])
    # float64 throughout: erf, a product and 8-term sums, against PyTorch's
    # float64 CPU ops: a few ulp of values of order 10.
    assert out["err"] < 1e-13 and out["grad_err"] < 1e-12

