"""Fusion patterns: match subgraphs of a pre-dispatch ATen FX graph and
rewrite them to plugin fused ops.

Patterns are data (docs/graph-mode.md, "Fusion patterns"): the parsed dicts
of ``npubridge._C._fusion_patterns()`` (plugins contribute them through the
C ABI; the host through ``register_fusion_pattern``), plus the variants
below that the pre-dispatch graph of real models needs. This file only
interprets them.

Note [A rewrite is checked before it fires]: a match is rewritten only when
(0) the pattern's ``where`` lines hold (Note [Where conditions]),
(1) the replacement op exists and an npu kernel of it takes the dtype,
(2) its meta function, run on the matched values' fake tensors, gives the
shape and dtype of every value it replaces, and (3) when the graph records
autograd (a training step) the op has a derivative formula. Otherwise the
match is skipped and counted with the reason: the unfused subgraph stays,
which is always right.

Note [Extra outputs]: a fused op can also replace a value of the match
besides the last node's (npu_add_rms_norm returns the residual sum as well
as the norm). A pattern dict lists these under "extra_outputs" ([{"name":
"s", "ret": 2}]: return 2 replaces the value bound to %s; in the text form a
line ``=> %s <- [2]`` after the replacement). Such a node may have users
outside the match; every other node but the last may not, except:

Note [No-op casts are looked through]
Pre-dispatch tracing keeps ``aten.to.dtype`` calls that change nothing
(HF's RMSNorm casts to float32 in float32 models), and later code then
uses the cast's value where the model used the source (the same tensor
object). A matched cast whose target dtype is its input's dtype (and keeps
shape and device) may keep outside users when its source is a pattern
input or output: they are redirected to the source (or the source's
replacement), which is the same value. A cast that changes the dtype is
never looked through: under type promotion its users can have the source's
dtype again (``f32 * n.to(bfloat16)`` is float32) while the cast's
rounding is gone.

Note [Where conditions]: a pattern's ``where`` lines (the dict's "where"
list) compare shapes, dtypes and captures of the matched values
(``%gamma.dim() == 1``, ``$dtype == %x.dtype``); they are checked on
``node.meta["val"]`` before anything else, and a match failing one is
skipped with the line as the reason.

Note [The fused op goes where the output was]: the replacement is inserted
just before the pattern's output node (its last node in graph order), so it
reads every input at the point the subgraph finished reading them, and
every user of the output still comes after it; an extra output's users must
come after it too, else the match is skipped. The pre-dispatch graph is not
functional: it keeps in-place ops (a write through a view, ``y[..., 0] =
0`` is select + copy_, leaves later uses pointing at y's node) and
grad-mode / autocast switches (``torch._C._set_grad_enabled``). A match
whose span, from its first to its last node in graph order, holds a node
outside the match that mutates anything (a schema that is mutable or
writes an argument) or any call that is not an ATen op (a mode switch) is
skipped: fusing would move its reads across that node.
"""
import contextlib
import functools
import logging
import operator

import torch
from torch._guards import detect_fake_mode

from .. import _C
from . import builtin_patterns

_COMMUTATIVE = {"aten::add.Tensor", "aten::mul.Tensor"}


def _dtype_name(dtype):
    """torch.float32 -> "float32": torch's spelling is npubridge's
    (support/dtype.h), so no table of its own."""
    return str(dtype).removeprefix("torch.")


def register(text):
    """Adds a host pattern in the text form (through the C++ parser)."""
    if not hasattr(_C, "_register_fusion_pattern"):
        raise RuntimeError("register_fusion_pattern(): this build has no fusion pattern table "
                           "(npubridge._C._register_fusion_pattern)")
    _C._register_fusion_pattern(text)


def all_patterns():
    """The patterns in the order they are tried: higher priority first, then
    registration order. One table, the C++ one: the plugins' patterns and
    npubridge's own host patterns (builtin_patterns.py, registered as text
    here, once: the table is the runtime's, which starts at the first npu
    use, and a bad NPUB_* setting raises its error here)."""
    builtin_patterns.register_host_patterns()
    table = list(_C._fusion_patterns())
    return [p for _, p in sorted(enumerate(table), key=lambda ip: (-ip[1].get("priority", 0), ip[0]))]


