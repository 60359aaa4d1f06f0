"""Whole steps of ordinary Hugging Face models on npu against the same steps on
the CPU, in one process (these machines are noisy: every figure is a ratio of
two measurements taken here, side by side, interleaved).

Tiny-but-real configurations with random weights, built in code (nothing is
downloaded), each large enough that kernels, not Python, dominate a CPU step:
Llama, GPT-2, BERT (sequence classification), ViT (image classification),
ResNet (image classification) and Mixtral (mixture of experts). Per model:

- inference: model.eval(), one forward under torch.no_grad();
- training: model.train() (the configs' own dropout), forward with labels,
  loss.backward(), torch.optim.AdamW's step (its default implementation for
  the device) and zero_grad.

The CPU and npu models start from the same weights. Each sample times a block
of steps on each device in turn, each block after untimed steps (at least
one and at least 25 ms of them; the npu synchronised at both ends; Note
[Samples are blocks of steps, the devices in turn]); the figure is the
median over samples of the per-sample ratio npu/cpu of the mean step times.
Compiled cases compare
torch.compile(backend="npu") with torch.compile() on the CPU (Inductor), the
same way. The per-op breakdown of the slowest eager case comes from
npubridge.profile_compare (python3 -m npubridge profile-compare
bench/bench_models.py CASE shows it for any case).

Usage: python3 bench/bench_models.py results.json [--quick] [--only NAME] [--no-compiled] [--per-step]
(./scripts/bench.sh models)
"""
import argparse
import copy
import json
import math
import os
import statistics
import sys
import warnings

import torch

import npubridge
from npubridge import profile_compare

warnings.filterwarnings("ignore")
THREADS = int(os.environ.get("NPUB_BENCH_THREADS", "2"))  # CPU threads (set NPUB_SIM_THREADS alike)
torch.set_num_threads(THREADS)

import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
VOCAB = 2048


def _tokens(batch, length, labels="lm"):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, length), generator=g)
    if labels == "lm":
        return {"input_ids": ids, "labels": ids}
    return {"input_ids": ids, "labels": torch.randint(0, 4, (batch,), generator=g)}


def _images(batch, size, classes=10):
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(batch, 3, size, size, generator=g),
            "labels": torch.randint(0, classes, (batch,), generator=g)}


def llama():
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg), _tokens(4, 128)


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=256, n_layer=4, n_head=4, n_positions=128)
    return transformers.GPT2LMHeadModel(cfg), _tokens(4, 128)


def bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=1024, max_position_embeddings=128, num_labels=4)
    return transformers.BertForSequenceClassification(cfg), _tokens(8, 128, labels="class")


def vit():
    cfg = transformers.ViTConfig(image_size=64, patch_size=8, hidden_size=256, num_hidden_layers=4,
                                 num_attention_heads=4, intermediate_size=1024, num_labels=10)
    return transformers.ViTForImageClassification(cfg), _images(16, 64)


def resnet():
    cfg = transformers.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                                    layer_type="basic", num_labels=10)
    return transformers.ResNetForImageClassification(cfg), _images(16, 64)


def mixtral():
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=128)
    return transformers.MixtralForCausalLM(cfg), _tokens(4, 128)


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert, "vit": vit, "resnet": resnet, "mixtral": mixtral}


def _build(name):
    torch.manual_seed(0)
    model, batch = MODELS[name]()
    return model, batch


