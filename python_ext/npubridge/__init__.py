"""npubridge: PyTorch on a (simulated) NPU through acceleration-library plugins.

``import npubridge`` renames PyTorch's PrivateUse1 backend to ``npu`` and
registers ``torch.npu``. At the first npu use the runtime starts (devices,
plugins) and every ATen op a loaded plugin implements is routed to
npubridge's dispatcher; other ops fall back to the CPU (one warning per op;
``NPUB_FALLBACK=error`` makes that an error).
"""


def _autoload():
    """Entry point of the `torch.backends` group: `import torch` alone loads
    npubridge once it is installed (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns
    that off). Defined before `import torch`: when npubridge is imported
    first, torch's autoload finds it on the partially initialised module."""


import torch  # noqa: E402

from . import _C  # noqa: E402

torch.utils.rename_privateuse1_backend("npu")
# The hooks and allocators PyTorch asks for; the runtime itself (devices,
# threads, plugins) starts at the first npu use, from the NPUB_* settings as
# they are then (Note [The runtime starts at the first npu use],
# python_ext/csrc/init.cpp).
_C._register_backend()

from . import npu as _npu  # noqa: E402

torch._register_device_module("npu", _npu)

from . import _dlpack  # noqa: E402

_dlpack.install()

from . import _ipc  # noqa: E402

_ipc.install()

from . import _autograd  # noqa: E402
from . import _sdpa  # noqa: E402

_sdpa.install()
sdpa_stats = _sdpa.sdpa_stats
reset_sdpa_stats = _sdpa.reset_sdpa_stats


def _on_start():
    """The Python side of the runtime's start, run once by the C++ start
    after the plugin ops are registered with PyTorch: autograd for the
    plugin ops from their derivative formulas, then what torch.npu queued
    before the start (seeds). Never raises: one op's formula or pattern must
    not leave the device half started."""
    import warnings

    try:
        _autograd.register_all()
    except Exception as err:  # noqa: BLE001
        warnings.warn(f"npubridge: autograd for the plugin ops was not registered: {err}", RuntimeWarning)
    _npu._run_queued_calls()


_C._set_start_hook(_on_start)

# Note [A plugin op lookup starts the runtime]
# Plugin ops are defined under torch.ops.<namespace> when the runtime starts
# (the plugins load then). `torch.ops.myplug.axpy(x.to("npu"))` looks the op
# up before its argument makes the first npu tensor, so a lookup that finds
# no op starts the runtime and looks again. Not when torch itself asks:
# torch.library.define probes torch.ops with hasattr for every op a library
# defines (torch._dynamo's import does), which would start the runtime in
# nearly every program; nor for ATen's and the prims' namespaces, which
# hold no plugin-only op, nor for dunder names.
_NO_PLUGIN_OPS = frozenset({"aten", "prim", "prims", "_prims", "quantized", "_quantized", "profiler"})


def _install_op_lookup_start():
    import sys

    namespace = torch._ops._OpNamespace
    lookup = namespace.__getattr__

    def __getattr__(self, op_name):
        try:
            return lookup(self, op_name)
        except AttributeError:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if (op_name.startswith("__") or self.name in _NO_PLUGIN_OPS or _C._is_started() or caller == "torch"
                    or caller.startswith("torch.")):
                raise
            _npu._lazy_init()  # a bad setting raises its error here, naming the variable
            return lookup(self, op_name)

    namespace.__getattr__ = __getattr__


_install_op_lookup_start()

from . import distributed  # noqa: E402,F401  (registers the torch.distributed backend "npu")
from . import _after_import  # noqa: E402