# Matching.

def _op_name(target):
    return target.name() if isinstance(target, torch._ops.OpOverload) else None


def _value_op(node):
    """The op whose value the node is (a getitem's: its call's)."""
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        return _op_name(node.args[0].target)
    return _op_name(node.target) if node.op == "call_function" else None


@functools.lru_cache(maxsize=None)
def _multi_return(op):
    try:
        return len(_resolve_op(op)._schema.returns) > 1
    except _Skip:
        return False


_CASTS = ("aten::to.dtype", "aten::_to_copy")


def _is_noop_cast(node):
    """Note [No-op casts are looked through]: the cast's target dtype is its
    input's dtype (and shape and device stay)."""
    if _op_name(node.target) not in _CASTS or not isinstance(node.args[0], torch.fx.Node):
        return False
    a, b = node.args[0].meta.get("val"), node.meta.get("val")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if _op_name(node.target) == "aten::to.dtype":
        target = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    else:  # _to_copy: dtype None keeps the input's
        target = node.kwargs.get("dtype")
        target = a.dtype if target is None else target
    return target == a.dtype and b.dtype == a.dtype and a.shape == b.shape and a.device == b.device


def _full_args(node):
    """The node's arguments in schema order, defaults filled in, and how many
    the call passed explicitly."""
    schema = node.target._schema
    out = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out.append((node.args[i], True))
        elif arg.name in node.kwargs:
            out.append((node.kwargs[arg.name], True))
        else:
            out.append((arg.default_value if arg.has_default_value() else None, False))
    return out, schema.arguments


def _const_equal(a, b):
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_const_equal(x, y) for x, y in zip(a, b)))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def _is_default(value, schema_arg):
    if not schema_arg.has_default_value():
        return False
    return _const_equal(value, schema_arg.default_value) or (value is None and schema_arg.default_value is None)


class _Matcher:
    def __init__(self, pattern):
        self.pattern = pattern
        self.by_out = {n["out"]: n for n in pattern["nodes"]}

    def match(self, node):
        """Bindings {name: FX value} and the matched nodes {out: FX node}, or None."""
        for bind, nodes in self._node(self.pattern["nodes"][-1], node, {}, {}):
            return bind, nodes
        return None

    def _node(self, pnode, node, bind, nodes):
        if pnode["out"] in nodes:
            if nodes[pnode["out"]] is node:
                yield bind, nodes
            return
        item = node
        if _multi_return(pnode["op"]):  # the line's value is return `ret`: an FX getitem of the call
            if not (isinstance(node, torch.fx.Node) and node.target is operator.getitem
                    and node.args[1] == pnode.get("ret", 0)):
                return
            node = node.args[0]
        if not isinstance(node, torch.fx.Node) or node.op != "call_function" or _op_name(node.target) != pnode["op"]:
            return
        extra = {pnode["out"] + "#call": node} if item is not node else {}
        full, schema_args = _full_args(node)
        pargs = pnode["args"]
        if len(pargs) > len(full):
            return
        # Arguments the line does not list: absent or their default.
        for (value, given), sarg in zip(full[len(pargs):], schema_args[len(pargs):]):
            if given and not _is_default(value, sarg):
                return
        orders = [list(range(len(pargs)))]
        if pnode["op"] in _COMMUTATIVE and len(pargs) >= 2:
            orders.append([1, 0] + list(range(2, len(pargs))))
        for order in orders:
            values = [full[i][0] for i in order]
            yield from self._args(pargs, values, dict(bind), {**nodes, pnode["out"]: item, **extra})

    def _args(self, pargs, values, bind, nodes):
        if not pargs:
            yield bind, nodes
            return
        for b, n in self._arg(pargs[0], values[0], bind, nodes):
            yield from self._args(pargs[1:], values[1:], b, n)

    def _arg(self, parg, value, bind, nodes):
        kind = parg["kind"]
        if kind == "any":
            yield bind, nodes
        elif kind == "const":
            if _const_equal(value, parg["value"]) or (value is None and parg["value"] is None):
                yield bind, nodes
        elif kind == "capture":
            if not isinstance(value, torch.fx.Node):
                name = parg["name"]
                if name not in bind or _const_equal(bind[name], value):
                    yield {**bind, name: value}, nodes
        elif kind == "list":
            if isinstance(value, (list, tuple)) and len(value) == len(parg["items"]):
                yield from self._args(parg["items"], list(value), bind, nodes)
        elif kind == "value":
            name = parg["name"]
            if name in self.by_out:
                yield from self._node(self.by_out[name], value, bind, nodes)
            elif name not in bind:
                yield {**bind, name: value}, nodes
            elif bind[name] is value:
                yield bind, nodes


