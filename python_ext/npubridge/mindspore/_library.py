"""libnpub_mindspore.so through ctypes: its slots (Note [One exported function
per slot], mindspore_host/src/binding.h), the routing question and the
dispatcher's settings and statistics.

The library sits beside the core library: <package>/lib in the wheel,
<build>/lib for the package staged in a build tree (<build>/python/npubridge).
"""
import ctypes
import functools
import json
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
_NAME = "libnpub_mindspore.so"


@functools.lru_cache(maxsize=None)
def path() -> str:
    """The library's file: what ops.Custom(f"{path}:npub_ms_slot_<i>") names."""
    candidates = (_PACKAGE / "lib" / _NAME, _PACKAGE.parent.parent / "lib" / _NAME)
    for c in candidates:
        if c.is_file():
            return str(c)
    raise FileNotFoundError(f"npubridge.mindspore: no {_NAME} in {' or '.join(str(c.parent) for c in candidates)}: "
                            "this npubridge is neither an installed wheel nor a build tree")


@functools.lru_cache(maxsize=None)
def _lib():
    lib = ctypes.CDLL(path())
    c_int, c_char_p, c_double_p = ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double)
    i64pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_int64))
    int_p, char_pp = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)
    lib.npub_ms_last_error.restype = c_char_p
    lib.npub_ms_bind.argtypes = [c_char_p, c_char_p, c_char_p]
    lib.npub_ms_check_layout.argtypes = [c_char_p, c_char_p, c_char_p]
    c_double_pp = ctypes.POINTER(ctypes.c_double)
    lib.npub_ms_judge.argtypes = [c_char_p, ctypes.c_int64, c_double_pp, c_double_pp, c_double_pp, c_double_pp]
    lib.npub_ms_last_call_error.argtypes = [c_char_p, c_int]
    lib.npub_ms_plan.argtypes = [c_int, c_int, int_p, i64pp, char_pp, c_double_p,
                                 c_char_p, c_int, c_char_p, c_int, c_char_p, c_int]
    lib.npub_ms_schema.argtypes = [c_char_p, c_char_p, c_int]
    lib.npub_ms_stats_json.argtypes = [c_char_p, c_int]
    lib.npub_ms_plugins_json.argtypes = [c_char_p, c_int]
    return lib


class NpuError(RuntimeError):
    """An error the npubridge core reported (its message names the op)."""


def _check(rc: int) -> int:
    if rc < 0:
        raise NpuError(_lib().npub_ms_last_error().decode())
    return rc


def start():
    """Starts the runtime (devices, plugins) if it is not running."""
    _check(_lib().npub_ms_start())


def bind(op: str, layout: str, outputs: str) -> int:
    """Binds the next free slot; returns its number."""
    return _check(_lib().npub_ms_bind(op.encode(), layout.encode(), outputs.encode()))


def check_layout(op: str, layout: str, outputs: str):
    """Raises NpuError when bind() would refuse these, binding nothing."""
    _check(_lib().npub_ms_check_layout(op.encode(), layout.encode(), outputs.encode()))


def judge(dtype: str, got, reference, host):
    """None when `got` is within npubridge's error bound of the float64
    `reference` (calibrated by `host`, the computation in `dtype`), else
    (index, got, reference, error, bound, mismatched) of the worst element.
    The arrays are float64 numpy arrays of one size."""
    import numpy as np
    arrays = [np.ascontiguousarray(a, dtype=np.float64).ravel() for a in (got, reference, host)]
    ptrs = [a.ctypes.data_as(ctypes.POINTER(ctypes.c_double)) for a in arrays]
    worst = (ctypes.c_double * 6)()
    if _check(_lib().npub_ms_judge(dtype.encode(), arrays[0].size, *ptrs, worst)) == 1:
        return None
    return int(worst[0]), worst[1], worst[2], worst[3], worst[4], int(worst[5])


def last_call_error() -> str:
    """The message of the last AOT call that failed, from any thread ("" if none)."""
    buf = ctypes.create_string_buffer(4096)
    _lib().npub_ms_last_call_error(buf, 4096)
    return buf.value.decode()


def _tensor_args(shapes, dtypes, scalars):
    n = len(shapes)
    ndims = (ctypes.c_int * n)(*[len(s) for s in shapes])
    rows = [(ctypes.c_int64 * max(len(s), 1))(*s) for s in shapes]
    shape_ptrs = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(r, ctypes.POINTER(ctypes.c_int64)) for r in rows])
    names = (ctypes.c_char_p * n)(*[d.encode() for d in dtypes])
    values = (ctypes.c_double * n)(*[float(v) if v is not None else 0.0 for v in scalars])
    return n, ndims, shape_ptrs, names, values, rows


def plan(slot: int, shapes, dtypes, scalars):
    """(served, plugin, conversion, reason) of slot's call on tensors of these
    shapes and dtypes (inputs then outputs); `scalars`: the 0-d inputs' values
    by position (None elsewhere). Raises NpuError for arguments the op rejects."""
    n, ndims, shape_ptrs, names, values, _keep = _tensor_args(shapes, dtypes, scalars)
    bufs = [ctypes.create_string_buffer(512) for _ in range(3)]
    rc = _check(_lib().npub_ms_plan(slot, n, ndims, shape_ptrs, names, values,
                                    bufs[0], 512, bufs[1], 512, bufs[2], 512))
    return rc == 1, bufs[0].value.decode(), bufs[1].value.decode(), bufs[2].value.decode()


def schema(op: str):
    """The printed schema of a registry op, or None when no plugin defines it."""
    buf = ctypes.create_string_buffer(4096)
    if _lib().npub_ms_schema(op.encode(), buf, 4096) < 0:
        return None
    return buf.value.decode()


def _json(fn):
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        need = _check(fn(buf, size))
        if need <= size:
            return json.loads(buf.value.decode())
        size = need


def dispatcher_stats():
    return _json(_lib().npub_ms_stats_json)


def reset_dispatcher_stats():
    _check(_lib().npub_ms_reset_stats())


def plugins():
    return _json(_lib().npub_ms_plugins_json)


def set_opt_level(level: int):
    _check(_lib().npub_ms_set_opt_level(level))


def opt_level() -> int:
    return _check(_lib().npub_ms_opt_level())


def set_dtype_conversion(on: bool):
    _check(_lib().npub_ms_set_dtype_conversion(1 if on else 0))


def dtype_conversion() -> bool:
    return bool(_check(_lib().npub_ms_dtype_conversion()))
