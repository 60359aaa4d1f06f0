"""The patch manager: rebinds framework functions and methods to fused
versions, by dotted name, and puts every original back on removal.

In MindSpeed's spirit: ``register_patch(dotted_name, new)`` records a
replacement, ``apply_patches()`` binds them all, ``remove_patches()``
restores. Rebinding the attribute alone would miss the copies other modules
made with ``from x import f``; those are found by identity (every module in
sys.modules whose attribute *is* the original object) and rebound too, and
unpatching restores each of them.

A ``new`` whose ``__name__`` ends in ``wrapper`` or ``decorator`` is not a
replacement but a function of the current object returning the new one
(``new(original) -> patched``): several may wrap one name, applied in
registration order over the replacement if there is one. The fused
versions here are all wrappers, so the original stays reachable (in a
closure, never a module global that the identity scan could rebind) for
the inputs the fused kernels do not take.

A dotted name is a module path followed by attributes: classes, functions,
or mapping keys (``...AttentionInterface._global_mapping.sdpa`` sets the
dict entry ``'sdpa'``).
"""
import contextlib
import importlib
import sys
import types

__all__ = [
    "register_patch", "apply_patches", "remove_patches", "registered_patches", "clear_patches", "PatchManager",
    "PatchError", "Feature", "patch", "unpatch", "patched", "features"
]

_MISSING = object()
_OWN_PACKAGE = __name__.rsplit(".", 1)[0]  # npubridge.mindspeed: never rebound by the scan


class PatchError(RuntimeError):
    pass


def _is_wrapper(fn):
    name = getattr(fn, "__name__", "")
    return name.endswith("wrapper") or name.endswith("decorator")


class _Patch:
    def __init__(self, dotted_name, create_dummy):
        self.dotted_name = dotted_name
        self.create_dummy = create_dummy
        self.replacement = None
        self.wrappers = []
        self.applied = None  # an _Applied while bound


class _Applied:
    """What apply did for one name, so that remove can undo exactly that."""

    def __init__(self, holder, key, original, had_own, patched, created):
        self.holder, self.key, self.original, self.had_own = holder, key, original, had_own
        self.patched, self.created = patched, created
        self.copies = []  # (module, attribute name) rebound from original to patched


def _dummy(name):
    def dummy(*args, **kwargs):
        raise NotImplementedError(f"{name} is a placeholder created by npubridge.mindspeed's patch manager "
                                  f"(create_dummy=True); the framework does not define it")

    dummy.__name__ = dummy.__qualname__ = name.rsplit(".", 1)[-1]
    return dummy


def _resolve(dotted_name, create_dummy):
    """(holder, key, current value or _MISSING, created modules)."""
    parts = dotted_name.split(".")
    module, i, created = None, 0, []
    for n in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        try:
            module = importlib.import_module(".".join(parts[:n]))
            i = n
            break
        except ImportError:
            continue
    if module is None:
        if not create_dummy:
            raise PatchError(f"cannot patch {dotted_name}: module {parts[0]} cannot be imported")
        module, i = None, 0
    holder = module
    for n in range(i, len(parts) - 1):
        part = parts[n]
        child = _get(holder, part) if holder is not None else _MISSING
        if child is _MISSING:
            if not create_dummy:
                raise PatchError(f"cannot patch {dotted_name}: {'.'.join(parts[:n])} has no {part}")
            child = types.ModuleType(".".join(parts[:n + 1]))
            if holder is None:
                sys.modules[child.__name__] = child
            else:
                _set(holder, part, child)
            created.append((holder, part, child))
        holder = child
    return holder, parts[-1], _get(holder, parts[-1]), created


def _get(holder, key):
    if isinstance(holder, dict):
        return holder.get(key, _MISSING)
    return getattr(holder, key, _MISSING)


def _set(holder, key, value):
    if isinstance(holder, dict):
        holder[key] = value
    else:
        setattr(holder, key, value)


def _own(holder, key):
    # A class attribute may be inherited: restoring it means deleting the
    # subclass's own binding, not copying the base's value into the subclass.
    if isinstance(holder, dict):
        return key in holder
    if isinstance(holder, type):
        return key in holder.__dict__
    return True


def _delete(holder, key):
    if isinstance(holder, dict):
        del holder[key]
    else:
        delattr(holder, key)


def _scannable(obj):
    # Only callables (functions, classes) are looked for by identity: a
    # shared small int or interned string could be anyone's.
    return callable(obj)


def _module_items():
    for name, module in list(sys.modules.items()):
        if module is None or name == _OWN_PACKAGE or name.startswith(_OWN_PACKAGE + "."):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        yield module, namespace


