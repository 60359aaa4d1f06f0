"""Hugging Face vision models built on BatchNorm and LayerNorm over
channels: ResNet and ConvNeXt (tiny configs, random weights, nothing
downloaded), on npu against the CPU: the training loss, logits, every
parameter's gradient and the BatchNorm running statistics, judged by
npubridge's error model against the same model in float64
(conftest.assert_judged), with no op falling back to the CPU in forward
and backward."""
import copy
import functools
import os

import pytest
import torch

import npubridge
from conftest import assert_gradients_judged, assert_judged, assert_no_fallbacks

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers


def resnet():
    return transformers.ResNetForImageClassification(transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=5))


def resnet_bottleneck():
    return transformers.ResNetForImageClassification(transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
        num_labels=5, downsample_in_first_stage=True))


def convnext():
    return transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2, num_labels=5,
        drop_path_rate=0.0))


MODELS = {"resnet": resnet, "resnet_bottleneck": resnet_bottleneck, "convnext": convnext}


def inputs(device):
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(4, 3, 32, 32, generator=g).to(device),
            "labels": torch.randint(0, 5, (4,), generator=g).to(device)}


@functools.cache
def build(name):
    """(the CPU model, its npu copy, its float64 CPU copy), one training
    step taken on each (train mode: BatchNorm uses the batch's statistics
    and updates its running ones), with the losses."""
    torch.manual_seed(0)
    cpu = MODELS[name]()
    wide = copy.deepcopy(cpu).double()
    npu = copy.deepcopy(cpu).to("npu")
    losses = []
    npubridge.reset_stats()
    for m, device in ((npu, "npu"), (cpu, "cpu"), (wide, "cpu")):
        m.train()
        m.zero_grad(set_to_none=True)
        kw = inputs(device)
        if m is wide:
            kw["pixel_values"] = kw["pixel_values"].double()
        loss = m(**kw).loss
        loss.backward()
        losses.append(loss.detach())
        if m is npu:
            stats = npubridge.stats()
    return cpu, npu, wide, losses, stats


@pytest.fixture(params=list(MODELS))
def name(request):
    return request.param


def test_forward_and_backward_never_fall_back(name):
    *_, stats = build(name)
    assert_no_fallbacks(stats=stats)
    if name.startswith("resnet"):
        assert stats["aten::native_batch_norm"]["native"].get("cann_like", 0) > 0
        assert stats["aten::native_batch_norm_backward"]["native"].get("cann_like", 0) > 0


def test_loss_and_every_gradient_match(name):
    cpu, npu, wide, (l_npu, l_cpu, l_wide), _ = build(name)
    assert l_npu.device.type == "npu"
    assert_judged(l_npu, l_cpu, l_wide, f"{name} loss")
    checked = assert_gradients_judged(cpu, npu, wide, name)
    assert checked == sum(1 for p in cpu.parameters() if p.grad is not None) > 0


def test_running_statistics_and_eval_logits_match(name):
    cpu, npu, wide, *_ = build(name)
    buffers = 0
    for (bname, bc), (_, bn), (_, bw) in zip(cpu.named_buffers(), npu.named_buffers(), wide.named_buffers()):
        if not bc.is_floating_point():
            assert torch.equal(bn.cpu(), bc), bname  # num_batches_tracked
            continue
        assert bn.device.type == "npu"
        assert_judged(bn, bc, bw, f"{name}.{bname}")
        buffers += 1
    assert buffers > 0 or name == "convnext"
    for m in (cpu, npu, wide):
        m.eval()
    npubridge.reset_stats()
    with torch.no_grad():
        got = npu(pixel_values=inputs("npu")["pixel_values"]).logits
        host = cpu(pixel_values=inputs("cpu")["pixel_values"]).logits
        ref = wide(pixel_values=inputs("cpu")["pixel_values"].double()).logits
    assert_no_fallbacks()
    assert_judged(got, host, ref, f"{name} eval logits")
