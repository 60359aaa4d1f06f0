"""Per-shape specialisation of a Dynamo graph with symbolic shapes.

Note [Dynamic graphs are compiled per concrete shape]: with torch.compile's
default ``dynamic=None``, Dynamo's automatic dynamic shapes turn the second
input shape into a graph whose sizes are symbols (SymInt graph inputs,
tensors of symbolic shape). The lowering serves static shapes only (the
memory plan and every resolved call take their sizes from node.meta), so
such a graph would run as FX, node by node. Instead the backend returns a
``PerShape`` callable: at each call it looks up the concrete shape
signature of the inputs (sizes, strides, dtypes of the tensors, values of
the ints) and, the first time it sees one, runs the whole static pipeline
(pre-dispatch trace, patterns, AOTAutograd, lowering) on those concrete
inputs, with the graph's int inputs bound as constants. Later calls with
that signature reuse it. Dynamo still guards the graph once (no recompile
storm); each shape costs one compile, as ``dynamic=False`` would, and each
is its own entry of compile_report.

Note [A settings change recompiles]: a rewrite puts fused plugin ops into
the graph (npu_rms_norm ...), which exist only at optimisation level 2 and
while their plugin is enabled, and have no host implementation. Dynamo
cannot guard npubridge's settings, so the backend's callable does: it keeps
the settings the graph was compiled under and, when they differ at a call
(``npubridge.set_optim_level``, ``disable_plugin``), compiles the graph
again for the call's inputs under the new ones (the patterns then skip the
ops that are gone), cached per settings and shape.
"""
import copy
import threading

import torch


def is_symbolic(example_inputs):
    """Whether Dynamo's example inputs carry symbols (a dynamic graph)."""
    for v in example_inputs:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset())):
            return True
    return False


def _signature(args):
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), tuple(a.stride()), a.storage_offset(), a.dtype, a.device, a.requires_grad))
        else:
            sig.append(("value", type(a), a))
    return tuple(sig)


def bind_scalars(gm, args):
    """A copy of ``gm`` whose non-tensor inputs are replaced by the values in
    ``args`` (the concrete sizes of this call), and the tensor inputs kept."""
    gm = copy.deepcopy(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise RuntimeError(f"npu backend: the Dynamo graph has {len(placeholders)} inputs but was called with "
                           f"{len(args)}")
    for node, value in zip(placeholders, args):
        if isinstance(value, torch.Tensor):
            continue
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, n=node, v=value: v if a is n else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=node, v=value: v if a is n else a)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


_settings_cache = [None, None]  # (epoch, settings)


def settings():
    """What the compiled graph's kernels depend on beyond the shapes: the
    optimisation level and the enabled plugins (fused ops exist at level 2
    and in their plugin only). Recomputed when npubridge's settings epoch
    moves, so a call pays one comparison."""
    import npubridge

    epoch = npubridge._settings_epoch[0]
    if _settings_cache[0] != epoch:
        enabled = tuple(sorted(p["name"] for p in npubridge.plugins() if p.get("enabled")))
        _settings_cache[:] = [epoch, (npubridge._C.optim_level(), enabled)]
    return _settings_cache[1]


class PerShape:
    """The callable the backend returns (Note [Dynamic graphs are compiled
    per concrete shape], Note [A settings change recompiles]).
    ``compile_static(gm, tensors)`` is the backend's static pipeline; it
    returns the compiled callable of the specialised graph. ``first`` is the
    static graph's compiled callable (Dynamo guards its shapes), valid under
    ``first_settings``; None for a symbolic graph."""

    def __init__(self, gm, compile_static, first=None, first_settings=None):
        self.gm, self._compile_static = gm, compile_static
        self.first, self.first_settings = first, first_settings
        self._cache = {}
        self._lock = threading.Lock()  # two threads seeing a new shape compile it once

    def __call__(self, *args):
        now = settings()
        if self.first is not None and now == self.first_settings:
            return self.first(*args)
        key = (now, _signature(args))
        fn = self._cache.get(key)
        if fn is None:
            with self._lock:
                fn = self._cache.get(key)
                if fn is None:
                    tensors = [a for a in args if isinstance(a, torch.Tensor)]
                    fn = torch._dynamo.disable(self._compile_static)(bind_scalars(self.gm, args), tensors)
                    self._cache[key] = fn
        return fn(*[a for a in args if isinstance(a, torch.Tensor)])
