"""A real model nobody here wrote: Hugging Face transformers' LlamaForCausalLM
with a tiny config (random weights, fixed seed, nothing downloaded), on npu
against the CPU."""
import pytest
import torch

import npubridge

import transformers


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    cpu = transformers.LlamaForCausalLM(cfg)
    npu = transformers.LlamaForCausalLM(cfg)
    npu.load_state_dict(cpu.state_dict())
    return cpu, npu.to("npu"), torch.randint(0, 128, (2, 12))


def test_forward_logits_match(models):
    cpu, npu, ids = models
    cpu.eval(), npu.eval()
    with torch.no_grad():
        torch.testing.assert_close(npu(ids.npu()).logits.cpu(), cpu(ids).logits, atol=1e-4, rtol=1e-4)


def test_gradients_match(models):
    cpu, npu, ids = models
    cpu.train(), npu.train()
    cpu.zero_grad(), npu.zero_grad()
    cpu(ids, labels=ids).loss.backward()
    npu(ids.npu(), labels=ids.npu()).loss.backward()
    for (name, pc), (_, pn) in zip(cpu.named_parameters(), npu.named_parameters()):
        scale = pc.grad.abs().max().clamp_min(1e-12)
        assert ((pn.grad.cpu() - pc.grad).abs().max() / scale).item() <= 1e-3, name


def test_greedy_generation_gives_the_same_tokens(models):
    cpu, npu, ids = models
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
