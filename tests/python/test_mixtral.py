"""A mixture-of-experts model nobody here wrote: Hugging Face transformers'
MixtralForCausalLM with a tiny config (random weights, fixed seed, nothing
downloaded). On npu its experts take transformers' grouped_mm path (histc
of int32 expert ids, torch._grouped_mm), which the CPU does not; the
logits and every parameter's gradient are judged by npubridge's error model
against the same model in float64 on the CPU (conftest.assert_judged), with
no op falling back to the CPU."""

import pytest
import torch

import npubridge
from conftest import assert_gradients_judged, assert_judged, assert_no_fallbacks
from tiny_models import models_to_judge, tiny_config

import transformers


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)
    # The references loop over the experts (transformers' "eager" experts):
    # an independent computation, and ATen's CPU _grouped_mm has no float64.
    cpu = transformers.MixtralForCausalLM(tiny_config(transformers.MixtralConfig, **sizes,
                                                      experts_implementation="eager"))
    npu = transformers.MixtralForCausalLM(tiny_config(transformers.MixtralConfig, **sizes))
    assert npu.config._experts_implementation == "grouped_mm"
    return models_to_judge(cpu, npu, (2, 10))


def test_forward_logits_match(models):
    cpu, npu, wide, ids = models
    cpu.eval(), npu.eval(), wide.eval()
    npubridge.reset_stats()
    with torch.no_grad():
        got, host, ref = npu(ids.npu()).logits, cpu(ids).logits, wide(ids).logits
    assert got.device.type == "npu"
    assert_no_fallbacks()
    stats = npubridge.stats()
    for op in ("aten::histc.out", "aten::_grouped_mm"):  # the experts' path ran natively
        assert sum(stats[op]["native"].values()) == stats[op]["calls"] > 0, (op, stats.get(op))
    assert_judged(got, host, ref, "logits")


def test_gradients_match_with_no_fallback(models):
    cpu, npu, wide, ids = models
    npubridge.reset_stats()
    for m in (cpu, npu, wide):
        m.train()
        m.zero_grad(set_to_none=True)
        dev_ids = ids.npu() if m is npu else ids
        m(dev_ids, labels=dev_ids).loss.backward()
    torch.nn.utils.clip_grad_norm_(npu.parameters(), 1e9)  # the Trainer's clipping: norms only, no change
    assert_no_fallbacks()
    assert assert_gradients_judged(cpu, npu, wide) == sum(1 for _ in cpu.parameters())
