"""Autograd for plugin ops from the derivative formulas plugins declare.

A plugin states, in the spirit of PyTorch's derivatives.yaml, which of an
op's inputs get gradients and which backward op computes them from the
output gradients, the forward results and the forward arguments
(``NpubHostApi.define_derivative``). Here each formula becomes a
``torch.library.register_autograd`` registration: no per-op code.
"""
import torch

from . import _C


def _resolve(op: str):
    ns, rest = op.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, overload or "default")


def _make(entry):
    forward = _resolve(entry["op"])
    backward_op = _resolve(entry["backward"])
    schema = forward._schema
    arg_names = [a.name for a in schema.arguments]
    grad_slots = list(entry["inputs"])
    spec = [tuple(a) for a in entry["args"]]
    needs_results = sorted({i for kind, i in spec if kind == "result"})
    needs_inputs = sorted({i for kind, i in spec if kind == "input"})

    def setup_context(ctx, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        # Tensors go through save_for_backward, never onto ctx itself: a
        # forward result kept on ctx is a cycle (result -> grad_fn -> ctx ->
        # result) through the C++ autograd node, which Python's collector
        # cannot see, so every call's results would stay allocated; and
        # saved tensors are freed by backward, ctx attributes only with the graph.
        values = [outs[i] for i in needs_results] + [inputs[i] for i in needs_inputs]
        ctx.is_tensor = [isinstance(v, torch.Tensor) for v in values]
        ctx.save_for_backward(*[v for v, t in zip(values, ctx.is_tensor) if t])
        ctx.non_tensors = [None if t else v for v, t in zip(values, ctx.is_tensor)]
        # A formula may list an optional Tensor input (npu_fusion_attention's
        # pse, for torch_npu's four returns of its backward): when the call
        # passed None, autograd takes no gradient for it.
        ctx.tensor_inputs = [isinstance(x, torch.Tensor) for x in inputs]
        ctx.result_likes = [(o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in outs]

    def backward(ctx, *grads):
        tensors = iter(ctx.saved_tensors)
        values = [next(tensors) if t else v for t, v in zip(ctx.is_tensor, ctx.non_tensors)]
        results = dict(zip(needs_results, values[:len(needs_results)]))
        saved = dict(zip(needs_inputs, values[len(needs_results):]))
        args = []
        for kind, i in spec:
            if kind == "grad":
                g = grads[i]
                if g is None:  # that output did not reach the loss
                    shape, dtype, device = ctx.result_likes[i]
                    g = torch.zeros(shape, dtype=dtype, device=device)
                args.append(g)
            elif kind == "result":
                args.append(results[i])
            else:
                args.append(saved[i])
        out = backward_op(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        result = [None] * len(arg_names)
        for slot, grad in zip(grad_slots, out):
            result[slot] = grad if ctx.tensor_inputs[slot] else None
        return tuple(result)

    torch.library.register_autograd(entry["op"], backward, setup_context=setup_context)


def register_all():
    """Registers autograd for every plugin op with a derivative formula."""
    registered = []
    for entry in _C.derivatives():
        try:
            _make(entry)
        except Exception as err:  # noqa: BLE001 - one op's formula never breaks import torch
            import warnings

            warnings.warn(f"npubridge: no autograd for plugin op '{entry['op']}': {err}", RuntimeWarning, stacklevel=2)
            continue
        registered.append(entry["op"])
    return registered
