"""Lowering an ATen FX graph (what AOTAutograd hands its compilers) to a
program of npubridge's C++ execution loop (python_ext/csrc/compile/).

``lower(gm, example_inputs) -> Compiled``. Each node is resolved once, here:

- a view op (its schema's first return aliases an argument without writing
  it: aten.view, aten.t, aten._unsafe_view, aten.expand, ...) becomes a
  view slot: sizes, strides and storage offset from ``node.meta["val"]``;
- an op a plugin serves becomes a kernel step, by the route the eager
  bridge takes (``npubridge._C.routes()``): the op itself, or its
  ``.out`` form with the outputs passed as out=; the dispatcher resolves it
  once (kernel, dtype conversion) with ``Dispatcher::resolve``;
- a deterministic factory with no tensor inputs whose value does not leave
  the graph (aten.full, aten.scalar_tensor, ...) is made once: a constant;
- everything else is a host step, its OpOverload called through ATen:
  npubridge's own native kernels (kind "native": copy_, empty, ...) or what
  no plugin serves (kind "fallback", with the reason).

Intermediates of kernel steps share one arena, placed by liveness
(memory_plan.py). A graph the loop cannot run (a non-tensor input, a CPU
tensor, a Python callable node) runs as the FX graph instead; summary()
says why (``"lowered": False``).
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from .. import _C
from . import memory_plan

__all__ = ["lower", "Compiled"]

# npubridge's own kernels of npu tensors (python_ext/csrc/aten/minimal.cpp),
# reached through ATen: a host step of kind "native".
_NATIVE = {
    "aten::empty.memory_format", "aten::empty_strided", "aten::resize_", "aten::copy_",
    "aten::_copy_from", "aten::_copy_from_and_resize", "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor", "aten::set_",
}
# Factories whose value depends only on their arguments: made once at
# lowering when no tensor flows into them and their value stays inside.
_FOLDABLE = {
    "aten::full", "aten::scalar_tensor", "aten::zeros", "aten::ones", "aten::arange",
    "aten::arange.start", "aten::arange.start_step",
}


# Note [Scalar overloads run as their Tensor overloads]
# ATen implements add.Scalar, sub.Scalar, mul.Scalar and div.Scalar as the
# Tensor overload with the scalar as a wrapped number (BinaryOps.cpp:
# at::mul(self, wrapped_scalar_tensor(other))), which is how eager npu
# reaches the plugin's .out kernel. The lowering takes the same route
# directly: the same kernel, bit for bit, instead of a host step.
_SCALAR_AS_TENSOR = {
    "aten::add.Scalar": torch.ops.aten.add.Tensor, "aten::sub.Scalar": torch.ops.aten.sub.Tensor,
    "aten::mul.Scalar": torch.ops.aten.mul.Tensor, "aten::div.Scalar": torch.ops.aten.div.Tensor,
}
# Note [The overrideable convolutions, lowered]
# On a backend without a native convolution ATen sends aten.convolution to
# convolution_overrideable (its backward to convolution_backward_overrideable,
# whose schema lacks bias_sizes), which the plugins serve; the lowering takes
# that route directly (argument indices kept, bias_sizes dropped).
_CONV_ROUTES = {
    "aten::convolution": (torch.ops.aten.convolution_overrideable.default, ()),
    "aten::convolution_backward": (torch.ops.aten.convolution_backward_overrideable.default, (3,)),
}
# Ops that copy or convert their input: made once at lowering when every
# tensor flowing in is a constant (lift_fresh_copy of a lifted constant).
_FOLDABLE_ON_CONSTANTS = {"aten::lift_fresh_copy", "aten::_to_copy", "aten::clone"}


def _name(op: torch._ops.OpOverload) -> str:
    ov = op._overloadname
    return op._schema.name + ("" if ov == "default" else "." + ov)


def _routes():
    """The eager bridge's routes (``_C.routes()``, the C++ route table):
    ops served under their own name, ops served through a target's .out
    kernel (op -> target), and the op-mapping table's direct routes."""
    direct, via_out, mapped = set(), {}, {}
    for r in _C.routes():
        if r.kind != "direct":
            via_out[r.op] = r.target
        elif r.origin == "mapped":
            mapped[r.op] = r.target
        else:
            direct.add(r.op)
    return direct, via_out, mapped


