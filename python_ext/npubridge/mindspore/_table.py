"""The adapter's mapping table: which registry op serves each MindSpore
operator, with which argument layout (mindspore_host/src/binding.h), and
which registry op serves its backward. Like registry/data/op_map.txt for
PyTorch, it is data; register_op() changes an entry at run time.

Each Route is bound (slots, Custom ops) when enable() first needs it, after
the runtime has loaded the plugins; an operator whose registry op no loaded
plugin defines is not routed (MindSpore's own operator serves it).
"""
import mindspore as ms
from mindspore import ops

from . import _functional as F
from . import _library
from ._routes import Binding, register


def _same(*shapes):
    return shapes[0]


def _first_dtype(*dtypes):
    return dtypes[0]


def _mm_shape(ta, tb):
    def shape(a, b):
        m = a[1] if ta else a[0]
        n = b[0] if tb else b[1]
        return [m, n]
    return shape


def _bmm_shape(a, b):
    return [a[0], a[1], b[2]]


def _broadcast(a, b):
    return F.broadcast_shape(a, b)


# name: (registry op, layout, outputs); the default table. A layout's tokens
# name the Custom op's inputs (t<i>), 0-d inputs read as scalars (s<i>) and
# constants; "o0" is the Custom op's output passed as the out= tensor.
TABLE = {
    "MatMul": ("aten::mm.out", "t0 t1 o0", "a2"),
    "BatchMatMul": ("aten::bmm.out", "t0 t1 o0", "a2"),
    "Add": ("aten::add.out", "t0 t1 i:1 o0", "a3"),
    "Sub": ("aten::sub.out", "t0 t1 i:1 o0", "a3"),
    "Mul": ("aten::mul.out", "t0 t1 o0", "a2"),
    "Div": ("aten::div.out", "t0 t1 o0", "a2"),
    "ReLU": ("aten::relu", "t0", "r0"),
    "GeLU": ("aten::gelu.out", "t0 str:none o0", "a2"),
    "SiLU": ("aten::silu.out", "t0 o0", "a1"),
    "Sigmoid": ("aten::sigmoid.out", "t0 o0", "a1"),
    "Tanh": ("aten::tanh.out", "t0 o0", "a1"),
    "Softmax": ("aten::_softmax.out", "t0 s1 b:0 o0", "a3"),
    "LayerNorm": ("aten::native_layer_norm", "t0 g1 t1 t2 s3", "r0 r1 r2"),
    "RMSNorm": ("mindspeed_like::npu_rms_norm", "t0 t1 s2", "r0 r1"),
    "SwiGLU": ("mindspeed_like::npu_swiglu", "t0 s1", "r0"),
    "RotaryPositionEmbedding": ("mindspeed_like::npu_rotary_position_embedding", "t0 t1 t2 s3", "r0"),
    "FlashAttentionScore": ("mindspeed_like::npu_fusion_attention", None, None),
    "AdamW": ("mindspeed_like::npu_apply_adam_w", "L0 L1 L2 L3 L s4 s5 s6 s7 s8 s9 b:0 b:0", "a0.0 a2.0 a3.0"),
}
# The backward's registry op of each operator that has one of its own.
BACKWARD = {
    "ReLU": ("aten::threshold_backward.grad_input", "t0 t1 f:0 o0", "a3"),
    "GeLU": ("aten::gelu_backward.grad_input", "t0 t1 str:none o0", "a3"),
    "SiLU": ("aten::silu_backward.grad_input", "t0 t1 o0", "a2"),
    "Sigmoid": ("aten::sigmoid_backward.grad_input", "t0 t1 o0", "a2"),
    "Tanh": ("aten::tanh_backward.grad_input", "t0 t1 o0", "a2"),
    "Softmax": ("aten::_softmax_backward_data.out", "t0 t1 s2 s3 o0", "a4"),
    "LayerNorm": ("aten::native_layer_norm_backward", "t0 t1 g5 t2 t3 t4 t5 l:1.1.1", "r0 r1 r2"),
    "RMSNorm": ("mindspeed_like::npu_rms_norm_backward", "t0 t1 t2 t3", "r0 r1"),
    "SwiGLU": ("mindspeed_like::npu_swiglu_backward", "t0 t1 s2", "r0"),
    "RotaryPositionEmbedding": ("mindspeed_like::npu_rotary_position_embedding_backward", "t0 t1 t2 t3 s4",
                                "r0 r1 r2"),
}
# The unary activations: MindSpore's functional name, and the derivative
# through the saved tensor the backward kernel takes (the input, or for
# ReLU, sigmoid and tanh their output) when no kernel serves the backward.
UNARY = {
    "ReLU": ("relu", "out"), "GeLU": ("gelu", "in"), "SiLU": ("silu", "in"), "Sigmoid": ("sigmoid", "out"),
    "Tanh": ("tanh", "out"),
}


_BOUND = {}  # (MindSpore op, role, target, layout, outputs) -> binding key