class PatchManager:
    """A registry of patches by dotted name. The module-level functions use
    one shared instance; npubridge.mindspeed.patch() keeps its own, so that
    unpatch() leaves patches a user registered alone."""

    def __init__(self):
        self._patches = {}  # dotted name -> _Patch, in registration order

    def register_patch(self, dotted_name, new, force_patch=False, create_dummy=False):
        """Records that ``dotted_name`` is to become ``new`` on ``apply_patches()``.

        A ``new`` named ``*wrapper`` / ``*decorator`` wraps the current object
        (any number per name). A second replacement of the same name is an error
        unless ``force_patch``, which replaces the first. ``create_dummy``
        creates the target (and missing modules on its path) when it does not
        exist, instead of failing at apply time; removal deletes what it created.
        """
        if not isinstance(dotted_name, str) or "." not in dotted_name:
            raise ValueError(f"register_patch(): expected dotted_name to be 'module.attribute' but found {dotted_name!r}")
        if not callable(new):
            raise TypeError(f"register_patch(): expected new to be callable but found {type(new).__name__}")
        entry = self._patches.get(dotted_name)
        if entry is None:
            entry = self._patches[dotted_name] = _Patch(dotted_name, create_dummy)
        entry.create_dummy = entry.create_dummy or create_dummy
        if entry.applied is not None:
            raise PatchError(f"register_patch(): {dotted_name} is applied; remove_patches() before changing it")
        if _is_wrapper(new):
            entry.wrappers.append(new)
        elif entry.replacement is not None and entry.replacement is not new and not force_patch:
            raise PatchError(f"register_patch(): {dotted_name} already has a replacement "
                             f"({entry.replacement.__qualname__}); pass force_patch=True to replace it")
        else:
            entry.replacement = new

    def registered_patches(self):
        """Dotted names registered, each with whether it is applied."""
        return {name: p.applied is not None for name, p in self._patches.items()}

    def clear_patches(self):
        """Forgets every registration (after removing those applied)."""
        self.remove_patches()
        self._patches.clear()

    def apply_patches(self):
        """Binds every registered patch not applied yet, with the copies made by
        ``from x import f``. Raises PatchError (having bound nothing new) when a
        target cannot be found and was not registered with create_dummy."""
        pending = [p for p in self._patches.values() if p.applied is None]
        resolved = []
        for p in pending:
            holder, key, original, created = _resolve(p.dotted_name, p.create_dummy)
            if original is _MISSING:
                if not p.create_dummy:
                    for h, k, _ in reversed(created):
                        _delete(h, k)
                    raise PatchError(f"cannot patch {p.dotted_name}: it does not exist (register it with "
                                     f"create_dummy=True to create it)")
                created.append((holder, key, None))
            resolved.append((p, holder, key, original, created))
        by_identity = {}
        for p, holder, key, original, created in resolved:
            had_own = original is not _MISSING and _own(holder, key)
            current = _dummy(p.dotted_name) if original is _MISSING else original
            new = p.replacement if p.replacement is not None else current
            for wrap in p.wrappers:
                new = wrap(new)
            _set(holder, key, new)
            p.applied = _Applied(holder, key, original, had_own, new, created)
            if original is not _MISSING and _scannable(original):
                by_identity[id(original)] = (original, p.applied)
        if by_identity:
            for module, namespace in _module_items():
                for attr, value in list(namespace.items()):
                    hit = by_identity.get(id(value))
                    if hit is not None and hit[0] is value:
                        setattr(module, attr, hit[1].patched)
                        hit[1].copies.append((module, attr))

    def remove_patches(self):
        """Restores every applied patch: the attribute, each copy rebound, and
        any copy made from the patched object since (``from x import f`` after
        apply); deletes what create_dummy created."""
        applied = [p for p in reversed(list(self._patches.values())) if p.applied is not None]
        by_identity = {}
        for p in applied:
            a = p.applied
            for module, attr in a.copies:
                if getattr(module, attr, _MISSING) is a.patched:
                    setattr(module, attr, a.original)
            if a.original is not _MISSING:
                if a.had_own:
                    _set(a.holder, a.key, a.original)
                elif _get(a.holder, a.key) is a.patched:
                    _delete(a.holder, a.key)
                if _scannable(a.patched):
                    by_identity[id(a.patched)] = a
            for holder, key, _ in reversed(a.created):
                if holder is None:
                    sys.modules.pop(key, None)
                elif _get(holder, key) is not _MISSING:
                    _delete(holder, key)
            p.applied = None
        if by_identity:
            for module, namespace in _module_items():
                for attr, value in list(namespace.items()):
                    a = by_identity.get(id(value))
                    if a is not None and a.patched is value:
                        setattr(module, attr, a.original)