# Ops that return a view of their input though their schemas do not say so.
_UNANNOTATED_VIEWS = {"aten::_unsafe_view"}


def _is_view(op) -> bool:
    if _name(op) in _UNANNOTATED_VIEWS:
        return True
    s = op._schema
    if s.is_mutable or not s.returns:
        return False
    a = s.returns[0].alias_info
    return a is not None and not a.is_write


def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


class _Refused(Exception):
    pass


def _host_reason(op) -> str:
    name = _name(op)
    qual = op._schema.name + ("" if op._overloadname == "default" else "." + op._overloadname)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(qual, "PrivateUse1"):
        how = "npubridge's own kernel"
    elif has(qual, "CompositeExplicitAutograd") or has(qual, "CompositeImplicitAutograd"):
        how = "ATen's composite implementation on the npu"
    else:
        how = "ATen's CPU kernel (the boxed CPU fallback)"
    return f"no plugin serves {name}; runs through ATen ({how})"


# Note [Copies as kernel steps]
# A few ops ATen composes of an allocation and copies (_to_copy: empty and
# copy_; slice_backward: zeros and copy_ into a slice) would be host steps,
# though every piece is a plugin kernel. The lowering composes them the same
# way from slots and kernel steps: the same kernels as eager, and their
# outputs planned like any other.


