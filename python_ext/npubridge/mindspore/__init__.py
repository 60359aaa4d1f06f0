"""npubridge.mindspore: MindSpore operators on npubridge's plugins, through
the same dispatcher as PyTorch's (a second host framework).

    import npubridge.mindspore as ms_adapter
    ms_adapter.enable()                 # MindSpore's operators go to the plugins
    ms_adapter.set_optim_level("O3")    # which plugin kernels are eligible
    net = nn.SequentialCell(nn.Dense(512, 1024), nn.ReLU(), nn.Dense(1024, 256))

enable() replaces MindSpore's functional operators (mindspore.ops.matmul,
add, relu, softmax, rms_norm, flash_attention_score, ...) and the construct
of its layers (nn.Dense, nn.ReLU, nn.LayerNorm, ...) with routed
ones; disable() puts MindSpore's back. Each routed call asks the dispatcher
which kernel serves it (_routes.py, Note [The routing decision runs in
Python, before the call]) and runs it through libnpub_mindspore.so as an
ops.Custom(func_type="aot") op (mindspore_host/), or MindSpore's own
operator when no kernel does. Works in PyNative and GRAPH_MODE; every routed
op has a bprop through the plugins' derivative kernels.
"""
import warnings

from . import _library
from ._routes import STATE, changed

__all__ = ["enable", "disable", "is_enabled", "set_optim_level", "get_optim_level", "register_op",
           "auto_convert_dtype", "precision_check", "precision_mismatches", "last_error", "stats", "reset_stats", "routes",
           "AdamW"]

# "O0".."O3": the dispatcher's optimisation level (docs/mindspore.md has the table).
_LEVELS = {"O0": 0, "O1": 1, "O2": 2, "O3": 3}
_active_table = None  # the mapping table in use (a copy of _table.TABLE, changed by register_op)
_functions = {}  # functional name -> routed function, for the table in use
_missing = {}


def _check_type(fn, arg, value, types, expected):
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        raise TypeError(f"npubridge.mindspore.{fn}(): expected {arg} to be {expected}, "
                        f"but found {type(value).__name__} {value!r}")


def _build():
    global _active_table, _functions, _missing
    from . import _table as table_module
    _library.start()
    if _active_table is None:
        _active_table = dict(table_module.TABLE)
    _functions, _missing = table_module.build(_active_table)


def _warm_numpy_bridge():
    """MindSpore 2.10's wheel is built against NumPy 1.x; under NumPy 2 the
    first Tensor operator of a process raises (the second works). Taken by
    enable(), so that it is not a user's first `x * y`. Not at import: the
    first operator starts MindSpore's runtime, after which
    mindspore.set_device() refuses to run."""
    import mindspore as ms
    try:
        ms.Tensor([1.0]) * 1
    except Exception:  # noqa: BLE001  (the one failure this absorbs)
        pass


def enable():
    """Routes MindSpore's operators to the plugins (idempotent). Call it after
    mindspore.set_device(): it runs one MindSpore operator."""
    from . import _patches
    _warm_numpy_bridge()
    if not _functions:
        _build()
    _patches.install(_functions)
    STATE.enabled = True
    changed()


def disable():
    """Puts MindSpore's own operators and layers back (idempotent)."""
    from . import _patches
    _patches.uninstall()
    STATE.enabled = False
    changed()


def is_enabled() -> bool:
    return STATE.enabled


def set_optim_level(level: str):
    """"O0" (no plugin kernel: MindSpore's own operators), "O1" (basic
    operators: MatMul, elementwise, activations, Softmax, LayerNorm), "O2"
    (also the fused operators: RMSNorm, SwiGLU, rotary embedding, flash
    attention, AdamW; the default), "O3" (also kernels that trade precision
    for speed)."""
    _check_type("set_optim_level", "level", level, str, '"O0", "O1", "O2" or "O3"')
    if level not in _LEVELS:
        raise ValueError(f'npubridge.mindspore.set_optim_level(): expected level to be "O0", "O1", "O2" or "O3", '
                         f"but found {level!r}")
    _library.start()
    _library.set_opt_level(_LEVELS[level])
    changed()


def get_optim_level() -> str:
    _library.start()
    return f"O{_library.opt_level()}"


def auto_convert_dtype(on: bool = True):
    """float16/bfloat16 calls of an op whose kernels take float32 only are
    served by them through the dispatcher's conversion (on, the default), or
    fall back to MindSpore's own operator (off)."""
    _check_type("auto_convert_dtype", "on", on, bool, "a bool")
    _library.start()
    _library.set_dtype_conversion(on)
    changed()