_default = PatchManager()
register_patch = _default.register_patch
apply_patches = _default.apply_patches
remove_patches = _default.remove_patches
registered_patches = _default.registered_patches
clear_patches = _default.clear_patches


# --- Features: named groups of patches with an optimisation level ---------

LEVELS = (0, 1, 2)


class Feature:
    """A named optimisation: the (dotted name, wrapper) pairs it registers,
    its level (patch(level=n) enables every feature of level <= n) and the
    mindspeed_like ops it needs (without them it is skipped, with the reason)."""

    def __init__(self, name, level, description, targets, ops=(), modules=("transformers", )):
        self.name, self.level, self.description = name, level, description
        self.targets, self.ops, self.modules = list(targets), list(ops), list(modules)

    def unavailable(self):
        """Why the feature cannot be applied, or None."""
        import importlib.util

        from . import functional

        for module in self.modules:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed"
        for op in self.ops:
            reason = functional.missing_reason(op)
            if reason is not None:
                return reason
        return None


class _FeatureState:
    def __init__(self):
        self.features = {}  # name -> Feature, in definition order
        self.manager = PatchManager()
        self.enabled = []
        self.skipped = {}  # name -> reason, from the last patch()


_state = _FeatureState()


def define_features(features):
    """Adds Features (transformers_patches.FEATURES at import)."""
    for f in features:
        if f.level not in LEVELS:
            raise ValueError(f"feature {f.name}: expected a level in {LEVELS} but found {f.level!r}")
        _state.features[f.name] = f


def _select(features, level):
    if type(level) is not int or level not in LEVELS:
        raise ValueError(f"patch(): expected level to be one of {', '.join(map(str, LEVELS))} but found {level!r}")
    known = list(_state.features)
    if features is None:
        return [n for n in known if _state.features[n].level <= level], False
    names = [features] if isinstance(features, str) else list(features)
    for n in names:
        if not isinstance(n, str) or n not in _state.features:
            raise ValueError(f"patch(): unknown feature {n!r}; the features are {', '.join(known)}")
        if _state.features[n].level > level:
            raise ValueError(f"patch(): feature {n!r} has level {_state.features[n].level}, above level={level}")
    return [n for n in known if n in names], True


def patch(features=None, level=2):
    """Swaps the fused versions into transformers' Llama and Qwen2.

    ``features=None`` enables every feature of level <= ``level`` (0: none,
    1: rms_norm and rotary, 2: also swiglu, flash_attention and add_rms_norm); a name or a
    list of names enables exactly those. A feature whose kernels are missing
    is skipped with a warning when chosen by level, and is an error when
    named. Replaces what an earlier patch() applied. Patched code takes the
    fused path only on npu tensors. Returns the names enabled.
    """
    names, named = _select(features, level)
    plan, skipped = [], {}
    for n in names:
        reason = _state.features[n].unavailable()
        if reason is None:
            plan.append(n)
        elif named:
            raise RuntimeError(f"patch(): feature {n!r} cannot be enabled: {reason}")
        else:
            skipped[n] = reason
    unpatch()
    for n in plan:
        for dotted_name, new in _state.features[n].targets:
            _state.manager.register_patch(dotted_name, new)
    try:
        _state.manager.apply_patches()
    except Exception:
        _state.manager.clear_patches()
        raise
    _state.enabled, _state.skipped = plan, skipped
    if skipped:
        import warnings

        warnings.warn("npubridge.mindspeed.patch(): skipped " + "; ".join(f"{n}: {r}" for n, r in skipped.items()),
                      RuntimeWarning, stacklevel=2)
    return list(plan)


def unpatch():
    """Restores everything patch() replaced, including rebound copies."""
    _state.manager.clear_patches()
    _state.enabled, _state.skipped = [], {}


@contextlib.contextmanager
def patched(features=None, level=2):
    """``with patched(...):`` patch() inside the block, the previous state after."""
    before = list(_state.enabled)
    patch(features, level)
    try:
        yield list(_state.enabled)
    finally:
        if before:
            patch(before)
        else:
            unpatch()


def features():
    """Every feature: name, level, enabled, what it replaces, description, and
    the reason it cannot be enabled (None when it can)."""
    return [{
        "name": f.name,
        "level": f.level,
        "enabled": f.name in _state.enabled,
        "replaces": [t for t, _ in f.targets],
        "description": f.description,
        "unavailable": f.unavailable(),
    } for f in _state.features.values()]