class _Lowering:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.slots = []        # _C._SlotSpec per slot, for _C._compiled_program
        self.slot_of = {}      # fx node -> slot, or list of slots (multi-output), or None
        self.steps = []        # _C._StepSpec per step
        self.node_info = []    # summary rows, in node order (step rows filled from C++)
        self.step_rows = []    # (row index, step index)
        self.device = None
        self.reads = []        # per step: slots it reads
        self.writes = []       # per step: slots it writes
        self.direct, self.via_out, self.mapped = _routes()

    # -- slots -----------------------------------------------------------
    def _check_device(self, t, what):
        if t.device.type != "npu":
            raise _Refused(f"{what} is a tensor on {t.device}, not on the npu")
        idx = t.device.index if t.device.index is not None else torch.npu.current_device()
        if self.device is None:
            self.device = idx
        elif idx != self.device:
            raise _Refused(f"{what} is on npu:{idx} but the graph on npu:{self.device}")

    def _slot(self, kind, index, t, tensor=None):
        self.slots.append(_C._SlotSpec(kind, index, t.dtype, list(t.shape), list(t.stride()),
                                       int(t.storage_offset()), tensor))
        return len(self.slots) - 1

    def _arg(self, v, what):
        if isinstance(v, torch.fx.Node):
            s = self.slot_of.get(v)
            if not isinstance(s, int):
                raise _Refused(f"{what}: node '{v.name}' is not a tensor the loop holds")
            return ("slot", s)
        if isinstance(v, (list, tuple)) and any(isinstance(e, torch.fx.Node) for e in v):
            out = []
            for e in v:
                if e is None:
                    out.append(-1)
                else:
                    out.append(self._arg(e, what)[1])
            return ("slots", out)
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise _Refused(f"{what}: a symbolic value (dynamic shapes are not lowered)")
        return ("value", v)

    def _args(self, node):
        schema = node.target._schema
        out = []
        for i, a in enumerate(schema.arguments):
            if i < len(node.args):
                v = node.args[i]
            elif a.name in node.kwargs:
                v = node.kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                raise _Refused(f"node '{node.name}': argument '{a.name}' missing")
            out.append(self._arg(v, f"node '{node.name}', argument '{a.name}'"))
        return out

    # -- nodes -----------------------------------------------------------
    def run(self):
        escaping = self._escaping_roots()
        placeholders = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                if val is None and placeholders < len(self.example_inputs):
                    val = self.example_inputs[placeholders]
                if not isinstance(val, torch.Tensor):
                    raise _Refused(f"graph input '{node.name}' is {type(val).__name__}, not a tensor")
                self._check_device(val, f"graph input '{node.name}'")
                self.slot_of[node] = self._slot("input", placeholders, val)
                placeholders += 1
            elif node.op == "get_attr":
                val = getattr(self.gm, node.target)
                if not isinstance(val, torch.Tensor) or isinstance(val, FakeTensor):
                    raise _Refused(f"attribute '{node.target}' is not a real tensor")
                self._check_device(val, f"constant '{node.target}'")
                self.slot_of[node] = self._slot("constant", 0, val, val)
                self._row(node, "constant")
            elif node.op == "call_function":
                self._call(node, escaping)
            elif node.op == "output":
                self.output = node.args[0]
            else:
                raise _Refused(f"node '{node.name}': {node.op} nodes are not lowered")
        self.num_inputs = placeholders

    def _row(self, node, kind, reason=None):
        self.node_info.append({
            "name": node.name, "target": str(node.target), "kind": kind, "plugin": "",
            "kernel_op": "", "dtype_conversion": None, "reason": reason,
        })
        return len(self.node_info) - 1

    def _escaping_roots(self):
        """The nodes whose memory a graph output reaches (through views)."""
        roots = set()
        out = next(n for n in self.gm.graph.nodes if n.op == "output").args[0]
        todo = [n for n in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(n, torch.fx.Node)]
        while todo:
            n = todo.pop()
            if n.op == "call_function" and n.target is operator.getitem:
                base = n.args[0]
                if isinstance(base.target, torch._ops.OpOverload) and _is_view(base.target):
                    todo.append(base.args[0])
                else:
                    roots.add(base)
            elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and _is_view(n.target):
                todo.append(n.args[0])
            else:
                roots.add(n)
        return roots

    def _call(self, node, escaping):
        op = node.target
        if op is operator.getitem:
            base, i = node.args
            s = self.slot_of.get(base)
            if not isinstance(s, list):
                raise _Refused(f"node '{node.name}': getitem of a node that is not multi-output")
            self.slot_of[node] = s[i]
            return
        if not isinstance(op, torch._ops.OpOverload):
            raise _Refused(f"node '{node.name}': target {op} is not an ATen operator overload")
        val = node.meta.get("val")
        for t in _tensors(val):
            self._check_device(t, f"the value of node '{node.name}'")
        name = _name(op)
        if _is_view(op):
            base = self.slot_of.get(node.args[0])
            if not isinstance(base, int):
                raise _Refused(f"node '{node.name}': a view of something not a tensor slot")
            if isinstance(val, torch.Tensor):
                self.slot_of[node] = self._slot("view", base, val)
            else:  # split, unbind, ...: a list of views
                self.slot_of[node] = [self._slot("view", base, v) for v in val]
            self._row(node, "view")
            return
        args = self._args(node)
        tensor_in = any(a[0] in ("slot", "slots") for a in args)
        from_constants = name in _FOLDABLE_ON_CONSTANTS and all(
            a[0] != "slot" or self.slots[a[1]].kind == "constant" for a in args) and tensor_in
        if ((name in _FOLDABLE and not tensor_in) or from_constants) and node not in escaping \
                and isinstance(val, torch.Tensor):
            # Made for real, outside the fake mode AOTAutograd compiles in.
            with unset_fake_temporarily():
                real = lambda v: self.slots[self.slot_of[v]].tensor if isinstance(v, torch.fx.Node) else v  # noqa: E731
                t = op(*[real(a) for a in node.args], **{k: real(v) for k, v in node.kwargs.items()})
            self._check_device(t, f"constant node '{node.name}'")
            self.slot_of[node] = self._slot("constant", 0, t, t)
            self._row(node, "constant")
            return
        if name in _SCALAR_AS_TENSOR:
            op = _SCALAR_AS_TENSOR[name]
            name = _name(op)
        elif name in _CONV_ROUTES and _name(_CONV_ROUTES[name][0]) in self.direct:
            op, dropped = _CONV_ROUTES[name]
            name = _name(op)
            args = [a for i, a in enumerate(args) if i not in dropped]
        schema = op._schema
        if schema.is_mutable:
            # copy_ into a graph input (AOTAutograd's input mutations) and
            # other writes: the node's value is the written argument itself.
            # A plugin's own in-place kernel (aten::copy_) serves it as a
            # kernel step; its returns alias the written argument.
            written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
            if not written or any(args[i][0] != "slot" for i in written):
                raise _Refused(f"node '{node.name}' ({name}) writes something that is not a tensor slot")
            outs = [-1] * len(schema.returns)
            if name in self.direct and all(r.alias_info is not None for r in schema.returns):
                self._kernel_step(node, op, name, args, outs, False)
            else:
                self._host_step(node, op, args, outs)
            ret_alias = schema.returns[0].alias_info if schema.returns else None
            self.slot_of[node] = args[written[0]][1] if written and ret_alias is not None else None
            return
        vals = [val] if len(schema.returns) == 1 else list(val) if val is not None else []
        if len(vals) != len(schema.returns) or not all(
                r.type.kind() == "TensorType" or str(r.type) == "Tensor" for r in schema.returns):
            return self._host_with_outputs(node, op, args, vals, escaping)
        composed = self._composed(node, val, escaping)
        if composed is not None:
            self.slot_of[node] = composed
            return
        target, via_out = None, False
        if name in self.direct:
            target = name
        elif name in self.via_out:
            target, via_out = self.via_out[name], True
        elif name in self.mapped:
            target = self.mapped[name]
        if target is None:
            return self._host_with_outputs(node, op, args, vals, escaping)
        read = self._read_returns(node, len(vals))
        # Note [Returns the graph never reads]
        # An .out route takes every output as out=, so those keep their slots;
        # otherwise an unread return gets none and the kernel allocates it as
        # in eager.
        outs = [self._out_slot(node, v, escaping) if via_out or read[i] else -1 for i, v in enumerate(vals)]
        real = self._planned_returns(node, op, target, args, outs) if not via_out and len(outs) > 1 else None
        # A return the plan cannot say (the kernel's meta function reaches
        # data before declaring it, and the op has none: ATen's ops) keeps
        # the graph's meta value; a kernel that returns otherwise is an error
        # at run time that names the node.
        if real is not None and "aten::copy_" not in self.direct and any(
                o >= 0 and r is not None and r.dtype != v.dtype for o, r, v in zip(outs, real, vals)):
            # Widening the kernel's return to the graph's dtype takes a copy_
            # kernel: without one, ATen runs the node.
            return self._host_with_outputs(node, op, args, vals, escaping)
        kernel_outs, widen = list(outs), []
        for i, r in enumerate(real or []):
            v = vals[i]
            if outs[i] < 0:
                # An unread return still gets a buffer of what the kernel really
                # returns (live for its own step only), so that the kernel never
                # allocates inside the loop: an allocation of the kernel's own is
                # a data-dependent output, which a graph capture
                # (mode="reduce-overhead") refuses.
                if r is not None:
                    kernel_outs[i] = self._out_slot(node, r, set())
                continue
            if r is None or (r.dtype == v.dtype and r.shape == v.shape):
                continue
            if r.shape != v.shape or torch.promote_types(r.dtype, v.dtype) != v.dtype \
                    or r.dtype.itemsize >= v.dtype.itemsize or r.dtype.is_floating_point != v.dtype.is_floating_point:
                raise _Refused(f"node '{node.name}' ({name}): the kernel returns {i} as {r.dtype} "
                               f"{list(r.shape)} but the graph's meta value says {v.dtype} {list(v.shape)}")
            kernel_outs[i] = self._out_slot(node, r, set())  # the kernel's own dtype, in the arena
            widen.append(i)
        row = self._kernel_step(node, op, target, args, kernel_outs, via_out)
        for i in widen:  # Note [The real result against the meta value] (program.cpp)
            self._kernel_step(node, torch.ops.aten.copy_.default, "aten::copy_",
                              [("slot", outs[i]), ("slot", kernel_outs[i]), ("value", False)], [-1], False, row=row)
            self.node_info[row]["reason"] = (f"return {i}: the kernel gives {real[i].dtype}, the graph "
                                             f"{vals[i].dtype}: widened exactly by copy_")
        self.slot_of[node] = outs[0] if len(outs) == 1 else outs

    @staticmethod
    def _step(node, op, target, via_out, args, outs):
        """The typed step (_C._StepSpec): its values read by the op's schema
        now, so a bad one names the node; made outside the fake mode, as a
        wrapped number is a real tensor."""
        with unset_fake_temporarily():
            return _C._StepSpec(node.name, op._schema.name, op._schema.overload_name, target, via_out, args, outs)

    def _kernel_step(self, node, op, target, args, outs, via_out, row=None):
        step = len(self.steps)
        self.steps.append(self._step(node, op, target, via_out, args, outs))
        self._note_access(args, outs, op)
        if row is None:
            row = self._row(node, "kernel")
        self.step_rows.append((row, step))
        return row

    def _composed(self, node, val, escaping):
        """Nodes ATen composes of copies (Note [Copies as kernel steps]):
        their parts as kernel steps; None when the node is not one."""
        name = _name(node.target)
        copy_ = torch.ops.aten.copy_.default
        if "aten::copy_" not in self.direct or not isinstance(val, torch.Tensor):
            return None
        if name == "aten::_to_copy":
            kw = dict(node.kwargs)
            if set(kw) - {"dtype", "device", "layout", "memory_format", "non_blocking", "pin_memory"} \
                    or kw.get("layout") not in (None, torch.strided) or kw.get("pin_memory") \
                    or len(node.args) != 1 or self.slot_of.get(node.args[0]) is None:
                return None
            out = self._out_slot(node, val, escaping)
            src = ("slot", self.slot_of[node.args[0]])
            row = self._kernel_step(node, copy_, "aten::copy_", [("slot", out), src,
                                                                 ("value", bool(kw.get("non_blocking", False)))],
                                    [-1], False)
            self.node_info[row]["reason"] = "lowered as its own output and copy_ (ATen's _to_copy)"
            return out
        if name == "aten::slice_backward" and "aten::zero_" in self.direct:
            grad, sizes, dim, start, end, step = node.args
            if self.slot_of.get(grad) is None:
                return None
            out = self._out_slot(node, val, escaping)
            meta = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
            view = self._slot("view", out, torch.ops.aten.slice.Tensor(meta, dim, start, end, step))
            row = self._kernel_step(node, torch.ops.aten.zero_.default, "aten::zero_", [("slot", out)], [-1], False)
            self._kernel_step(node, copy_, "aten::copy_", [("slot", view), ("slot", self.slot_of[grad]),
                                                           ("value", False)], [-1], False, row=row)
            self.node_info[row]["reason"] = "lowered as zeros and copy_ into its slice (ATen's slice_backward)"
            return out
        return None

    def _out_slot(self, node, v, escaping):
        if not isinstance(v, torch.Tensor):
            return -1
        kind = "output" if node in escaping else "arena"
        # The arena slot's storage offset is its own: 0 within its buffer.
        s = self._slot(kind, 0, v)
        if kind == "arena":
            self.slots[s].offset = 0
        return s

    def _planned_returns(self, node, op, target, args, outs):
        """What the kernel serving the node really returns (dtype and shape
        per return, as meta tensors; None where its plan cannot say, and
        None for the whole when no kernel serves the node): the
        returns of the step's call plan, from the kernel's own meta function
        (Note [A plan's returns are its kernel's], dispatcher). Nothing runs.
        Only for ATen ops (a custom op's meta is its plugin's own), and only
        when some return is read; None when the plan cannot be made (the
        program build then reports why, naming the node)."""
        if op.namespace != "aten" or all(o < 0 for o in outs):
            return None
        names = set()
        for a in args:
            if a[0] == "slot":
                names.add(a[1])
            elif a[0] == "slots":
                names.update(k for k in a[1] if k >= 0)
        dev = self.device if self.device is not None else torch.npu.current_device()
        try:
            step = self._step(node, op, target, False, args, [-1] * len(outs))
            with unset_fake_temporarily():  # wrapped numbers are boxed on the npu, for real
                plan = _C._plan_step(dev, {k: self.slots[k] for k in names}, step)
        except RuntimeError:
            return None
        if not plan.plugin or len(plan.returns) != len(outs):
            # The fallback serves it (the program runs it through ATen, with
            # the dispatcher's reason), or an op-map target of another arity.
            return None
        return [None if r is None else torch.empty(r[0], dtype=r[1], device="meta") for r in plan.returns]

    @staticmethod
    def _read_returns(node, n):
        """Per return of a node: whether the graph reads it. A multi-output
        node's returns are read through getitem users only."""
        if n == 1:
            return [True]
        read = [False] * n
        for u in node.users:
            if u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int):
                read[u.args[1]] = True
            else:  # the tuple itself flows on: every return counts
                return [True] * n
        return read

    def _host_with_outputs(self, node, op, args, vals, escaping):
        # Note [Returns the graph never reads]: the op's real result for an
        # unread return is not checked against the meta value (ATen's CPU
        # batch norm in eval returns empty save_mean/save_invstd where the
        # meta function declares [C]): the loop drops it.
        read = self._read_returns(node, len(vals))
        outs = []
        for i, v in enumerate(vals):
            outs.append(self._slot("host", 0, v) if isinstance(v, torch.Tensor) and read[i] else -1)
        if not all(isinstance(v, torch.Tensor) or v is None for v in vals):
            raise _Refused(f"node '{node.name}' ({_name(op)}) returns non-tensor values")
        self._host_step(node, op, args, outs)
        self.slot_of[node] = outs[0] if len(outs) == 1 else outs

    def _host_step(self, node, op, args, outs):
        name = _name(op)
        kind = "native" if name in _NATIVE else "fallback"
        step = len(self.steps)
        self.steps.append(self._step(node, op, "", False, args, outs))
        self._note_access(args, outs, op)
        row = self._row(node, kind, None if kind == "native" else _host_reason(op))
        self.step_rows.append((row, step))

    def _note_access(self, args, outs, op=None):
        # Arguments a step writes (Tensor(a!): copy_'s self) are written
        # slots too: an arena slot's life starts at its first write.
        written = [] if op is None else [
            args[i][1] for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write and i < len(args) and args[i][0] == "slot"]
        r = []
        for a in args:
            if a[0] == "slot":
                r.append(a[1])
            elif a[0] == "slots":
                r.extend(s for s in a[1] if s >= 0)
        self.reads.append(r)
        self.writes.append([o for o in outs if o >= 0] + [self._root(w) for w in written])

    # -- memory ----------------------------------------------------------
    def _root(self, s):
        while self.slots[s].kind == "view":
            s = self.slots[s].index
        return s

    def plan(self):
        nbytes = {}
        for i, s in enumerate(self.slots):
            if s.kind in ("arena", "output", "host"):
                n = 1
                extent = 0
                for size, stride in zip(s.sizes, s.strides):
                    n *= size
                    extent += (size - 1) * stride
                nbytes[i] = 0 if n == 0 else (s.offset + extent + 1) * s.dtype.itemsize
        start, end = {}, {}
        for k, (r, w) in enumerate(zip(self.reads, self.writes)):
            for s in w:
                start.setdefault(s, k)
                end[s] = max(end.get(s, k), k)
            for s in r:
                root = self._root(s)
                end[root] = max(end.get(root, k), k)
        out_nodes = self.output if isinstance(self.output, (list, tuple)) else [self.output]
        for n in out_nodes:  # an output keeps its root alive to the end
            if isinstance(n, torch.fx.Node) and isinstance(self.slot_of.get(n), int):
                root = self._root(self.slot_of[n])
                end[root] = len(self.steps)
        # Per graph input, the last step that reads it (or a view of it);
        # one an output reaches is kept (its end is past the last step).
        self.input_last_use = [-1] * self.num_inputs
        for i, sl in enumerate(self.slots):
            if sl.kind == "input":
                self.input_last_use[sl.index] = end.get(i, -1)
        buffers = [memory_plan.Buffer(i, nbytes[i], start[i], end.get(i, start[i]))
                   for i, s in enumerate(self.slots) if s.kind == "arena" and i in start]
        p = memory_plan.plan(buffers)
        for b in p.buffers:
            self.slots[b.id].index = b.offset
        self.mem = {
            "planned_bytes": p.arena_bytes,
            "live_peak_bytes": p.live_peak_bytes,
            "intermediates_bytes": p.intermediates_bytes,
            "output_bytes": sum(nbytes[i] for i, s in enumerate(self.slots) if s.kind == "output"),
            "host_bytes": sum(nbytes[i] for i, s in enumerate(self.slots) if s.kind == "host"),
        }
        return p