def precision_check(on: bool = True, raise_on_mismatch: bool = False):
    """Judges every routed call compiled or run from now on against
    MindSpore's own operator (_precision.py's error model); mismatches go to
    precision_mismatches(), or raise with raise_on_mismatch. Operators with
    no kernel in MindSpore's CPU build (RMSNorm, SwiGLU, rotary, flash
    attention) are not judged."""
    _check_type("precision_check", "on", on, bool, "a bool")
    _check_type("precision_check", "raise_on_mismatch", raise_on_mismatch, bool, "a bool")
    STATE.precision_check = on
    STATE.raise_on_mismatch = raise_on_mismatch
    changed()


def last_error() -> str:
    """The message of the last plugin call that failed ("" if none). MindSpore
    reports only that a custom op failed; this says which op and why (it is
    also printed to stderr)."""
    _library.start()
    return _library.last_call_error()


def precision_mismatches():
    """The mismatches found so far (dicts: op, index, got, reference,
    abs_error, bound, elements), after the queued operators ran."""
    _sync()
    with STATE.lock:
        return list(STATE.mismatches)


def _sync():
    """Waits for the operators PyNative has queued (it runs them on a
    pipeline of its own), so that statistics count every call made.
    (mindspore.runtime.synchronize() is for Ascend devices; on the CPU it
    logs an error and returns.)"""
    from mindspore.graph.api import _pynative_executor
    _pynative_executor.sync()


def stats():
    """{"routed": {MindSpore op: decisions for a plugin}, "fallbacks":
    {MindSpore op: decisions for MindSpore's own operator}, "fallback_reasons":
    {op: reason}, "kernels": {registry op: {plugin: calls}}, "conversions":
    {registry op: calls served through the dtype conversion}, "not_routed":
    {MindSpore op: why no route exists}}. Decisions count calls under
    PyNative and compilations under GRAPH_MODE; kernels count calls."""
    _sync()
    kernels, conversions = {}, {}
    for entry in _library.dispatcher_stats():
        for k in entry["kernels"]:
            kernels.setdefault(entry["op"], {})[k["plugin"]] = k["calls"]
        if entry["conversions"]:
            conversions[entry["op"]] = entry["conversions"]
    with STATE.lock:
        return {"routed": dict(STATE.routed), "fallbacks": dict(STATE.fallbacks),
                "fallback_reasons": dict(STATE.fallback_reasons), "kernels": kernels, "conversions": conversions,
                "not_routed": dict(_missing)}


def reset_stats():
    _sync()
    _library.reset_dispatcher_stats()
    with STATE.lock:
        STATE.routed.clear()
        STATE.fallbacks.clear()
        STATE.fallback_reasons.clear()
        STATE.mismatches.clear()
        STATE.warned.clear()


def routes():
    """The mapping table in use: {MindSpore op: registry op}."""
    from . import _table as table_module
    return {name: entry[0] for name, entry in (_active_table or table_module.TABLE).items()}


def register_op(ms_op: str, plugin_op: str):
    """Serves MindSpore operator `ms_op` (a name of routes()) with registry op
    `plugin_op`. The target must take the arguments the route passes, in
    order (its layout, checked token by token against the target's schema),
    and make the outputs it reads; raises ValueError naming both and what
    differs, and changes nothing then."""
    global _active_table, _functions, _missing
    from . import _table as table_module
    _check_type("register_op", "ms_op", ms_op, str, "a MindSpore operator name (str)")
    _check_type("register_op", "plugin_op", plugin_op, str, "a registry op name (str)")
    table = _active_table or dict(table_module.TABLE)
    remappable = sorted(n for n, entry in table.items() if entry[1] is not None and n not in _FIXED_ROUTES)
    if ms_op not in remappable:
        raise ValueError(f"npubridge.mindspore.register_op(): expected ms_op to be one of {', '.join(remappable)}, "
                         f"but found {ms_op!r}")
    _library.start()
    schema = _library.schema(plugin_op)
    if schema is None:
        raise ValueError(f"npubridge.mindspore.register_op(): cannot map {ms_op} to '{plugin_op}': no loaded plugin "
                         "defines it")
    _, layout, outputs = table[ms_op]
    try:  # the binding's own check: each token against the schema's argument
        _library.check_layout(plugin_op, layout, outputs)
    except _library.NpuError as err:
        raise ValueError(f"npubridge.mindspore.register_op(): cannot map {ms_op} "
                         f"(from '{table[ms_op][0]}') to '{plugin_op}': {err} ({schema})") from None
    table = dict(table)
    table[ms_op] = (plugin_op, layout, outputs)
    _library.start()
    functions, missing = table_module.build(table)  # before anything changes: it may raise
    _active_table, _functions, _missing = table, functions, missing
    if STATE.enabled:
        enable()


# Routes whose layouts the adapter builds per call form (flash attention's
# layouts and mask) or whose caller is not a MindSpore operator (the
# optimizer): not remapped by register_op.
_FIXED_ROUTES = ("FlashAttentionScore", "AdamW")


from ._optim import AdamW  # noqa: E402
