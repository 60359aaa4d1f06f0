"""The routed operators: MindSpore's functional operators served by plugin
kernels, each with its backward (a Custom op's bprop calls the plugins'
derivative kernels), and MindSpore's own operator as the fallback. The
fused operators (RMSNorm, SwiGLU, rotary embedding, flash attention) have no
kernel in MindSpore's CPU build: there the fallback raises MindSpore's own
error, and the precision check does not judge them (no native reference).

Every function here is compiled by MindSpore's GRAPH_MODE as well as run by
PyNative, so each is written in the subset both accept: the bindings and the
native operators are closure constants, the routing decision is a
constexpr (Note [The routing decision runs in Python, before the call],
_routes.py), and tensor ranks are compared with constants.
"""
import mindspore as ms
from mindspore import Tensor, ops

from . import _precision
from ._routes import TORCH_SCALAR_TYPE, binding, not_routed, served
from ._routes import checking as _checking

# MindSpore's own operators, taken before enable() replaces any.
NATIVE = {name: getattr(ops, name) for name in (
    "matmul", "bmm", "add", "sub", "mul", "div", "relu", "gelu", "silu", "softmax", "tanh", "sigmoid", "exp",
    "rms_norm", "swiglu", "rotary_position_embedding", "flash_attention_score")}
FLOATING = (ms.float16, ms.bfloat16, ms.float32, ms.float64)
NATIVE_LAYER_NORM = ops.layer_norm


@ms.constexpr
def _torch_dtype(dtype):
    return TORCH_SCALAR_TYPE.get(dtype, 6)


@ms.constexpr
def _sum_axes(grad_shape, shape):
    """The axes of a broadcast result to sum for an operand of `shape`."""
    lead = len(grad_shape) - len(shape)
    axes = list(range(lead))
    for i, n in enumerate(shape):
        if n == 1 and grad_shape[lead + i] != 1:
            axes.append(lead + i)
    return tuple(axes)


def _reduce_to(grad, shape):
    axes = _sum_axes(grad.shape, shape)
    if axes:
        grad = ops.reduce_sum(grad, axes)
    return ops.reshape(grad, shape)