class Compiled:
    """A lowered graph: call it with the graph's inputs; summary() says how
    each node was resolved and what memory the plan takes."""

    def __init__(self, gm, program, outputs, structure, summary):
        self._gm = gm
        self._program = program
        self._outputs = outputs
        self._structure = structure
        self._summary = summary

    def __call__(self, *args):
        if self._program is None:
            return self._gm(*args)
        return self._wrap(self._program.run(list(args)))

    def summary(self) -> dict:
        return self._summary

    def boxed(self, args: list):
        """AOTAutograd's boxed convention: takes the list of inputs and
        empties it, so that the loop holds the only references and drops
        each input after the last step that reads it (a backward graph's
        saved activations go as eager autograd frees them)."""
        if self._program is None:
            inputs = list(args)
            args.clear()
            return self._gm(*inputs)
        return self._wrap(self._program.run_boxed(args))

    def boxed_fn(self):
        """A function AOTAutograd calls boxed (``_boxed_call``)."""
        def run(args):
            return self.boxed(args)
        run._boxed_call = True
        return run

    def _wrap(self, outs):
        if self._structure == "single":
            return outs[0]
        return tuple(outs) if self._structure == "tuple" else list(outs)


def lower(gm: torch.fx.GraphModule, example_inputs, keep_arena: bool = False) -> Compiled:
    """Lowers an ATen FX graph to the C++ execution loop (see the module's
    docstring). ``keep_arena`` keeps the arena across calls instead of
    taking it from the caching allocator per call."""
    lw = _Lowering(gm, example_inputs)
    try:
        lw.run()
        out = lw.output
        items = list(out) if isinstance(out, (list, tuple)) else [out]
        outputs = []
        for n in items:
            if n is None:
                outputs.append(-1)
            elif isinstance(n, torch.fx.Node) and isinstance(lw.slot_of.get(n), int):
                outputs.append(lw.slot_of[n])
            else:
                raise _Refused(f"graph output {n!r} is not a tensor the loop holds")
        lw.plan()
        device = lw.device if lw.device is not None else torch.npu.current_device()
        with unset_fake_temporarily():  # building boxes wrapped numbers on the npu, for real
            program = _C._compiled_program(device, lw.slots, lw.mem["planned_bytes"], lw.steps, outputs, keep_arena)
        program.set_input_last_use(lw.input_last_use)
    except _Refused as e:
        # Each node runs as an eager npu op (its plugin kernel, or its own
        # fallback): "unlowered", not a host fallback of the loop.
        nodes = [{"name": n.name, "target": str(n.target), "kind": "unlowered", "plugin": "", "kernel_op": "",
                  "dtype_conversion": None, "reason": str(e)}
                 for n in gm.graph.nodes if n.op == "call_function"]
        return Compiled(gm, None, None, None, {
            "lowered": False, "reason": str(e), "nodes": nodes, "fallbacks": 0, "planned_bytes": 0,
            "live_peak_bytes": 0, "intermediates_bytes": 0, "output_bytes": 0, "host_bytes": 0})
    info = program.info()
    for row, step in lw.step_rows:
        r, i = lw.node_info[row], info[step]
        if lw.steps[step].target:
            r["kind"] = i["kind"]
            r["plugin"] = i["plugin"]
            r["kernel_op"] = i["kernel_op"]
            r["dtype_conversion"] = i["conversion"] or None
            if i["kind"] == "fallback":
                r["reason"] = f"no kernel of {lw.steps[step].target}: {i['reason']}"
    structure = "tuple" if isinstance(out, tuple) else "list" if isinstance(out, list) else "single"
    summary = {"lowered": True, "reason": None, "nodes": lw.node_info,
               "fallbacks": sum(r["kind"] == "fallback" for r in lw.node_info), **lw.mem}
    return Compiled(gm, program, outputs, structure, summary)