# Checking and rewriting.

class _Skip(Exception):
    pass


def _resolve_op(name):
    ns, rest = name.split("::", 1)
    base, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except (AttributeError, RuntimeError):
        raise _Skip(f"the replacement op {name} is not registered (its plugin is not loaded)") from None


def _npu_dtypes():
    """op -> set of dtype names some enabled plugin's npu kernel takes."""
    enabled = {p["name"] for p in _C.plugins() if p["enabled"]}
    table = {}
    for k in _C.ops(""):
        if k["plugin"] in enabled:
            table.setdefault(k["op"], set()).update(d.strip() for d in k["dtypes"].replace(",", " ").split())
    return table


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """A meta function rejecting a candidate is an expected outcome (the
    match is skipped with its message): keep FakeTensorMode from logging
    it as an error."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _grad_nodes(gm, requires_grad):
    """The nodes whose value autograd records: reached from an input that
    requires grad (the traced metas do not carry requires_grad)."""
    marked = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, rg in zip(placeholders, requires_grad):
        if rg:
            marked.add(n)
    for n in gm.graph.nodes:
        if n.op == "call_function" and any(a in marked for a in n.all_input_nodes):
            marked.add(n)
    return marked


def _term_value(term, bind):
    """The value of one side of a ``where`` line (Note [Where conditions])."""
    kind = term["kind"]
    if kind == "const":
        return term["value"]
    if kind == "dtype_name":
        return getattr(torch, term["name"])
    if kind == "capture":
        return bind[term["name"]]
    val = _val(bind[term["name"]])
    if not isinstance(val, torch.Tensor):
        raise _Skip(f"%{term['name']} is not a tensor")
    if kind == "dim":
        return val.dim()
    if kind == "dtype":
        return val.dtype
    if kind == "size":
        d = term["dim"]
        if not -val.dim() <= d < val.dim():
            raise _Skip(f"%{term['name']} has {val.dim()} dims, no dim {d}")
        return int(val.shape[d])
    raise ValueError(f"where-term of unknown kind {kind!r}")


def _show(v):
    return _dtype_name(v) if isinstance(v, torch.dtype) else repr(v)


def _check_conditions(pattern, bind):
    """None, or the first ``where`` line the match fails, as the reason."""
    for w in pattern.get("where", []):
        try:
            a, b = _term_value(w["lhs"], bind), _term_value(w["rhs"], bind)
        except _Skip as why:
            return f"where {w['text']}: {why}"
        if isinstance(a, torch.dtype) or isinstance(b, torch.dtype):
            same = a == b
        else:
            same = _const_equal(a, b) or (a is None and b is None)
        if same != (w["op"] == "=="):
            return f"where {w['text']} does not hold ({_show(a)} {w['op']} {_show(b)} is false)"
    return None


def _mutates(node):
    """Whether the node writes anything or switches a mode (Note [The fused
    op goes where the output was]): conservative for anything but ATen ops
    and getitem."""
    if node.op in ("placeholder", "get_attr", "output"):
        return False
    if node.op != "call_function":
        return True
    if node.target is operator.getitem:
        return False
    if not isinstance(node.target, torch._ops.OpOverload):
        return True
    schema = node.target._schema
    return schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _target_name(node):
    t = node.target
    return _op_name(t) or getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)


class _Rewriter:
    def __init__(self, gm, requires_grad):
        self.gm = gm
        self.graph = gm.graph
        vals = [n.meta.get("val") for n in self.graph.nodes]
        self.fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
        self.kernels = _npu_dtypes()
        self.derivatives = {d["op"] for d in _C.derivatives()}
        self.erased = set()
        self.grad_nodes = _grad_nodes(gm, requires_grad) if torch.is_grad_enabled() else set()

    def _check_call(self, call, bind):
        """Fake-run a replacement CALL on the bound values' metas: the fake
        result, after the kernel, dtype and autograd checks (Note [A rewrite
        is checked before it fires])."""
        op = _resolve_op(call["op"])
        args = [self._check_arg(a, bind) for a in call["args"]]
        if not call["op"].startswith("aten::"):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            dtype = tensors[0].dtype if tensors else None
            taken = self.kernels.get(call["op"])
            if taken is None:
                raise _Skip(f"{call['op']} has no npu kernel in an enabled plugin")
            if dtype is not None and _dtype_name(dtype) not in taken:
                raise _Skip(f"{call['op']} has no npu kernel for {dtype} (takes {', '.join(sorted(taken))})")
            if _C.optim_level() < 2:
                raise _Skip("the optimisation level is below 2 (fused ops off)")
            if any(n in self.grad_nodes for n in bind.values() if isinstance(n, torch.fx.Node)) \
                    and call["op"] not in self.derivatives:
                raise _Skip(f"{call['op']} has no derivative formula and the graph is trained")
        try:
            with self.fake_mode, _quiet_fake_tensor_log():
                out = op(*args)
        except Exception as err:  # noqa: BLE001 - the meta function rejecting the call is a reason to skip
            raise _Skip(f"{call['op']} rejects the matched values: {str(err).splitlines()[0]}") from None
        return out

    def _check_arg(self, arg, bind):
        kind = arg["kind"]
        if kind == "value":
            return _val(bind[arg["name"]])
        if kind == "capture":
            return bind[arg["name"]]
        if kind == "const":
            return arg["value"]
        if kind == "list":
            return [self._check_arg(a, bind) for a in arg["items"]]
        if kind == "size":
            return int(_val(bind[arg["name"]]).shape[arg["dim"]])
        if kind == "call":
            out = self._check_call(arg, bind)
            return out[arg.get("ret", 0)] if isinstance(out, (tuple, list)) else out
        raise ValueError(f"pattern argument of unknown kind {kind!r}")

    def _emit(self, arg, bind):
        kind = arg["kind"]
        if kind == "value":
            return bind[arg["name"]]
        if kind == "capture":
            return bind[arg["name"]]
        if kind == "const":
            return arg["value"]
        if kind == "list":
            return [self._emit(a, bind) for a in arg["items"]]
        if kind == "size":
            return int(_val(bind[arg["name"]]).shape[arg["dim"]])
        return self._emit_call(arg, bind)[arg.get("ret", 0)]

    def _emit_call(self, call, bind):
        """The call's node and a per-return accessor (getitem nodes)."""
        op = _resolve_op(call["op"])
        node = self.graph.call_function(op, tuple(self._emit(a, bind) for a in call["args"]))
        with self.fake_mode:
            node.meta["val"] = op(*[_val_tree(a) for a in node.args])
        if any(a in self.grad_nodes for a in node.all_input_nodes):
            self.grad_nodes.add(node)  # and its getitems (_Returns)
        return _Returns(self.graph, node, self.grad_nodes)

    def try_rewrite(self, pattern, bind, nodes):
        """Rewrites one match; returns None, or the reason it was skipped."""
        why = _check_conditions(pattern, bind)
        if why is not None:
            return why
        last = nodes[pattern["nodes"][-1]["out"]]
        extra = [(nodes.get(o["name"]), o["ret"]) for o in pattern.get("extra_outputs", [])]
        if any(n is None for n, _ in extra):
            return f"pattern {pattern['name']}: an extra output is not a node of the pattern"
        want = [(last, pattern["replacement"].get("ret", 0))] + extra
        outputs = {n for n, _ in want}
        matched = set(nodes.values())
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        inputs = {v for v in bind.values() if isinstance(v, torch.fx.Node)}
        looked_through = {}  # Note [No-op casts are looked through]: cast -> its source
        for n in sorted(matched - outputs, key=order.__getitem__):
            outside = [u for u in n.users if u not in matched]
            if not outside:
                continue
            source = n.args[0] if _is_noop_cast(n) else None
            if source is None or not (source in inputs or source in outputs):
                return f"{n.name} has users outside the match ({outside[0].name})"
            looked_through[n] = source
        try:
            out = self._check_call(pattern["replacement"], bind)
        except _Skip as why:
            return str(why)
        for node, ret in want:
            got = out[ret] if isinstance(out, (tuple, list)) else out
            have = node.meta.get("val")
            if not isinstance(got, torch.Tensor) or not isinstance(have, torch.Tensor):
                return f"{pattern['replacement']['op']} return {ret}: not a tensor where {node.name} is"
            if got.shape != have.shape or got.dtype != have.dtype:
                return (f"{pattern['replacement']['op']} return {ret} is {got.dtype}{list(got.shape)} where "
                        f"{node.name} is {have.dtype}{list(have.shape)}")
        # Note [The fused op goes where the output was].
        first = min(matched, key=order.__getitem__)
        end = max(matched, key=order.__getitem__)
        for n in self.graph.nodes:
            if order[first] < order[n] < order[end] and n not in matched and _mutates(n):
                return (f"{n.name} ({_target_name(n)}) between the matched nodes mutates or switches a mode: "
                        "the fused op would move across it")
        replaced = outputs | {c for c, src in looked_through.items() if src in outputs}
        early = [u for node in replaced for u in node.users if u not in matched and order[u] < order[end]]
        if early:
            return f"{early[0].name} uses a replaced value before the pattern's output"
        ret_of = dict(want)
        with self.graph.inserting_before(end):  # nodes keep the order they are made in
            returns = self._emit_call(pattern["replacement"], bind)
            for node, ret in want:
                node.replace_all_uses_with(returns[ret])
            for cast, source in looked_through.items():
                new = returns[ret_of[source]] if source in outputs else source
                cast.replace_all_uses_with(new, delete_user_cb=lambda u: u not in matched)
        for n in sorted(matched, key=order.__getitem__, reverse=True):
            if not n.users:
                self.graph.erase_node(n)
                self.erased.add(n)
        return None