def broadcast_shape(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        x = a[len(a) - 1 - i] if i < len(a) else 1
        y = b[len(b) - 1 - i] if i < len(b) else 1
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return out[::-1]


def _routed2(name, key, native):
    """A two-tensor call of binding `key` (MindSpore operator `name`) when a
    kernel serves it, checked when the precision check is on; `native`
    otherwise."""
    prim = binding(key).prim

    def routed(a, b):
        if served(key, (a.dtype, b.dtype), (a.shape, b.shape)):
            out = prim(a, b)
            if _checking():
                out = _precision.check2(name, out, native, a, b)
            return out
        return native(a, b)

    return routed


def make_matmul(keys):
    """ops.matmul for 2-D operands (aten::mm.out): keys[(ta, tb)] for the four
    transpositions, so that the backward reads its operands transposed."""
    native = NATIVE["matmul"]

    # MindSpore's own transposing MatMul, as nn.Dense calls it. Under
    # Cell.to_float(float16) MindSpore casts a layer's float32 weight for
    # its own MatMul; the patched construct passes it as it is (the
    # dispatcher converts), so the native path casts it as MindSpore does.
    mm_nt_native, mm_tn_native = ops.MatMul(transpose_b=True), ops.MatMul(transpose_a=True)

    def _nt_native(a, b):
        return mm_nt_native(a, ops.cast(b, a.dtype))

    def _tn_native(a, b):
        return mm_tn_native(a, ops.cast(b, a.dtype))

    mm_nn = _routed2("MatMul", keys[(False, False)], native)
    mm_nt = _routed2("MatMul", keys[(False, True)], _nt_native)  # a @ b^T: nn.Dense's product, the backward's
    mm_tn = _routed2("MatMul", keys[(True, False)], _tn_native)  # a^T @ b

    def matmul(input, other):
        if len(input.shape) == 2 and len(other.shape) == 2 and input.dtype == other.dtype:
            return mm_nn(input, other)
        if not_routed("MatMul", "operands of rank other than 2 or of two dtypes (the plugin op is aten::mm)"):
            return native(input, other)
        return native(input, other)

    return matmul, mm_nt, mm_tn


def matmul_bprops(mm_nn, mm_nt, mm_tn):
    """The backward of each transposition, {(ta, tb): bprop}."""
    def bprop_nn(x, w, out, dout):  # out = x @ w
        return mm_nt(dout, w), mm_tn(x, dout)

    def bprop_nt(x, w, out, dout):  # out = x @ w^T
        return mm_nn(dout, w), mm_tn(dout, x)

    def bprop_tn(x, w, out, dout):  # out = x^T @ w
        return mm_nt(w, dout), mm_nn(x, dout)

    def bprop_tt(x, w, out, dout):  # out = x^T @ w^T
        return mm_tn(w, ops.transpose(dout, (1, 0))), mm_tn(dout, ops.transpose(x, (1, 0)))

    return {(False, False): bprop_nn, (False, True): bprop_nt, (True, False): bprop_tn, (True, True): bprop_tt}


def activation_bprop(grad, saved_output):
    """An activation's bprop: grad(dout, saved), saved its output or input."""
    def bprop_out(x, out, dout):
        return (grad(dout, out),)

    def bprop_in(x, out, dout):
        return (grad(dout, x),)

    return bprop_out if saved_output else bprop_in


def make_bmm(key):
    native = NATIVE["bmm"]
    routed = _routed2("BatchMatMul", key, native)

    def bmm(input, mat2):
        if (len(input.shape) == 3 and len(mat2.shape) == 3 and input.shape[0] == mat2.shape[0]
                and input.dtype == mat2.dtype):
            return routed(input, mat2)
        return native(input, mat2)

    return bmm


def bmm_bprop(bmm):
    def bprop(x, w, out, dout):  # out = x @ w, batched
        return bmm(dout, ops.transpose(w, (0, 2, 1))), bmm(ops.transpose(x, (0, 2, 1)), dout)

    return bprop


def make_binary(name, key, native_name):
    """add/sub/mul/div of two floating tensors of one dtype (aten::<op>.out):
    MindSpore's type promotion (float16 with float32, integers divided) and a
    Python number operand stay MindSpore's own."""
    native = NATIVE[native_name]
    same_dtype = _routed2(name, key, native)

    def routed(input, other):
        if isinstance(input, Tensor) and isinstance(other, Tensor):
            if input.dtype == other.dtype and input.dtype in FLOATING:
                return same_dtype(input, other)
            if not_routed(name, "operands of two dtypes, or not floating (MindSpore's type promotion)"):
                return native(input, other)
        if not_routed(name, "a Python number operand"):
            return native(input, other)
        return native(input, other)

    if native_name != "div":
        return routed

    def div(input, other, *, rounding_mode=None):
        if rounding_mode is None:
            return routed(input, other)
        if not_routed(name, "a rounding_mode"):
            return native(input, other, rounding_mode=rounding_mode)
        return native(input, other, rounding_mode=rounding_mode)

    return div


def binary_bprop(kind, mul, div):
    def bprop_add(x, y, out, dout):
        return _reduce_to(dout, x.shape), _reduce_to(dout, y.shape)

    def bprop_sub(x, y, out, dout):
        return _reduce_to(dout, x.shape), _reduce_to(ops.neg(dout), y.shape)

    def bprop_mul(x, y, out, dout):
        return _reduce_to(mul(dout, y), x.shape), _reduce_to(mul(dout, x), y.shape)

    def bprop_div(x, y, out, dout):
        dx = div(dout, y)
        return _reduce_to(dx, x.shape), _reduce_to(ops.neg(mul(dx, out)), y.shape)

    return {"add": bprop_add, "sub": bprop_sub, "mul": bprop_mul, "div": bprop_div}[kind]


def make_unary(name, key, native):
    """An activation with MindSpore's signature: relu's `inplace` and gelu's
    `approximate` other than 'none' stay MindSpore's own."""
    prim = binding(key).prim

    def unary(input):
        if served(key, (input.dtype,), (input.shape,)):
            out = prim(input)
            if _checking():
                out = _precision.check1(name, out, native, input)
            return out
        return native(input)

    def relu(input, inplace=False):
        if inplace:
            return native(input, inplace)
        return unary(input)

    def gelu(input, approximate="none"):
        if approximate == "none":
            return unary(input)
        if not_routed(name, "approximate other than 'none'"):
            return native(input, approximate)
        return native(input, approximate)

    return {"ReLU": relu, "GeLU": gelu}.get(name, unary)


def unary_bprop(backward_key, native_grad):
    """The backward of an activation through its aten *_backward kernel
    (grad_output, saved tensor), MindSpore's own formula when none serves."""
    prim = binding(backward_key).prim

    def grad(dout, saved):
        if served(backward_key, (dout.dtype, saved.dtype), (dout.shape, saved.shape)):
            return prim(dout, saved)
        return native_grad(dout, saved)

    return grad


def make_softmax(key, backward_key):
    prim = binding(key).prim
    native = NATIVE["softmax"]

    def softmax(input, axis=-1, *, dtype=None):
        # The last axis only: the backward's fallback formula reduces over it.
        if dtype is None and (axis == -1 or axis == len(input.shape) - 1):
            axis = -1
            if served(key, (input.dtype, ms.int64), (input.shape, ()), (None, axis)):
                out = prim(input, Tensor(axis, ms.int64))
                if _checking():
                    out = _precision.check1("Softmax", out, _native_axis(axis), input)
                return out
            return native(input, axis, dtype=dtype)
        if not_routed("Softmax", "an axis other than the last, or a dtype argument"):
            return native(input, axis, dtype=dtype)
        return native(input, axis, dtype=dtype)

    def _native_axis(axis):
        def f(x):
            return native(x, axis)
        return f

    return softmax


def softmax_bprop(backward_key):
    prim = binding(backward_key).prim

    def bprop(x, axis, out, dout):
        a = ops.cast(axis, ms.int64)
        if served(backward_key, (dout.dtype, out.dtype, ms.int64, ms.int64),
                  (dout.shape, out.shape, (), ()), (None, None, -1, _torch_dtype(x.dtype))):
            dx = prim(dout, out, a, Tensor(_torch_dtype(x.dtype), ms.int64))
        else:
            dx = (dout - ops.reduce_sum(dout * out, -1, keepdims=True)) * out
        return dx, ops.zeros_like(axis)

    return bprop


def make_layer_norm(key, native_layer_norm):
    """ops.layer_norm(input, normalized_shape, weight, bias, eps) with a
    weight and a bias of normalized_shape (aten::native_layer_norm);
    `native_layer_norm(x, gamma, beta, eps)` is MindSpore's LayerNorm."""
    prim = binding(key).prim

    def affine(x, gamma, beta, epsilon):
        if served(key, (x.dtype, gamma.dtype, beta.dtype, ms.float64), (x.shape, gamma.shape, beta.shape, ()),
                  (None, None, None, epsilon)):
            out = prim(x, gamma, beta, Tensor(epsilon, ms.float64))[0]
            if _checking():
                out = _precision.check3("LayerNorm", out, _native_eps(epsilon), x, gamma, beta)
            return out
        return native_layer_norm(x, gamma, beta, epsilon)

    def _native_eps(epsilon):
        def f(x, g, b):
            return native_layer_norm(x, g, b, epsilon)
        return f

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        if weight is not None and bias is not None and tuple(normalized_shape) == weight.shape:
            return affine(input, weight, bias, eps)
        return NATIVE_LAYER_NORM(input, normalized_shape, weight, bias, eps)

    return layer_norm, affine


def layer_norm_bprop(backward_key):
    prim = binding(backward_key).prim

    def bprop(x, gamma, beta, eps, out, dout):
        dx, dgamma, dbeta = prim(dout[0], x, out[1], out[2], gamma, beta)
        return dx, dgamma, dbeta, ops.zeros_like(eps)

    return bprop


def make_rms_norm(key, native_rms_norm):
    prim = binding(key).prim

    def rms_norm(x, gamma, epsilon=1e-6):
        if served(key, (x.dtype, gamma.dtype, ms.float64), (x.shape, gamma.shape, ()), (None, None, epsilon)):
            out = prim(x, gamma, Tensor(epsilon, ms.float64))
            return out
        return native_rms_norm(x, gamma, epsilon)

    return rms_norm


def rms_norm_bprop(backward_key):
    prim = binding(backward_key).prim

    def bprop(x, gamma, eps, out, dout):
        dx, dgamma = prim(dout[0], x, gamma, out[1])
        return dx, dgamma, ops.zeros_like(eps)

    return bprop


def make_swiglu(key, native_swiglu):
    prim = binding(key).prim

    def swiglu(input, dim=-1):
        # The last axis only: the output's shape is declared halving it.
        if (dim == -1 or dim == len(input.shape) - 1) and served(key, (input.dtype, ms.int64), (input.shape, ()),
                                                                 (None, -1)):
            return prim(input, Tensor(-1, ms.int64))
        if not (dim == -1 or dim == len(input.shape) - 1) and not_routed("SwiGLU", "a dim other than the last"):
            return native_swiglu(input, dim)
        return native_swiglu(input, dim)

    return swiglu


def swiglu_bprop(backward_key):
    prim = binding(backward_key).prim

    def bprop(x, dim, out, dout):
        return prim(dout, x, dim), ops.zeros_like(dim)

    return bprop


def make_rotary(key, native_rotary):
    prim = binding(key).prim

    def rotary_position_embedding(x, cos, sin, mode=0):
        if served(key, (x.dtype, cos.dtype, sin.dtype, ms.int64), (x.shape, cos.shape, sin.shape, ()),
                  (None, None, None, mode)):
            out = prim(x, cos, sin, Tensor(mode, ms.int64))
            return out
        return native_rotary(x, cos, sin, mode)

    return rotary_position_embedding


def rotary_bprop(backward_key):
    prim = binding(backward_key).prim

    def bprop(x, cos, sin, mode, out, dout):
        dx, dcos, dsin = prim(dout, cos, sin, x, mode)
        return dx, dcos, dsin, ops.zeros_like(mode)

    return bprop


def make_flash_attention(keys, native_attention):
    """ops.flash_attention_score without dropout, padding or a positional
    bias, with or without a boolean mask (keys[(layout, has_mask)])."""

    def flash_attention_score(query, key, value, head_num, real_shift=None, drop_mask=None, padding_mask=None,
                              attn_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                              keep_prob=1.0, scalar_value=1.0, pre_tokens=2147483647, next_tokens=2147483647,
                              inner_precise=0, input_layout="BSH", sparse_mode=0):
        plain = (real_shift is None and drop_mask is None and padding_mask is None and prefix is None
                 and actual_seq_qlen is None and actual_seq_kvlen is None and keep_prob == 1.0
                 and pre_tokens == 2147483647 and next_tokens == 2147483647 and sparse_mode == 0)
        if plain and attn_mask is None and (input_layout, False) in keys:
            k = keys[(input_layout, False)]
            if served(k, (query.dtype, key.dtype, value.dtype, ms.int64, ms.float64),
                      (query.shape, key.shape, value.shape, (), ()), (None, None, None, head_num, scalar_value)):
                return binding(k).prim(query, key, value, Tensor(head_num, ms.int64),
                                       Tensor(scalar_value, ms.float64))[0]
        if plain and attn_mask is not None and (input_layout, True) in keys:
            k = keys[(input_layout, True)]
            if served(k, (query.dtype, key.dtype, value.dtype, ms.int64, attn_mask.dtype, ms.float64),
                      (query.shape, key.shape, value.shape, (), attn_mask.shape, ()),
                      (None, None, None, head_num, None, scalar_value)):
                return binding(k).prim(query, key, value, Tensor(head_num, ms.int64), attn_mask,
                                       Tensor(scalar_value, ms.float64))[0]
        return native_attention(query, key, value, head_num, real_shift, drop_mask, padding_mask, attn_mask,
                                prefix, actual_seq_qlen, actual_seq_kvlen, keep_prob, scalar_value, pre_tokens,
                                next_tokens, inner_precise, input_layout, sparse_mode)

    return flash_attention_score


def attention_bprop(backward_key, has_mask):
    prim = binding(backward_key).prim

    def bprop(q, k, v, heads, scale, out, dout):
        dq, dk, dv = prim(q, k, v, dout[0], heads, out[1], out[2], out[3], out[0], scale)
        return dq, dk, dv, ops.zeros_like(heads), ops.zeros_like(scale)

    def bprop_mask(q, k, v, heads, mask, scale, out, dout):
        dq, dk, dv = prim(q, k, v, dout[0], heads, mask, out[1], out[2], out[3], out[0], scale)
        return dq, dk, dv, ops.zeros_like(heads), ops.zeros_like(mask), ops.zeros_like(scale)

    return bprop_mask if has_mask else bprop
