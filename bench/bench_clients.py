"""Hugging Face clients on npu against the same clients on the CPU, in one
process and run (these machines are noisy: each figure is a ratio of two
measurements taken here, side by side, interleaved).

- a tiny Llama (2 layers, vocabulary 256, hidden size 32 or 128, batches of
  8 x 64 tokens) trained by transformers' Trainer with its defaults (float32,
  torch.optim.AdamW(fused=True), gradient clipping at 1.0): the time of one
  training step, npu against use_cpu=True;
- the same with bf16=True (autocast), and a PEFT LoRA adapter on the same
  model.

A step is timed from the Trainer's on_step_begin to on_step_end, with the
npu synchronised at both ends; the median over the measured steps (after
warm-up steps) is a round's figure, and a case's ratio is the median of its
rounds' ratios npu / CPU (the devices go first in turn). The npu runs also count the calls that fell back
to the CPU per step: the target is none.

Usage: python3 bench/bench_clients.py results.json [--quick]
(./scripts/bench.sh clients; the torch_npu compatibility package must be
importable, as after `pip install --no-build-isolation ./compat/torch_npu`:
it is what makes TrainingArguments choose the npu).
"""
import argparse
import json
import statistics
import tempfile
import time
import warnings

import torch

import npubridge

warnings.filterwarnings("ignore")
torch.set_num_threads(2)

try:
    import torch_npu  # noqa: F401  (before transformers, which decides at import)
except ImportError as e:
    raise SystemExit(f"bench_clients: the torch_npu compatibility package is not importable ({e}); "
                     "install it with: pip install --no-build-isolation ./compat/torch_npu")

import transformers  # noqa: E402

VOCAB = 256
TARGET = 1.2  # npu step time / CPU step time, the default Trainer step (issue #28)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n, length):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(hidden=128):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _lora(model):
    import peft

    cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return peft.get_peft_model(model, cfg)


class _StepTimer(transformers.TrainerCallback):
    def __init__(self, on_npu):
        self.on_npu, self.times, self.fallbacks, self._t = on_npu, [], [], None

    def _sync(self):
        if self.on_npu:
            torch.npu.synchronize()

    def on_step_begin(self, args, state, control, **kw):
        self._sync()
        if self.on_npu:
            npubridge.reset_stats()
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._sync()
        self.times.append(time.perf_counter() - self._t)
        if self.on_npu:
            self.fallbacks.append({op: s["fallbacks"] for op, s in npubridge.stats().items() if s["fallbacks"]})


def _train(make_model, on_npu, steps, warmup, **overrides):
    """Median step time (s) after `warmup` steps, and the fallbacks of the
    last step on npu."""
    timer = _StepTimer(on_npu)
    with tempfile.TemporaryDirectory() as out:
        settings = dict(output_dir=out, max_steps=warmup + steps, per_device_train_batch_size=8, learning_rate=1e-3,
                        logging_steps=10_000, save_strategy="no", report_to=[], seed=0, use_cpu=not on_npu,
                        dataloader_num_workers=0, disable_tqdm=True)
        args = transformers.TrainingArguments(**{**settings, **overrides})
        assert args.device.type == ("npu" if on_npu else "cpu"), f"the Trainer chose {args.device}"
        trainer = transformers.Trainer(model=make_model(), args=args, train_dataset=_Tokens(8 * (warmup + steps), 64),
                                       callbacks=[timer])
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # its end-of-run summary line
        trainer.train()
    return statistics.median(timer.times[warmup:]), (timer.fallbacks[-1] if timer.fallbacks else {})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("json")
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    steps, warmup, rounds = (4, 2, 1) if opts.quick else (10, 3, 5)

    cases = [
        ("Trainer step, tiny Llama (hidden 32), defaults (fp32, fused AdamW)", lambda: _model(32), {}, TARGET),
        ("Trainer step, tiny Llama (hidden 128), defaults (fp32, fused AdamW)", _model, {}, TARGET),
        ("Trainer step, tiny Llama, bf16=True", _model, {"bf16": True}, None),
        ("Trainer step, tiny Llama + PEFT LoRA", lambda: _lora(_model()), {}, None),
    ]
    results = []
    for name, make, overrides, target in cases:
        # Rounds interleave the two devices, which go first in turn, so that
        # a slow spell of the machine falls on both; each round's figure is
        # a median of steps, and the ratio is the median of the rounds'
        # ratios (one slow round on one side moved a ratio of medians by
        # up to 80%).
        npu_t, cpu_t, fallbacks = [], [], {}
        for r in range(rounds):
            if r % 2:
                cpu_t.append(_train(make, False, steps, warmup, **overrides)[0])
            t, fallbacks = _train(make, True, steps, warmup, **overrides)
            npu_t.append(t)
            if not r % 2:
                cpu_t.append(_train(make, False, steps, warmup, **overrides)[0])
        tn, tc = statistics.median(npu_t), statistics.median(cpu_t)
        ratio = statistics.median(n / c for n, c in zip(npu_t, cpu_t))
        verdict = "" if target is None else f" (target <= {target}) {'ok' if ratio <= target else 'MISSED'}"
        print(f"{name:70} npu {tn * 1e3:8.2f} ms  cpu {tc * 1e3:8.2f} ms  ratio {ratio:5.2f}{verdict}"
              f"  fallbacks/step {sum(fallbacks.values())} {fallbacks or ''}", flush=True)
        results.append({"name": name, "npu_ms": tn * 1e3, "cpu_ms": tc * 1e3, "ratio": ratio, "target": target,
                        "fallbacks_per_step": fallbacks})
    with open(opts.json, "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "threads":
                   torch.get_num_threads(), "steps": steps, "warmup": warmup, "rounds": rounds,
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