def bind(name, target, layout, outputs, shape_fn, dtype_fn, bprop=None):
    """The binding of `target` for MindSpore op `name`, made once: slots are
    never unbound (Note [One exported function per slot]), so a table built
    again (register_op) reuses the bindings of the entries it keeps. One
    layout may be bound twice: with a bprop (the forward) and without (the
    backward's own calls: build()'s MatMul comment says why)."""
    cache_key = (name, bprop is not None, target, layout, outputs)
    if cache_key not in _BOUND:
        _BOUND[cache_key] = register(Binding(name, target, layout, outputs, shape_fn, dtype_fn, bprop))
    return _BOUND[cache_key]


def _input_grad(fn):
    """The derivative of activation `fn` at its input, by MindSpore's own autodiff."""
    def grad(dout, x):
        return ms.grad(fn)(x) * dout
    return grad


def _relu_grad(dout, out):
    return dout * ops.cast(out > 0, dout.dtype)


def _sigmoid_grad(dout, out):
    return dout * out * (1 - out)


def _tanh_grad(dout, out):
    return dout * (1 - out * out)


# The derivative of the activations whose backward kernel reads their
# output, from that output, when no kernel serves the backward.
_OUTPUT_GRADS = {"ReLU": _relu_grad, "Sigmoid": _sigmoid_grad, "Tanh": _tanh_grad}


