"""Hugging Face models with tied weights and other architectures than Llama
(GPT-2, BERT, T5; tiny configs, random weights, nothing downloaded, dropout
off), on npu against the CPU: logits and the gradient of every parameter,
judged by npubridge's error model against the same model in float64; the
tied parameters are still one object after .to("npu"); greedy generation
gives the CPU's tokens."""
import copy
import functools
import os

import pytest
import torch

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_gradients_judged, assert_judged

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

VOCAB = 96


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=1,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager"))


def bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager"))


def t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


MODELS = {"gpt2": gpt2, "bert": bert, "t5": t5}
GENERATES = ("gpt2", "t5")  # causal and seq2seq; BERT is a masked LM


def inputs(name, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, 10), generator=g)
    kw = {"input_ids": ids, "labels": ids}
    if name == "t5":
        kw["labels"] = torch.randint(2, VOCAB, (2, 6), generator=g)
    return {k: v.to(device) for k, v in kw.items()}


def tied_pairs(model):
    """(target, source) parameter names transformers ties in this model."""
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return sorted(keys.items()) if isinstance(keys, dict) else []


@functools.cache
def build(name):
    """(name, the CPU model, its npu copy, its float64 CPU copy)."""
    torch.manual_seed(0)
    cpu = MODELS[name]()
    wide = copy.deepcopy(cpu).double()
    npu = copy.deepcopy(cpu).to("npu")
    return name, cpu, npu, wide


@pytest.fixture(params=list(MODELS))
def models(request):
    return build(request.param)


def test_tied_parameters_stay_one_object(models):
    name, cpu, npu, _ = models
    pairs = tied_pairs(cpu)
    assert pairs, f"{name}: expected tied weights"
    for target, source in pairs:
        assert cpu.get_parameter(target) is cpu.get_parameter(source), (name, target)
        assert npu.get_parameter(target) is npu.get_parameter(source), (name, target, source)
        assert npu.get_parameter(target).device.type == "npu"


def test_logits_match(models):
    name, cpu, npu, wide = models
    for m in (cpu, npu, wide):
        m.eval()
    with torch.no_grad():
        host = cpu(**inputs(name, "cpu")).logits
        got = npu(**inputs(name, "npu")).logits
        ref = wide(**inputs(name, "cpu")).logits
    assert got.device.type == "npu"
    assert_judged(got, host, ref, f"{name} logits")


def test_every_parameter_gets_the_cpus_gradient(models):
    name, cpu, npu, wide = models
    for m in (cpu, npu, wide):
        m.train()
        m.zero_grad(set_to_none=True)
        m(**inputs(name, "npu" if m is npu else "cpu")).loss.backward()
    assert assert_gradients_judged(cpu, npu, wide, name) == sum(1 for _ in cpu.parameters())


@pytest.mark.parametrize("name", GENERATES)
def test_greedy_generation_gives_the_cpus_tokens(name):
    _, cpu, npu, _ = build(name)
    cpu.eval(), npu.eval()
    ids = inputs(name, "cpu")["input_ids"][:1]
    out_cpu = cpu.generate(ids, max_new_tokens=12, do_sample=False)
    out_npu = npu.generate(ids.npu(), max_new_tokens=12, do_sample=False)
    assert out_npu.device.type == "npu"
    assert torch.equal(out_npu.cpu(), out_cpu)
