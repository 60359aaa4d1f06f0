"""Runs npubridge's set-up for a module of PyTorch's when that module is
imported, not when npubridge is.

Note [Dynamo is set up when it is imported]: graph mode needs two things
registered with torch._dynamo: the backend "npu" (torch.compile(...,
backend="npu")) and the npu's device interface. Importing torch._dynamo to
register them cost `import npubridge` 1.8 s of its 2.9 s, in every process
that imports torch once the package is installed (torch's device-backend
autoload imports npubridge), though most never compile. So
``when_imported("torch._dynamo", hook)`` runs the hook at once if
torch._dynamo is already imported, and otherwise right after its import
finishes: a one-shot finder at the front of sys.meta_path hands back
torch._dynamo's own spec with a loader that runs the module, then the hooks.
Every way in reaches it (torch.compile, ``import torch._dynamo``, a
library's import of a submodule, which imports the package first). A hook
that raises does not break torch._dynamo's import: it is reported as a
RuntimeWarning naming the hook, and what it registers is missing.
"""
import importlib.abc
import importlib.util
import sys
import warnings

_pending = {}  # module name -> [hooks] to run after its import


def _run(name, hooks):
    for hook in hooks:
        try:
            hook()
        except Exception as err:  # noqa: BLE001 - reported, the import goes on
            warnings.warn(f"npubridge: set-up for {name} ({hook.__module__}.{hook.__qualname__}) failed: "
                          f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)


class _Loader(importlib.abc.Loader):
    def __init__(self, name, loader):
        self._name, self._loader = name, loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader  # as if we were never here
        self._loader.exec_module(module)
        hooks = _pending.pop(self._name, [])
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _run(self._name, hooks)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _pending:
            return None
        # The other finders find the real spec: this one answers None for
        # the name while it is not pending. The hooks run when the module
        # is executed, not here (a find_spec that only probes runs none).
        hooks = _pending.pop(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            _pending[name] = hooks
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(name, spec.loader)
        return spec


_finder = _Finder()


def when_imported(name, hook):
    """Runs ``hook()`` once ``name`` is imported: now, if it is."""
    module = sys.modules.get(name)
    if module is not None:
        # Imported, or being imported (this runs from inside its import):
        # as before this module existed, register now.
        _run(name, [hook])
        return
    _pending.setdefault(name, []).append(hook)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
