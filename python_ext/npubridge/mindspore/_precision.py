"""The precision check: each routed call's result judged against MindSpore's
own operator, in PyNative and in GRAPH_MODE alike.

The judgement is npubridge's error model (dispatcher/include/npubridge/
dispatcher/error_bound.h, Note [The error model]) for an op without an
entry, kHostCalibrated: the reference y is MindSpore's operator run in
float64 on the same inputs, `host` the same operator in the call's dtype,
and an element passes when

    |got - y| <= 4 ulp_d(y) + 2 ulp_d(max_j |y_j|) + 4 max_j |host_j - y_j|

with d the output dtype. The judge is a pyfunc Custom op placed beside the
routed op (ops.depend keeps it in a compiled graph), so a GRAPH_MODE graph
compiled while the check is on checks every run.
"""
import numpy as np

import mindspore as ms
from mindspore import Tensor, ops

from ._routes import STATE

_BITS = {ms.float32: (24, -126), ms.float16: (11, -14), ms.bfloat16: (8, -126), ms.float64: (53, -1022)}
_OP_NAMES = []


class PrecisionMismatchError(RuntimeError):
    """A plugin result outside the error bound, with raise_on_mismatch."""


@ms.constexpr
def _op_code(name):
    if name not in _OP_NAMES:
        _OP_NAMES.append(name)
    return _OP_NAMES.index(name)


@ms.constexpr
def _bits(dtype):
    return _BITS.get(dtype, (24, -126))


def _ulp(v, bits, emin):
    mag = np.abs(v)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    exp = np.where(mag > 0, np.maximum(exp, emin), emin)
    return np.exp2(exp - bits + 1)


def judge(got, ref, host, code, precision):
    """Compares, records a mismatch (STATE.mismatches); returns a dummy."""
    got, ref, host = (np.asarray(a, dtype=np.float64) for a in (got, ref, host))
    bits, emin = int(precision[0]), int(precision[1])
    finite = np.isfinite(ref)
    scale = np.max(np.abs(ref[finite])) if finite.any() else 0.0
    spread = np.max(np.abs(host - ref)[finite]) if finite.any() else 0.0
    bound = 4 * _ulp(ref, bits, emin) + 2 * _ulp(np.float64(scale), bits, emin) + 4 * spread
    err = np.abs(got - ref)
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    bad = ~same & ~(err <= bound)
    if bad.any():
        worst = int(np.argmax(np.where(bad, err - bound, -np.inf)))
        op = _OP_NAMES[int(code)]
        m = {"op": op, "index": worst, "got": float(got.flat[worst]), "reference": float(ref.flat[worst]),
             "abs_error": float(err.flat[worst]), "bound": float(bound.flat[worst]), "elements": int(bad.sum())}
        with STATE.lock:
            STATE.mismatches.append(m)
        if STATE.raise_on_mismatch:
            raise PrecisionMismatchError(
                f"npubridge.mindspore: {op} differs from MindSpore's own operator at element {worst}: "
                f"{m['got']!r} vs {m['reference']!r} (float64), error {m['abs_error']:.3g} > bound {m['bound']:.3g}")
    return np.zeros((1,), np.float32)


def _judge_bprop(got, ref, host, code, precision, out, dout):
    return (ops.zeros_like(got), ops.zeros_like(ref), ops.zeros_like(host), ops.zeros_like(code),
            ops.zeros_like(precision))


_JUDGE = ops.Custom(judge, out_shape=lambda *shapes: [1], out_dtype=lambda *dtypes: ms.float32,
                    func_type="pyfunc", bprop=_judge_bprop)


def _judged(name, out, ref, host):
    flag = _JUDGE(ops.cast(out, ms.float64), ops.cast(ref, ms.float64), ops.cast(host, ms.float64),
                  Tensor(_op_code(name), ms.int32), Tensor(_bits(out.dtype), ms.int32))
    return ops.depend(out, flag)


def check1(name, out, native, a):
    ref = native(ops.cast(a, ms.float64))
    return _judged(name, out, ref, native(a))


def check2(name, out, native, a, b):
    ref = native(ops.cast(a, ms.float64), ops.cast(b, ms.float64))
    return _judged(name, out, ref, native(a, b))


def check3(name, out, native, a, b, c):
    ref = native(ops.cast(a, ms.float64), ops.cast(b, ms.float64), ops.cast(c, ms.float64))
    return _judged(name, out, ref, native(a, b, c))
