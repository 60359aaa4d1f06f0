"""A tiny Llama-style network written in MindSpore trains 10 AdamW steps on
the plugins (npubridge.mindspore), in PyNative and GRAPH_MODE, with the
losses of MindSpore's own network within a bound derived from the
computation."""
import numpy as np
import pytest

import mindspore as ms

import npubridge.mindspore as ms_adapter
from npubridge.mindspore import testing

STEPS = 10
LR = 1e-2
# At least the longest sum one step makes: the down-projection's 64 inputs,
# the LM head's softmax over 64 classes, the weight gradients' sums over
# 2 x 8 tokens and the attention's over 8 positions are all below it.
K = 128
GAMMA_K = K * 2.0 ** -24 / (1 - K * 2.0 ** -24)  # float32 (Higham, sec. 3.1)

# The plugin kernels a step must reach: forward and backward of every fused
# operator, and the optimizer's update.
SERVED = ["aten::mm.out", "mindspeed_like::npu_rms_norm", "mindspeed_like::npu_rms_norm_backward",
          "mindspeed_like::npu_rotary_position_embedding", "mindspeed_like::npu_rotary_position_embedding_backward",
          "mindspeed_like::npu_fusion_attention", "mindspeed_like::npu_fusion_attention_grad",
          "mindspeed_like::npu_swiglu", "mindspeed_like::npu_swiglu_backward", "mindspeed_like::npu_apply_adam_w"]


def train(net, graph, ids):
    opt = ms_adapter.AdamW(net.trainable_params(), lr=LR)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(ids):
        loss, grads = grad_fn(ids)
        opt(grads)
        return loss

    if graph:
        step = ms.jit(step)
    return np.array([float(step(ids).asnumpy()) for _ in range(STEPS)])


def bound(losses):
    """Step t's loss may differ from the float64 run's by (t + 1) gamma_K |loss_t|:
    one evaluation in float32 moves the loss by at most gamma_K relative
    (every term is a sum of at most K products, each rounded once), and each
    AdamW step carries the previous steps' parameter perturbations forward
    additively (its update is normalised by the gradient's own scale)."""
    return (np.arange(STEPS) + 1) * GAMMA_K * np.abs(losses)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_tiny_llama_trains_on_the_plugins_as_mindspore_does(mode):
    graph = mode == "graph"
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    cfg = testing.Config()
    ids = testing.batch(cfg)
    ms.set_seed(0)
    native = testing.TinyLlama(cfg, ms.float32, fused=False)
    reference = testing.TinyLlama(cfg, ms.float64, fused=False)
    testing.copy_weights(native, reference)
    fused = testing.TinyLlama(cfg, ms.float32, fused=True)
    testing.copy_weights(native, fused)
    try:
        ms_adapter.enable()
        ms_adapter.reset_stats()
        losses = train(fused, graph, ids)
        s = ms_adapter.stats()
    finally:
        ms_adapter.disable()
    for op in SERVED:
        assert op in s["kernels"], (op, s)
    assert not s["fallbacks"], s

    # MindSpore's own network (basic operators, MindSpore's AdamW update) in
    # float64: the reference.
    expected = train(reference, graph, ids)
    assert losses[-1] < 0.5 * losses[0], losses  # it learns
    assert (np.abs(losses - expected) <= bound(expected)).all(), (losses, expected, bound(expected))
    if graph:  # the bound holds for MindSpore's own float32 network too
        own = train(native, graph, ids)
        assert (np.abs(own - expected) <= bound(expected)).all(), (own, expected)
    ms.set_context(mode=ms.PYNATIVE_MODE)
