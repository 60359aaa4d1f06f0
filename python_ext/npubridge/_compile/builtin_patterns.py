"""The fusion patterns in the parsed form (common to the C++ table's
``_C._fusion_patterns()``; docs/graph-mode.md, "Fusion patterns"):
``standard_patterns`` mirrors the in-tree plugins' patterns for a build
without the table, ``host_patterns`` are the ones npubridge adds to any
table for the graphs Hugging Face models give."""


# Helpers spelling the parsed form (common18.md "Fusion pattern text").
def _v(name):
    return {"kind": "value", "name": name}


def _cap(name):
    return {"kind": "capture", "name": name}


def _c(value):
    return {"kind": "const", "value": value}


def _call(op, *args, ret=0):
    return {"kind": "call", "op": op, "args": list(args), "ret": ret}


def _node(out, op, *args, ret=0):
    return {"out": out, "op": op, "args": list(args), "ret": ret}


def _rms_core(x="x", cast_in=False):
    """HF LlamaRMSNorm as the pre-dispatch graph spells it: (x = h.to(f32)),
    x.pow(2).mean(-1, keepdim=True), + eps, rsqrt, x * r, .to(dtype), * gamma."""
    nodes = [_node("x", "aten::to.dtype", _v("h"), _cap("dt0"))] if cast_in else []
    nodes += [_node("sq", "aten::pow.Tensor_Scalar", _v(x), _c(2)),
              _node("ms", "aten::mean.dim", _v("sq"), _c([-1]), _c(True)),
              _node("var", "aten::add.Tensor", _v("ms"), _cap("eps")),
              _node("r", "aten::rsqrt", _v("var")),
              _node("n", "aten::mul.Tensor", _v(x), _v("r"))]
    return nodes


def _pattern(name, nodes, replacement, priority=0, extra_outputs=()):
    return {"name": name, "plugin": "", "priority": priority, "text": "", "nodes": nodes,
            "replacement": replacement, "extra_outputs": list(extra_outputs)}


def _fa(mask, sparse_mode):
    """npu_fusion_attention in BNSD layout (what _sdpa.py calls eagerly)."""
    return _call("mindspeed_like::npu_fusion_attention", _v("q"), _v("k"), _v("v"), {"kind": "size", "name": "q",
                 "dim": 1}, _c("BNSD"), _c(None), _c(None), mask, _cap("scale"), _c(1.0), _c(2147483647),
                 _c(2147483647), _c(0), _c(None), _c(None), _c(None), _c(sparse_mode))


def _sdpa_node(mask, causal):
    return _node("o", "aten::scaled_dot_product_attention", _v("q"), _v("k"), _v("v"), mask, _c(0.0), _c(causal),
                 _cap("scale"))


def standard_patterns():
    """The in-tree plugins' patterns (plugins/*/src/fusion_patterns.cpp) in
    the parsed form, for a build whose C++ table (``_C._fusion_patterns``)
    is not there; the table, when there, is the source."""
    rms = _call("mindspeed_like::npu_rms_norm", _v("x"), _v("gamma"), _cap("eps"), ret=0)
    add_rms = _call("mindspeed_like::npu_add_rms_norm", _v("x1"), _v("x2"), _v("gamma"), _cap("eps"), ret=0)
    fused = _node("n", "mindspeed_like::npu_rms_norm", _v("sc"), _v("gamma"), _cap("eps"), ret=0)
    conv = [_node("c", "aten::conv2d", _v("x"), _v("w"), _v("b"), _cap("stride"), _cap("padding"),
                  _cap("dilation"), _cap("groups"))]
    conv_relu = _call("cann_like::conv2d_bias_relu", _v("x"), _v("w"), _v("b"), _cap("stride"), _cap("padding"),
                      _cap("dilation"), _cap("groups"))
    return [
        _pattern("rms_norm_cast", _rms_core() + [_node("nc", "aten::to.dtype", _v("n"), _cap("dtype")),
                                                 _node("y", "aten::mul.Tensor", _v("gamma"), _v("nc"))], rms, 21),
        _pattern("rms_norm", _rms_core() + [_node("y", "aten::mul.Tensor", _v("gamma"), _v("n"))], rms, 20),
        _pattern("add_rms_norm_cast", [_node("s", "aten::add.Tensor", _v("x1"), _v("x2")),
                                       _node("sc", "aten::to.dtype", _v("s"), _cap("dtype")), fused],
                 add_rms, 11, [{"name": "s", "ret": 2}]),
        _pattern("add_rms_norm", [_node("s", "aten::add.Tensor", _v("x1"), _v("x2")), dict(fused, args=[
            _v("s"), _v("gamma"), _cap("eps")])], add_rms, 10, [{"name": "s", "ret": 2}]),
        _pattern("swiglu", [_node("s", "aten::silu", _v("a")), _node("y", "aten::mul.Tensor", _v("s"), _v("b"))],
                 _call("mindspeed_like::npu_swiglu", _call("aten::cat", {"kind": "list", "items": [_v("a"), _v("b")]},
                                                           _c(-1)), _c(-1)), 10),
        _pattern("conv2d_bias_relu", conv + [_node("y", "aten::relu", _v("c"))], conv_relu, 10),
        _pattern("conv2d_bias_relu_inplace", conv + [_node("y", "aten::relu_", _v("c"))], conv_relu, 10),
        _pattern("sdpa_causal", [_sdpa_node(_c(None), True)], dict(_fa(_c(None), 2), ret=0), 10),
        _pattern("sdpa", [_sdpa_node(_c(None), False)], dict(_fa(_c(None), 0), ret=0), 10),
    ]


def host_patterns():
    """Patterns npubridge adds to any table, for graphs the standard ones miss.

    ``rms_norm_upcast``: HF's RMSNorm casts its input to float32 first; in
    bfloat16 the fused op must take the bfloat16 input itself (the cast is
    inside the match), and in float32 the no-op cast is looked through
    (Note [No-op casts are looked through]). Tried before rms_norm_cast.
    ``sdpa_bool_mask``: HF passes a boolean mask (True = attend); the kernel
    takes the opposite (True = masked out), so the mask goes through
    where(mask, False, True), whose meta check also rejects a float
    (additive) mask: such a match is skipped. AOTAutograd would otherwise
    decompose SDPA into the math path: the eager backend choice of _sdpa.py
    does not happen in a compiled graph."""
    rms_h = _call("mindspeed_like::npu_rms_norm", _v("h"), _v("gamma"), _cap("eps"), ret=0)
    not_mask = _call("aten::where.Scalar", _v("mask"), _c(False), _c(True))
    return [
        _pattern("rms_norm_upcast", _rms_core(cast_in=True) + [_node("nc", "aten::to.dtype", _v("n"), _cap("dtype")),
                                                              _node("y", "aten::mul.Tensor", _v("gamma"), _v("nc"))],
                 rms_h, 22),
        _pattern("sdpa_bool_mask", [_sdpa_node(_v("mask"), False)], dict(_fa(not_mask, 0), ret=0), 10),
    ]