def _npu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "npu" (npubridge._compile.backend.npu_backend)."""
    from ._compile import backend

    return backend.npu_backend(gm, example_inputs, **kwargs)


def _set_up_dynamo():
    # torch.compile(backend="npu") and get_interface_for_device("npu"):
    # registered when torch._dynamo is imported (Note [Dynamo is set up
    # when it is imported]). torch._dynamo may be imported from inside
    # another of PyTorch's imports (torch._inductor's): this touches only
    # the modules torch._dynamo's own import has loaded, and graph mode
    # itself is imported at the first compile.
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "npu" not in _BACKENDS:
        register_backend(_npu_backend, name="npu")
    from . import _dynamo_interface

    _dynamo_interface.register()


_after_import.when_imported("torch._dynamo", _set_up_dynamo)

_GRAPH_MODE_NAMES = ("compile", "compile_report", "register_fusion_pattern")


def __getattr__(name):
    # npubridge.compile and its siblings import graph mode (and so
    # torch._dynamo) at their first use.
    if name in _GRAPH_MODE_NAMES:
        from . import _compile

        return getattr(_compile, name)
    raise AttributeError(f"module 'npubridge' has no attribute {name!r}")


def _quiesce_at_exit():
    # PyTorch's autograd engine runs npu backward passes on a device thread
    # that releases the graph after handing the result back; if the
    # interpreter finalises meanwhile, that thread needs the GIL during
    # shutdown and the process aborts ("terminate called without an active
    # exception"). Give it a moment to finish before finalisation.
    import time

    if not _C._is_started():
        return  # no device ever ran
    if _npu._is_in_bad_fork():
        return  # the device threads stayed with the parent
    try:
        _C.synchronize(-1)
    finally:
        time.sleep(0.05)


import atexit  # noqa: E402

atexit.register(_quiesce_at_exit)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

__all__ = [
    "plugins", "load_failures", "load_skipped", "stats", "reset_stats", "set_optim_level", "enable_plugin", "disable_plugin",
    "register_op", "unregister_op", "op_map", "precision_check", "precision_mismatches", "routed_ops",
    "sdpa_stats", "reset_sdpa_stats", "compile", "compile_report", "register_fusion_pattern",
]


def plugins():
    """Loaded plugins: name, version, path, number of ops, enabled."""
    return _C.plugins()


def load_failures():
    """The plugins the loader rejected, each as "plugin '<path>' rejected: <reason>"."""
    return list(_C.load_failures())


def load_skipped():
    """Libraries of a plugin directory that are not plugins (no npub_plugin_init_v1),
    each as "'<path>' skipped: not an npubridge plugin (no npub_plugin_init_v1)"."""
    return list(_C.load_skipped())


def stats():
    """Per op: calls, native calls per plugin, fallbacks, conversions, time."""
    return _C.stats()


def reset_stats():
    _C.reset_stats()


# Bumped by every setting that changes which kernels exist (the level, a
# plugin's enable state): graph mode checks it per call and recompiles a graph
# whose fused ops the new settings no longer serve (_compile/specialize.py).
_settings_epoch = [0]


def set_optim_level(level: int):
    """0: no plugin kernels; 1: basic ops; 2: fused ops (default); 3: all."""
    _C.set_optim_level(int(level))
    _settings_epoch[0] += 1


def enable_plugin(name: str):
    _C.enable_plugin(name, True)
    _settings_epoch[0] += 1


def disable_plugin(name: str):
    _C.enable_plugin(name, False)
    _settings_epoch[0] += 1


import re as _re  # noqa: E402

_OP_NAME = _re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


def _check_type(function, argument, value, expected_type, expected):
    # bool is an int, and 1 or "yes" would silently read as True: a bool
    # argument takes a bool only.
    ok = isinstance(value, str) if expected_type is str else type(value) is expected_type
    if not ok:
        raise TypeError(f"{function}(): expected {argument} to be {expected} but found {type(value).__name__} "
                        f"{value!r}")


def _check_op_name(function, argument, value):
    _check_type(function, argument, value, str, "an op name (str)")
    if not _OP_NAME.fullmatch(value):
        found = "an empty string" if value == "" else repr(value)
        raise ValueError(f"{function}(): expected {argument} to be an op name 'namespace::name' or "
                         f"'namespace::name.overload' (such as 'aten::tan' or 'aten::sin.out') but found {found}")


def register_op(framework_op: str, target_op: str, plugin: str = ""):
    """Serve the PyTorch op `framework_op` (e.g. "aten::tan") with the kernels
    of the registry op `target_op`, `plugin`'s first when given.

    Any op PyTorch knows can be mapped, bridged or not: its next call on an
    npu tensor reaches `target_op`. The target must accept the framework op's
    arguments: the same types in order (then only arguments with a default),
    the same returns; or, for a functional op, its arguments then one out=
    tensor per return (an .out op). Raises ValueError naming both ops and
    what differs otherwise, or for an unknown op or plugin; TypeError for an
    argument that is not a str, ValueError for a malformed op name."""
    _check_op_name("register_op", "framework_op", framework_op)
    _check_op_name("register_op", "target_op", target_op)
    _check_type("register_op", "plugin", plugin, str, "a plugin name (str, \"\" for any)")
    if plugin:
        loaded = [p["name"] for p in _C.plugins()]
        if plugin not in loaded:
            raise ValueError(f"register_op(): expected plugin to be a loaded plugin ({', '.join(loaded) or 'none'}) "
                             f"or \"\" but found {plugin!r}")
    _C.register_op(framework_op, target_op, plugin)


def unregister_op(framework_op: str):
    """Remove the mapping of `framework_op`: its calls take their previous
    route (its own kernel, or the CPU fallback). Raises ValueError when it is
    not mapped."""
    _C.unregister_op(framework_op)


def op_map():
    """The op-mapping table: (framework op, target op, plugin or "") tuples."""
    return _C.op_map()


def precision_check(enabled: bool = True, raise_on_mismatch: bool = False):
    """Check every plugin call against PyTorch's CPU kernel of the same op.

    While enabled, each plugin call (eager, in place or not, or a compiled
    program's kernel step; not inside a graph capture) also runs through
    ATen's CPU kernel of the same op on CPU copies of its inputs taken
    before the kernel ran, in the op's dtype and in float64; returns and
    written arguments are judged by the error model npub-conformance uses
    (docs/plugin-authoring.md, "How your kernels are judged"): within the
    final rounding of the float64 result for elementwise ops, within
    K * u * sum|terms| for ops that sum K terms, exact for copies,
    selections and integer results. NaN and inf must match. Mismatches are
    logged, counted in stats() and listed by precision_mismatches() (with
    the bound and its derivation); with raise_on_mismatch the call raises
    instead. A plugin's own op (no ATen kernel to compare with) and a random
    op (its reference would draw other numbers) are named once in
    npubridge's log as not judged. Mismatches are listed under the
    registry op the kernel serves (aten::neg.out for -x). Slow: for finding
    a wrong kernel, not for production. Both
    arguments must be bools (TypeError otherwise: "yes" or None would read
    as True or False)."""
    _check_type("precision_check", "enabled", enabled, bool, "a bool")
    _check_type("precision_check", "raise_on_mismatch", raise_on_mismatch, bool, "a bool")
    _C.precision_check(enabled, raise_on_mismatch)


def precision_mismatches():
    """Mismatches found since precision_check() was last called: per entry op,
    plugin, output, mismatched/numel elements, worst element and message."""
    return _C.precision_mismatches()


def routed_ops():
    """Ops served by plugins, for reading: ATen ops served natively
    ("native"), through a plugin's .out kernel ("via_out": "op -> target"),
    plugins' own ops ("custom"), and the op-mapping table ("mapped":
    "framework op -> target op"). The typed table behind it is
    ``npubridge._C.routes()`` (each entry's op, kind, target and origin)."""
    out = {"native": [], "via_out": [], "custom": [], "mapped": []}
    for r in _C.routes():
        if r.origin == "mapped":
            out["mapped"].append(f"{r.op} -> {r.target}")
        elif r.origin == "custom":
            out["custom"].append(r.op)
        elif r.kind == "direct":
            out["native"].append(r.op)
        else:
            out["via_out"].append(f"{r.op} -> {r.target}")
    return out