def build(table):
    """Binds every route of `table` whose registry op a loaded plugin defines;
    returns {functional name: routed function} and the routes left out
    ({name: why})."""
    fns, missing = {}, {}

    def have(name, *targets):
        for t in targets:
            if _library.schema(t) is None:
                missing[name] = f"no loaded plugin defines {t}"
                return False
        return True

    tgt = {name: entry[0] for name, entry in table.items()}
    # MatMul: the four transpositions (the backward reads operands
    # transposed). The backward's products are bindings of their own,
    # without a bprop: a bprop is a function MindSpore compiles, so it cannot
    # refer to the binding it belongs to.
    if have("MatMul", tgt["MatMul"]):
        base = table["MatMul"][1].split()
        layouts = {(ta, tb): " ".join([base[0] + ("T" if ta else ""), base[1] + ("T" if tb else "")] + base[2:])
                   for ta in (False, True) for tb in (False, True)}
        back = {tt: bind("MatMul", tgt["MatMul"], layouts[tt], table["MatMul"][2], _mm_shape(*tt), _first_dtype)
                for tt in layouts}
        bprops = F.matmul_bprops(*F.make_matmul(back))
        keys = {tt: bind("MatMul", tgt["MatMul"], layouts[tt], table["MatMul"][2], _mm_shape(*tt), _first_dtype,
                          bprops[tt]) for tt in layouts}
        matmul, mm_nt, mm_tn = F.make_matmul(keys)
        fns["matmul"], fns["linear"] = matmul, mm_nt
    if have("BatchMatMul", tgt["BatchMatMul"]):
        entry = table["BatchMatMul"]
        back = F.make_bmm(bind("BatchMatMul", entry[0], entry[1], entry[2], _bmm_shape, _first_dtype))
        fns["bmm"] = F.make_bmm(bind("BatchMatMul", entry[0], entry[1], entry[2], _bmm_shape, _first_dtype,
                                      F.bmm_bprop(back)))
    back_mul = back_div = None
    if have("Mul", tgt["Mul"]):
        back_mul = F.make_binary("Mul", bind("Mul", *table["Mul"], _broadcast, _first_dtype), "mul")
    if have("Div", tgt["Div"]):
        back_div = F.make_binary("Div", bind("Div", *table["Div"], _broadcast, _first_dtype), "div")
    for name, kind in (("Mul", "mul"), ("Div", "div"), ("Add", "add"), ("Sub", "sub")):
        if not have(name, tgt[name]):
            continue
        k = bind(name, *table[name], _broadcast, _first_dtype,
                  F.binary_bprop(kind, back_mul or F.NATIVE["mul"], back_div or F.NATIVE["div"]))
        fns[kind] = F.make_binary(name, k, kind)
    for name, (fname, saved) in UNARY.items():
        if name not in table or not have(name, tgt[name]):
            continue
        native = F.NATIVE[fname]
        grad = _OUTPUT_GRADS[name] if saved == "out" else _input_grad(native)
        if name in BACKWARD and have(name, BACKWARD[name][0]):
            bt, bl, bo = BACKWARD[name]
            grad = F.unary_bprop(bind(name, bt, bl, bo, _same, _first_dtype), grad)
        k = bind(name, tgt[name], table[name][1], table[name][2], _same, _first_dtype,
                  F.activation_bprop(grad, saved == "out"))
        fns[fname] = F.make_unary(name, k, native)
    if have("Softmax", tgt["Softmax"], BACKWARD["Softmax"][0]):
        bk = bind("Softmax", *BACKWARD["Softmax"], _same, _first_dtype)
        k = bind("Softmax", tgt["Softmax"], table["Softmax"][1], table["Softmax"][2], _same, _first_dtype,
                  F.softmax_bprop(bk))
        fns["softmax"] = F.make_softmax(k, bk)
    if have("LayerNorm", tgt["LayerNorm"], BACKWARD["LayerNorm"][0]):
        bk = bind("LayerNorm", *BACKWARD["LayerNorm"],
                   lambda dy, x, mean, rstd, g, b: [x, g, b], lambda *d: [d[1], d[4], d[5]])
        k = bind("LayerNorm", tgt["LayerNorm"], table["LayerNorm"][1], table["LayerNorm"][2],
                  lambda x, g, b, e: [x, _stats_shape(x, g), _stats_shape(x, g)],
                  lambda x, g, b, e: [x, _stats_dtype(x), _stats_dtype(x)], F.layer_norm_bprop(bk))
        fns["layer_norm"], fns["layer_norm_affine"] = F.make_layer_norm(k, _native_layer_norm)
    for name, fname, native_name in (("RMSNorm", "rms_norm", "rms_norm"), ("SwiGLU", "swiglu", "swiglu"),
                                     ("RotaryPositionEmbedding", "rotary_position_embedding",
                                      "rotary_position_embedding")):
        if not have(name, tgt[name], BACKWARD[name][0]):
            continue
        native = F.NATIVE[native_name]
        if name == "RMSNorm":
            bk = bind(name, *BACKWARD[name], lambda dy, x, g, r: [x, g], lambda dy, x, g, r: [x, g])
            k = bind(name, tgt[name], table[name][1], table[name][2],
                      lambda x, g, e: [x, _stats_shape(x, g)], lambda x, g, e: [x, _stats_dtype(x)],
                      F.rms_norm_bprop(bk))
            fns[fname] = F.make_rms_norm(k, native)
        elif name == "SwiGLU":
            bk = bind(name, *BACKWARD[name], lambda dy, x, d: x, lambda dy, x, d: x)
            k = bind(name, tgt[name], table[name][1], table[name][2],
                      lambda x, d: x[:-1] + [x[-1] // 2], _first_dtype, F.swiglu_bprop(bk))
            fns[fname] = F.make_swiglu(k, native)
        else:
            bk = bind(name, *BACKWARD[name], lambda dy, c, s, x, m: [x, c, s], lambda dy, c, s, x, m: [x, c, s])
            k = bind(name, tgt[name], table[name][1], table[name][2], lambda x, c, s, m: x, _first_dtype,
                      F.rotary_bprop(bk))
            fns[fname] = F.make_rotary(k, native)
    if "FlashAttentionScore" in table and have("FlashAttentionScore", tgt["FlashAttentionScore"],
                                               "mindspeed_like::npu_fusion_attention_grad"):
        fns["flash_attention_score"] = _bind_attention(tgt["FlashAttentionScore"])
    return fns, missing


def _stats_shape(x, gamma):
    """A normalisation's per-row statistics: x's shape with gamma's dims 1."""
    return x[:len(x) - len(gamma)] + [1] * len(gamma)


def _stats_dtype(x):
    """The statistics' dtype the kernels make: float64 for float64, else float32.
    (ops.Custom passes a tensor type, mindspore.tensor_type(float64); the
    routing decision the element type.)"""
    element = x.element_type() if hasattr(x, "element_type") else x
    return ms.float64 if element == ms.float64 else ms.float32


def _native_layer_norm(x, gamma, beta, epsilon):
    """MindSpore's LayerNorm primitive, which its CPU build runs (ops.layer_norm
    is LayerNormExt, which it does not)."""
    axis = -len(gamma.shape)
    return ops.LayerNorm(axis, axis, epsilon)(x, gamma, beta)[0]


def _attention_stats_shape(q, layout):
    # softmax_max / softmax_sum: [B, N, S, 8] float32, as torch_npu's op.
    if layout == "BNSD":
        return [q[0], q[1], q[2], 8]
    return [q[0], q[2], q[1], 8]


def _bind_attention(target):
    keys = {}
    grad = "mindspeed_like::npu_fusion_attention_grad"
    for layout in ("BSND", "BNSD"):
        for has_mask in (False, True):
            if has_mask:
                fwd = f"t0 t1 t2 s3 str:{layout} n n t4 s5"
                bwd = f"t0 t1 t2 t3 s4 str:{layout} n n t5 t6 t7 t8 t9 s10"
            else:
                fwd = f"t0 t1 t2 s3 str:{layout} n n n s4"
                bwd = f"t0 t1 t2 t3 s4 str:{layout} n n n t5 t6 t7 t8 s9"
            # The forward's returns, which the backward reads: attention_out,
            # softmax_max, softmax_sum, softmax_out.
            bk = bind("FlashAttentionScore", grad, bwd, "r0 r1 r2",
                       lambda q, k, v, *rest: [q, k, v], lambda q, k, v, *rest: [q, k, v])

            def fwd_shape(q, k, v, heads, *rest, _layout=layout):
                stats = _attention_stats_shape(q, _layout)
                return [q[:-1] + [v[-1]], stats, stats, [0]]

            keys[(layout, has_mask)] = bind("FlashAttentionScore", target, fwd, "r0 r1 r2 r3", fwd_shape,
                                             lambda q, *rest: [q, _stats_dtype(q), _stats_dtype(q), q],
                                             F.attention_bprop(bk, has_mask))
    return F.make_flash_attention(keys, F.NATIVE["flash_attention_score"])

