"""The pre-dispatch ATen graph of a Dynamo graph: where fusion patterns match.

Dynamo hands the backend a graph of torch-level calls (``torch.nn.functional
.linear``, methods, modules' code inlined). ``make_fx(pre_dispatch=True)``
turns it into ATen ops while staying ABOVE autograd: ``aten.linear``,
``aten.conv2d``, ``aten.scaled_dot_product_attention``, ``aten.pow`` ... are
still whole ops (not yet decomposed into mm/convolution/_fused kernels, not
yet split into forward and backward). That is the level the patterns are
written at, and a rewrite there is seen by AOTAutograd afterwards: it
derives the fused op's backward from the plugin's derivative formula.

Note [Fake-ify before make_fx]: Dynamo's example inputs mix fake tensors
with real ones (the model's Parameters and buffers, lifted to graph inputs).
make_fx under the graph's FakeTensorMode refuses real tensors ("Please
convert all Tensors to FakeTensors first"), so every tensor input goes
through ``fake_mode.from_tensor`` (memoised: one fake per real tensor, the
same the Dynamo graph saw). No device memory is touched by the trace.
"""
import torch
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def fake_inputs(example_inputs, fake_mode):
    return [fake_mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t
            for t in example_inputs]


def trace(gm: torch.fx.GraphModule, example_inputs):
    """The pre-dispatch ATen GraphModule of Dynamo's ``gm``, with
    ``node.meta["val"]`` (fake tensors) on every node. Raises when the
    graph cannot be traced there (the backend then compiles Dynamo's graph
    without patterns and reports why)."""
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fake_inputs(example_inputs, fake_mode)
    with fake_mode:
        traced = make_fx(gm, pre_dispatch=True, tracing_mode="real" if _all_fake(fakes) else "fake")(*fakes)
    # A tensor constant created inside forward (torch.tensor([...])) is
    # captured as an attribute holding a FAKE tensor, which cannot run.
    for node in traced.graph.nodes:
        if node.op == "get_attr" and isinstance(getattr(traced, node.target, None), FakeTensor):
            raise RuntimeError(f"the pre-dispatch trace captured the tensor constant '{node.target}' as a fake "
                               "tensor (a tensor created from Python data inside forward)")
    return traced


def _all_fake(values):
    return all(isinstance(v, FakeTensor) for v in values if isinstance(v, torch.Tensor))
