"""How one MindSpore operator reaches a plugin kernel: a slot of
libnpub_mindspore.so bound to a registry op (a `Binding`, with the
ops.Custom op that names the slot), the routing decision taken before each
call, and the adapter's own settings and counters.

Note [The routing decision runs in Python, before the call]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Whether a plugin kernel serves a call (the op's kernels at the optimisation
level, the dtypes they take, the dtype conversion) is the dispatcher's
answer to Dispatcher::plan, asked through `served()` with the call's dtypes,
shapes and scalar values. `served()` is a MindSpore constexpr: under
PyNative it runs at each call; under GRAPH_MODE it runs once, while the
graph is compiled, and the branch not taken is folded away. So a graph
compiled with the adapter enabled keeps its routing until it is compiled
again (as a torch.compile graph keeps the kernels it was traced with). When
no kernel serves the call, the routed function calls MindSpore's own
operator: the fallback is the framework's implementation, reached through
the framework, with one warning per operator and reason.
"""
import collections
import functools
import threading
import warnings

import mindspore as ms
from mindspore import ops
from mindspore.ops.primitive import constexpr

from . import _library

DTYPE_NAMES = {
    ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16", ms.float64: "float64",
    ms.int8: "int8", ms.int16: "int16", ms.int32: "int32", ms.int64: "int64", ms.uint8: "uint8",
    ms.bool_: "bool",
}
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
# PyTorch's ScalarType numbers, which ATen-style schemas' ScalarType arguments take.
TORCH_SCALAR_TYPE = {ms.float16: 5, ms.float32: 6, ms.float64: 7, ms.bfloat16: 15}


class _State:
    """The adapter's settings and counters (one per process)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.enabled = False
        self.generation = 0  # moves when a setting that changes routing does
        self.precision_check = False
        self.raise_on_mismatch = False
        self.mismatches = []
        self.routed = collections.Counter()  # MindSpore op -> routing decisions that chose a plugin
        self.fallbacks = collections.Counter()  # MindSpore op -> decisions that chose MindSpore's own op
        self.fallback_reasons = {}  # MindSpore op -> the last reason
        self.warned = set()


STATE = _State()


def changed():
    """A setting that changes routing moved: decisions are taken anew."""
    with STATE.lock:
        STATE.generation += 1
    _decide.cache_clear()


class Binding:
    """Slot `slot` bound to registry op `target` with `layout` and `outputs`
    (mindspore_host/src/binding.h's grammar), and the Custom op naming it.
    `shape_fn(*input_shapes)` and `dtype_fn(*input_dtypes)` give the outputs
    (a list for several), as ops.Custom asks; `bprop` its backward."""

    def __init__(self, op_name, target, layout, outputs, shape_fn, dtype_fn, bprop=None):
        self.op_name = op_name
        self.target = target
        self.slot = _library.bind(target, layout, outputs)
        self.shape_fn = shape_fn
        self.dtype_fn = dtype_fn
        kwargs = {"bprop": bprop} if bprop is not None else {}
        self.prim = ops.Custom(f"{_library.path()}:npub_ms_slot_{self.slot}", out_shape=shape_fn,
                               out_dtype=dtype_fn, func_type="aot", **kwargs)
        self.prim.add_prim_attr("npubridge_op", target)


_BINDINGS = []  # by key: a Binding's key is its index here, a constant a graph can hold


def register(binding: Binding) -> int:
    _BINDINGS.append(binding)
    return len(_BINDINGS) - 1


def binding(key: int) -> Binding:
    return _BINDINGS[key]


def _name(dtype):
    return DTYPE_NAMES.get(dtype, str(dtype).lower())



@functools.lru_cache(maxsize=4096)
def _decide(key, generation, settings, dtypes, shapes, scalars):
    b = _BINDINGS[key]
    in_shapes = [list(s) for s in shapes]
    out_shapes = b.shape_fn(*in_shapes)
    out_dtypes = b.dtype_fn(*[NAME_DTYPES.get(d, ms.float32) for d in dtypes])
    if not (isinstance(out_shapes, (list, tuple)) and out_shapes and isinstance(out_shapes[0], (list, tuple))):
        out_shapes, out_dtypes = [out_shapes], [out_dtypes]
    all_shapes = in_shapes + [list(s) for s in out_shapes]
    all_dtypes = list(dtypes) + [_name(d) for d in out_dtypes]
    all_scalars = list(scalars) + [None] * len(out_shapes)
    served, plugin, conversion, reason = _library.plan(b.slot, all_shapes, all_dtypes, all_scalars)
    return served, plugin, conversion, reason


def decide(key, dtypes, shapes, scalars=None):
    """(served, plugin, conversion, reason) for a call of binding `key` on
    inputs of these MindSpore dtypes and shapes (scalars: the 0-d inputs'
    values by position, None elsewhere). Counts the decision; warns once per
    operator and reason when MindSpore's own operator serves it."""
    unknown = [d for d in dtypes if d not in DTYPE_NAMES]
    names = tuple(_name(d) for d in dtypes)
    dynamic = any(d is None or d < 0 for s in shapes for d in s)
    shapes = tuple(tuple(-1 if d is None else int(d) for d in s) for s in shapes)
    scalars = tuple(scalars) if scalars is not None else (None,) * len(names)
    b = _BINDINGS[key]
    if not STATE.enabled:
        served, plugin, conversion, reason = False, "", "", "the adapter is disabled"
    elif unknown:
        served, plugin, conversion, reason = False, "", "", f"dtype {unknown[0]} has no npubridge counterpart"
    elif dynamic:  # a custom op's outputs are declared from static shapes
        served, plugin, conversion, reason = False, "", "", "a dynamic shape (the plugin call declares its outputs)"
    else:
        # The dispatcher's own settings are part of the key: PyTorch's
        # npubridge.set_optim_level changes them too, without changed().
        settings = (_library.opt_level(), _library.dtype_conversion())
        try:
            served, plugin, conversion, reason = _decide(key, STATE.generation, settings, names, shapes, scalars)
        except _library.NpuError as err:
            raise ValueError(str(err)) from None
    if served:
        with STATE.lock:
            STATE.routed[b.op_name] += 1
    elif fallback(b.op_name, reason) and STATE.enabled:
        warnings.warn(f"npubridge.mindspore: {b.op_name} ({b.target}) runs MindSpore's own operator: {reason}",
                      RuntimeWarning, stacklevel=3)
    return served, plugin, conversion, reason


def fallback(op_name, reason):
    """Counts a call handed to MindSpore's own operator; True the first time
    for this operator and reason (the one warning's turn)."""
    with STATE.lock:
        STATE.fallbacks[op_name] += 1
        STATE.fallback_reasons[op_name] = reason
        first = (op_name, reason) not in STATE.warned
        STATE.warned.add((op_name, reason))
    return first


@constexpr
def served(key, dtypes, shapes, scalars=None):
    """The routing decision as a MindSpore constant (Note [The routing
    decision runs in Python, before the call])."""
    return decide(key, dtypes, shapes, scalars)[0]


@constexpr
def checking():
    """Whether calls compiled now are checked against MindSpore's own operator."""
    return STATE.precision_check


@constexpr
def not_routed(op_name, reason):
    """Counts a call whose arguments no route takes (a Python number
    operand, MindSpore's type promotion, ...), before any binding is asked."""
    fallback(op_name, reason)
    return True