def make_step(device, case="llama-train", compiled=""):
    """One step of CASE (MODEL-infer or MODEL-train) on device; compiled="1"
    wraps the model in torch.compile (backend "npu" on npu, Inductor on the
    CPU). The profile-compare entry point, and what main() times."""
    name, _, mode = case.partition("-")
    if name not in MODELS or mode not in ("infer", "train"):
        raise SystemExit(f"bench_models: case '{case}': expected MODEL-infer or MODEL-train, "
                         f"MODEL one of {', '.join(MODELS)}")
    model, batch = _build(name)
    model = model.to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    run = model
    if compiled:
        torch._dynamo.config.cache_size_limit = 64
        run = torch.compile(model, backend="npu" if device == "npu" else "inductor")
    if mode == "infer":
        model.eval()

        def step():
            with torch.no_grad():
                run(**batch)
        return step
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = run(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


# Note [Samples are blocks of steps, the devices in turn]
# A sample is a block of steps on one device, then a block on the other
# (which goes first alternates), each block opening with untimed steps.
# Blocks, not single steps, because one device's step leaves the other
# device's step slower for reasons that are no part of either: PyTorch's
# OpenMP worker spins for 7-9 ms after every CPU parallel region (libgomp's
# default GOMP_SPINCOUNT), taking the core npu's compute thread needs, and
# each step evicts the other model's weights and activations from the
# caches. With one build, bert-infer read 0.92 interleaved step by step and
# 0.76 in blocks of 5 steps, resnet-infer 1.04 and 0.84-0.87: the figure
# measured the switch, not the step a user runs, whose model stays on one
# device. The untimed steps let the other device's threads go idle and the
# caches refill: at least one step and at least 25 ms of them
# (profile_compare.SETTLE_S): one step of a short case ended inside the
# OpenMP worker's spin. resnet-infer's npu steps right after a CPU block
# took, in order, 11.1, 8.3, 7.9, 8.0 ms (medians of 15 blocks; another run
# 11.3, 7.8, 6.9, 6.7), the CPU's after a npu block 10.2, 8.9, 9.2, 9.6: a
# block after one untimed step still charged its first timed step ~1 ms of
# the other device's. The blocks, alternating, still put the machine's
# drift on both sides of a ratio. --per-step times single steps back to
# back, as before.
def _time_pair(npu_step, cpu_step, samples, warmup, block, counts):
    """Per-sample (npu s, cpu s): the mean step time of a block of `block`
    timed steps per device, after untimed steps (profile_compare.time_blocks);
    the order alternates per sample (block == 0: single steps, no untimed
    step)."""
    for _ in range(warmup):
        npu_step()
        cpu_step()
    counts["npu"] = counts.get("npu", 0) + warmup
    return profile_compare.time_blocks(npu_step, cpu_step, samples, block, counts=counts)


def _case(case, compiled, samples, warmup, block):
    npu_step = make_step("npu", case, "1" if compiled else "")
    cpu_step = make_step("cpu", case, "1" if compiled else "")
    npubridge.reset_stats()
    counts = {}
    pairs = _time_pair(npu_step, cpu_step, samples, warmup, block, counts)
    steps = counts["npu"]  # every npu step run, the untimed ones too
    fallbacks = {op: s["fallbacks"] for op, s in npubridge.stats().items() if s["fallbacks"]}
    ratio = statistics.median(n / c for n, c in pairs)
    return {"case": case, "compiled": compiled, "npu_ms": 1e3 * statistics.median(p[0] for p in pairs),
            "cpu_ms": 1e3 * statistics.median(p[1] for p in pairs), "ratio": ratio, "samples": samples,
            "fallbacks": {op: n / steps for op, n in fallbacks.items()}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("json")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append", default=[], help="a model name (repeatable)")
    parser.add_argument("--no-compiled", action="store_true")
    parser.add_argument("--per-step", action="store_true",
                        help="time single steps, the devices in turn (Note [Samples are blocks of steps, ...])")
    opts = parser.parse_args()
    samples, warmup = (3, 1) if opts.quick else (11, 3)
    block = 0 if opts.per_step else (1 if opts.quick else 3)
    models = opts.only or list(MODELS)
    results = []
    for name in models:
        for mode in ("infer", "train"):
            r = _case(f"{name}-{mode}", False, samples, warmup, block)
            results.append(r)
            print(f"eager    {r['case']:16} npu {r['npu_ms']:8.1f} ms  cpu {r['cpu_ms']:8.1f} ms  "
                  f"ratio {r['ratio']:5.2f}  fallbacks/step {sum(r['fallbacks'].values()):g}", flush=True)
    if not opts.no_compiled and ("llama" in models):
        for mode in ("infer", "train"):
            r = _case(f"llama-{mode}", True, samples, warmup, block)
            results.append(r)
            print(f"compiled {r['case']:16} npu {r['npu_ms']:8.1f} ms  cpu {r['cpu_ms']:8.1f} ms  "
                  f"ratio {r['ratio']:5.2f}", flush=True)
    eager = [r for r in results if not r["compiled"]]
    geomean = math.exp(sum(math.log(r["ratio"]) for r in eager) / len(eager))
    print(f"eager geometric mean npu/cpu {geomean:.2f} over {len(eager)} cases; "
          f"npu faster in {sum(r['ratio'] < 1 for r in eager)}", flush=True)
    slowest = max(eager, key=lambda r: r["ratio"])
    cmp = profile_compare.compare(make_step, (slowest["case"],), steps=3 if opts.quick else 5)
    print(f"\nper-op breakdown of the slowest eager case, {slowest['case']}:")
    print(profile_compare.format_table(cmp, top=10))
    with open(opts.json, "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                   "cpu_threads": torch.get_num_threads(), "npu_threads": _npu_threads(),
                   "samples": samples, "block": block, "settle_ms": 1e3 * profile_compare.SETTLE_S,
                   "warmup": warmup, "eager_geomean": geomean, "results": results,
                   "slowest": {"case": slowest["case"], "breakdown": profile_compare.to_json(cmp, top=10)}},
                  f, indent=1)


def _npu_threads():
    env = os.environ.get("NPUB_SIM_THREADS")
    return int(env) if env else os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