def _val_tree(a):
    if isinstance(a, (list, tuple)):
        return [_val_tree(x) for x in a]
    return _val(a)


class _Returns:
    """Return k of a call node: the node itself for a single return, else a
    getitem node (made once)."""

    def __init__(self, graph, node, grad_nodes):
        self.graph, self.node, self.items, self.grad_nodes = graph, node, {}, grad_nodes

    def __getitem__(self, k):
        if not isinstance(self.node.meta["val"], (tuple, list)):
            return self.node
        if k not in self.items:  # inside the caller's inserting_before: after the call node
            item = self.graph.call_function(operator.getitem, (self.node, k))
            item.meta["val"] = self.node.meta["val"][k]
            if self.node in self.grad_nodes:
                self.grad_nodes.add(item)
            self.items[k] = item
        return self.items[k]


def rewrite(gm, enabled=True, requires_grad=()):
    """Rewrites every match of the patterns in ``gm`` (in place).
    ``requires_grad``: per placeholder, whether its input requires grad.

    ``enabled``: True (all), False (none) or a collection of pattern names.
    Returns {"fired": {name: count}, "skipped": {name: {reason: count}}}."""
    result = {"fired": {}, "skipped": {}}
    if enabled is False:
        return result
    rw = _Rewriter(gm, requires_grad)
    for pattern in all_patterns():
        if enabled is not True and pattern["name"] not in enabled:
            continue
        matcher = _Matcher(pattern)
        last_op = pattern["nodes"][-1]["op"]
        for node in list(gm.graph.nodes):
            if node in rw.erased or _value_op(node) != last_op:
                continue
            found = matcher.match(node)
            if found is None:
                continue
            why = rw.try_rewrite(pattern, *found)
            if why is None:
                result["fired"][pattern["name"]] = result["fired"].get(pattern["name"], 0) + 1
            else:
                reasons = result["skipped"].setdefault(pattern["name"], {})
                reasons[why] = reasons.get(why, 0) + 1
    gm.graph.lint()
    gm.recompile()
    return result
