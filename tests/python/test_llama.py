"""A real model nobody here wrote: Hugging Face transformers' LlamaForCausalLM
with a tiny config (random weights, fixed seed, nothing downloaded), on npu
against the CPU: logits and every parameter's gradient judged by npubridge's
error model against the same model in float64 (conftest.assert_judged), and
greedy generation token for token."""

import pytest
import torch

import npubridge
from conftest import assert_gradients_judged, assert_judged
from tiny_models import llama_config, models_to_judge

import transformers


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = llama_config(attn_implementation="eager")
    return models_to_judge(transformers.LlamaForCausalLM(cfg), transformers.LlamaForCausalLM(cfg), (2, 12))


def test_forward_logits_match(models):
    cpu, npu, wide, ids = models
    cpu.eval(), npu.eval(), wide.eval()
    with torch.no_grad():
        got, host, ref = npu(ids.npu()).logits, cpu(ids).logits, wide(ids).logits
    assert got.device.type == "npu"
    assert_judged(got, host, ref, "logits")


def test_gradients_match(models):
    cpu, npu, wide, ids = models
    for m in (cpu, npu, wide):
        m.train()
        m.zero_grad(set_to_none=True)
        dev_ids = ids.npu() if m is npu else ids
        m(dev_ids, labels=dev_ids).loss.backward()
    assert assert_gradients_judged(cpu, npu, wide) == sum(1 for _ in cpu.parameters())


def test_greedy_generation_gives_the_same_tokens(models):
    cpu, npu, _, ids = models
    cpu.eval(), npu.eval()
    npubridge.reset_stats()
    out_cpu = cpu.generate(ids[:1], max_new_tokens=20, do_sample=False)
    out_npu = npu.generate(ids[:1].npu(), max_new_tokens=20, do_sample=False)
    assert out_npu.shape[1] == ids.shape[1] + 20
    assert torch.equal(out_npu.cpu(), out_cpu)
    stats = npubridge.stats()
    native = sum(sum(s["native"].values()) for s in stats.values())
    fallback = sum(s["fallbacks"] for s in stats.values())
    assert native > fallback  # most of the model runs on plugin kernels
