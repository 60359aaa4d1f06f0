"""The precision check: each routed call's result judged against MindSpore's
own operator, in PyNative and in GRAPH_MODE alike.

The judgement is npubridge's one comparator (numerics::compare,
dispatcher/include/npubridge/dispatcher/error_bound.h, Note [The error
model]) under its model for an op without an entry, kHostCalibrated,
reached through libnpub_mindspore.so: the reference is MindSpore's
operator run in float64 on the same inputs, `host` the same operator in the
call's dtype, and the bound is derived from both and the output dtype. The judge is a pyfunc Custom op placed beside the
routed op (ops.depend keeps it in a compiled graph), so a GRAPH_MODE graph
compiled while the check is on checks every run.
"""
import numpy as np

import mindspore as ms
from mindspore import Tensor, ops

from . import _library
from ._routes import DTYPE_NAMES, STATE

_FLOATING = (ms.float32, ms.float16, ms.bfloat16, ms.float64)  # by code, the judge's dtype input
_OP_NAMES = []


class PrecisionMismatchError(RuntimeError):
    """A plugin result outside the error bound, with raise_on_mismatch."""


@ms.constexpr
def _op_code(name):
    if name not in _OP_NAMES:
        _OP_NAMES.append(name)
    return _OP_NAMES.index(name)


@ms.constexpr
def _dtype_code(dtype):
    return _FLOATING.index(dtype) if dtype in _FLOATING else 0


def judge(got, ref, host, code, dtype_code):
    """Compares, records a mismatch (STATE.mismatches); returns a dummy."""
    verdict = _library.judge(DTYPE_NAMES[_FLOATING[int(dtype_code)]], got, ref, host)
    if verdict is not None:
        worst, value, reference, error, bound, mismatched = verdict
        op = _OP_NAMES[int(code)]
        m = {"op": op, "index": worst, "got": value, "reference": reference, "abs_error": error, "bound": bound,
             "elements": mismatched}
        with STATE.lock:
            STATE.mismatches.append(m)
        if STATE.raise_on_mismatch:
            raise PrecisionMismatchError(
                f"npubridge.mindspore: {op} differs from MindSpore's own operator at element {worst}: "
                f"{m['got']!r} vs {m['reference']!r} (float64), error {m['abs_error']:.3g} > bound {m['bound']:.3g}")
    return np.zeros((1,), np.float32)


def _judge_bprop(got, ref, host, code, dtype_code, out, dout):
    return (ops.zeros_like(got), ops.zeros_like(ref), ops.zeros_like(host), ops.zeros_like(code),
            ops.zeros_like(dtype_code))


_JUDGE = ops.Custom(judge, out_shape=lambda *shapes: [1], out_dtype=lambda *dtypes: ms.float32,
                    func_type="pyfunc", bprop=_judge_bprop)


def _judged(name, out, ref, host):
    flag = _JUDGE(ops.cast(out, ms.float64), ops.cast(ref, ms.float64), ops.cast(host, ms.float64),
                  Tensor(_op_code(name), ms.int32), Tensor(_dtype_code(out.dtype), ms.int32))
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
