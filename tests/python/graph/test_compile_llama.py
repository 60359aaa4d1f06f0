"""The tiny transformers Llama (tests/python/tiny_models.py) through
torch.compile(backend="npu"): logits and every parameter gradient against
eager npu (the unfused subgraphs, op by op) and float64 CPU, with the fusion
patterns that must fire counted. One compile per model (module fixtures)."""
import copy

import pytest
import torch

import npubridge
from tiny_models import llama_config

import transformers

U32 = 2.0 ** -24  # float32 unit roundoff
U_BF16 = 2.0 ** -8  # bfloat16 unit roundoff
LAYERS = 2


def _config(attn):
    return llama_config(num_hidden_layers=LAYERS, attn_implementation=attn)


def _run(model, ids):
    model.zero_grad()
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(_config("sdpa"))
    npu = copy.deepcopy(cpu).npu()
    ids = torch.randint(0, 128, (2, 12))
    npubridge.reset_sdpa_stats()
    compiled = npubridge.compile(npu)
    got = _run(compiled, ids.npu())
    eager = _run(npu, ids.npu())
    ref = _run(cpu.double(), ids)
    return {"compiled": compiled, "got": got, "eager": eager, "ref": ref}


def _assert_near(got, ref64, eager, what):
    # Fused kernels (RMSNorm, SwiGLU, flash attention) evaluate the same
    # math as the unfused float32 ops in another order: the compiled error
    # against float64 must be of eager's size. 2x eager's error plus 16
    # float32 roundings of the largest value (a norm or a softmax row
    # rounded at other points) bounds it; a wrong rewrite is off by O(|ref|).
    err = (got.double().cpu() - ref64).abs().max().item()
    eager_err = (eager.double().cpu() - ref64).abs().max().item()
    bound = 2 * eager_err + 16 * U32 * ref64.abs().max().item()
    assert err <= bound, f"{what}: error {err:.3g} against float64, bound {bound:.3g} (eager's error {eager_err:.3g})"


def test_patterns_fired(llama):
    report = npubridge.compile_report(llama["compiled"])
    assert len(report["graphs"]) == 1  # the whole model in one graph, no break
    # Per layer two RMSNorms and one MLP, plus the final norm: all five
    # norms fuse (HF's form: a float32 upcast first), then the four that
    # read a residual sum take the add in too (add_rms_norm, which also
    # returns the sum for the next residual). HF's SDPA passes a boolean mask.
    assert report["patterns_fired"] == {"rms_norm_upcast": 2 * LAYERS + 1, "add_rms_norm": 2 * LAYERS,
                                        "swiglu": LAYERS, "sdpa_bool_mask": LAYERS}
    parts = report["graphs"][0]["parts"]
    assert set(parts) == {"forward", "backward"}
    text = str(report)
    assert "pattern add_rms_norm: fired x4" in text


def test_compiled_graph_calls_the_fused_ops(llama):
    # AOTAutograd's forward holds the plugin ops the rewrite put in; its
    # backward the plugin's backward ops (from the derivative formulas).
    parts = npubridge.compile_report(llama["compiled"])["graphs"][0]["parts"]
    fw = [n["target"] for n in parts["forward"]["summary"]["nodes"]]
    bw = [n["target"] for n in parts["backward"]["summary"]["nodes"]]
    for op, count in (("npu_rms_norm", 1), ("npu_add_rms_norm", 2 * LAYERS), ("npu_swiglu", LAYERS),
                      ("npu_fusion_attention", LAYERS)):
        assert sum(t.startswith(f"mindspeed_like.{op}.") for t in fw) == count, op
        assert sum(t.startswith(f"mindspeed_like.{op}_backward.") or t.startswith(f"mindspeed_like.{op}_grad.")
                   for t in bw) == count, op


def test_logits_match_eager_and_float64(llama):
    _assert_near(llama["got"][0], llama["ref"][0], llama["eager"][0], "logits")


def test_every_gradient_matches_eager_and_float64(llama):
    grads, egrads, rgrads = llama["got"][1], llama["eager"][1], llama["ref"][1]
    assert set(grads) == set(rgrads)
    for name in rgrads:
        _assert_near(grads[name], rgrads[name], egrads[name], f"grad {name}")


def test_bfloat16_inference_fuses_through_the_casts():
    # HF's RMSNorm upcasts bfloat16 to float32 and casts back before gamma:
    # rms_norm_upcast fuses it on the bfloat16 input (the casts inside).
    torch.manual_seed(3)
    cpu = transformers.LlamaForCausalLM(_config("eager"))
    npu = copy.deepcopy(cpu).to(torch.bfloat16).npu().eval()
    ids = torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        compiled = npubridge.compile(npu)
        got = compiled(ids.npu(), use_cache=False).logits
        eager = npu(ids.npu(), use_cache=False).logits
        ref = cpu.double().eval()(ids, use_cache=False).logits
    report = npubridge.compile_report(compiled)
    assert report["patterns_fired"] == {"rms_norm_upcast": 2 * LAYERS + 1, "add_rms_norm": 2 * LAYERS,
                                        "swiglu": LAYERS}
    # bfloat16 weights and activations: both runs are within a few bfloat16
    # roundings of the float64 model; the fused ones round at other points.
    err = (got.double().cpu() - ref).abs().max().item()
    eager_err = (eager.double().cpu() - ref).abs().max().item()
    assert err <= 2 * eager_err + 4 * U_BF16 * ref.abs().max().item(), (err, eager_err)


def test_reduce_overhead_inference_replays():
    # HF builds its attention mask with bitwise_and (and new_ones): on
    # cann_like kernels the whole inference graph is capturable, so
    # mode="reduce-overhead" replays it instead of running the program.
    torch.manual_seed(4)
    cpu = transformers.LlamaForCausalLM(_config("sdpa")).eval()
    npu = copy.deepcopy(cpu).npu().eval()
    compiled = torch.compile(npu, backend="npu", mode="reduce-overhead")
    ids, ids2 = torch.randint(0, 128, (2, 12)), torch.randint(0, 128, (2, 12))
    with torch.no_grad():
        got = compiled(ids.npu(), use_cache=False).logits
        got2 = compiled(ids2.npu(), use_cache=False).logits  # new inputs reach the replay
        eager = npu(ids.npu(), use_cache=False).logits
        eager2 = npu(ids2.npu(), use_cache=False).logits
        cpu = cpu.double()
        ref, ref2 = cpu(ids, use_cache=False).logits, cpu(ids2, use_cache=False).logits
    (graph,) = npubridge.compile_report(compiled)["graphs"]
    assert graph["reduce_overhead"] == "replayed (npubridge._graphs.graphed_callable)", graph["reduce_overhead"]
    # the fused kernels (RMSNorm, SwiGLU, flash attention) round at other
    # points than eager's ops: the bound of the training test
    _assert_near(got, ref, eager, "replayed logits (first call)")
    _assert_near(got2, ref2, eager2, "replayed logits (second call)")
