"""Hugging Face's Trainer on the npu as a user meets it: with the torch_npu
compatibility package, TrainingArguments() picks npu:0 by itself; a tiny
Llama trains 10 steps in float32 with the default optimizer
(AdamW(fused=True), gradient clipping), its losses judged against the same
run on the CPU and in float64 (npubridge's error model: never a fixed
tolerance against the CPU's float32); a checkpoint is saved and training
resumed from it reproduces the uninterrupted run, dropout included (the
npu's RNG state travels through torch.npu.random); bf16=True trains under
the npu's autocast. Neither run sends an op to the CPU fallback."""
import torch

import npubridge

from conftest import assert_judged, assert_no_fallbacks, import_torch_npu_compat
from tiny_models import llama_config

import_torch_npu_compat()  # before transformers, which decides at import

import transformers  # noqa: E402

STEPS = 10
VOCAB = 64


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n=16, length=12):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(dtype=torch.float32, dropout=0.0):
    torch.manual_seed(0)
    cfg = llama_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, max_position_embeddings=32,
                       attention_dropout=dropout)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


def test_training_arguments_choose_the_npu():
    args = transformers.TrainingArguments(output_dir="unused", report_to=[])
    assert args.device == torch.device("npu", 0)
    assert transformers.TrainingArguments(output_dir="unused", report_to=[], use_cpu=True).device.type == "cpu"


class _LossRecorder(transformers.Trainer):
    """Keeps each training step's loss tensor unrounded, and the run's first
    batch (the Trainer's sampler shuffles)."""

    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        if not self.step_losses:
            self.first_batch = inputs["input_ids"].cpu()
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kw)
        value = loss[0] if return_outputs else loss
        self.step_losses.append(value.detach().double().cpu())
        return loss


def _run(out_dir, model, use_cpu, max_steps=STEPS, resume=None, **overrides):
    """Trains `model`; `overrides` replace or add TrainingArguments."""
    settings = dict(output_dir=str(out_dir), max_steps=max_steps, per_device_train_batch_size=4, learning_rate=1e-2,
                    logging_steps=1, save_strategy="steps", save_steps=2, report_to=[], seed=0, use_cpu=use_cpu,
                    dataloader_num_workers=0, disable_tqdm=True)
    args = transformers.TrainingArguments(**{**settings, **overrides})
    trainer = _LossRecorder(model=model, args=args, train_dataset=_Tokens())
    trainer.step_losses = []
    trainer.train(resume_from_checkpoint=resume)
    return trainer, torch.stack(trainer.step_losses)


def test_fp32_trainer_run_matches_the_cpu(tmp_path):
    npubridge.reset_stats()
    npu_trainer, npu_losses = _run(tmp_path / "npu", _model(), use_cpu=False)
    assert_no_fallbacks("ops the default Trainer step sent to the CPU")
    assert npubridge.stats()["aten::_fused_adamw_"]["calls"] >= STEPS
    assert npu_trainer.args.device.type == "npu"
    assert next(npu_trainer.model.parameters()).device.type == "npu"
    cpu_trainer, cpu_losses = _run(tmp_path / "cpu", _model(), use_cpu=True)
    wide_trainer, wide_losses = _run(tmp_path / "wide", _model(torch.float64), use_cpu=True)
    assert len(npu_losses) == STEPS
    # Each step's loss: the npu's float32 run within a few times the CPU's
    # own float32 error against the float64 run of the same steps.
    assert_judged(npu_losses.float(), cpu_losses.float(), wide_losses, "Trainer losses per step")
    # And the weights it trained to (the optimizer ran STEPS updates).
    start = dict(_model().named_parameters())
    for (name, pn), (_, pc), (_, pw) in zip(npu_trainer.model.named_parameters(), cpu_trainer.model.named_parameters(),
                                           wide_trainer.model.named_parameters()):
        assert not torch.equal(pn.detach().cpu(), start[name].detach()), f"{name} did not train"
        assert_judged(pn.detach(), pc.detach(), pw.detach(), f"{name} after {STEPS} steps")


def test_checkpoint_resume_reproduces_the_run(tmp_path):
    # Attention dropout draws from the npu's generator: resuming reproduces
    # the uninterrupted run's losses only if the checkpoint's npu RNG state
    # (torch.npu.random.get_rng_state) is restored.
    npubridge.reset_stats()
    full, full_losses = _run(tmp_path / "full", _model(dropout=0.3), use_cpu=False, max_steps=4)
    assert_no_fallbacks("ops a Trainer run with attention dropout sent to the CPU")
    ckpt = tmp_path / "full" / "checkpoint-2"
    rng = torch.load(ckpt / "rng_state.pth", weights_only=False)
    assert "npu" in rng and rng["npu"].dtype == torch.uint8
    resumed, resumed_losses = _run(tmp_path / "full", _model(dropout=0.3), use_cpu=False, max_steps=4,
                                   resume=str(ckpt))
    assert len(resumed_losses) == 4 - 2
    assert torch.equal(resumed_losses, full_losses[2:])
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu()), name


def test_torch_npu_fused_optimizer_option(tmp_path):
    # optim="adamw_torch_npu_fused": transformers takes torch_npu.optim.NpuFusedAdamW,
    # which runs mindspeed_like's npu_apply_adam_w (the default optim, AdamW(fused=True), runs its aten::_fused_adamw_).
    import npubridge
    from torch_npu.optim import NpuFusedAdamW

    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                          report_to=[], save_strategy="no", optim="adamw_torch_npu_fused",
                                          disable_tqdm=True)
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=_Tokens())
    npubridge.reset_stats()
    trainer.train()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
    assert isinstance(optimizer, NpuFusedAdamW)
    stats = npubridge.stats()
    assert stats.get("aten::_fused_adamw_", {}).get("fallbacks", 0) == 0
    assert all(p.device.type == "npu" and not torch.equal(p.detach().cpu(), q.detach())
               for p, q in zip(trainer.model.parameters(), _model().parameters()))


def test_bf16_trainer_run_on_the_npu(tmp_path):
    # TrainingArguments(bf16=True) runs the forward under
    # torch.autocast("npu", bfloat16), CUDA's policy (test_autocast.py);
    # attention used to fail here ("Expected query, key, and value to have
    # the same dtype").
    npubridge.reset_stats()
    trainer, losses = _run(tmp_path, _model(), use_cpu=False, bf16=True, save_strategy="no")
    assert_no_fallbacks("ops the bf16 Trainer step sent to the CPU")
    assert trainer.args.device.type == "npu" and trainer.args.bf16
    params = list(trainer.model.parameters())
    assert all(p.device.type == "npu" and p.dtype == torch.float32 for p in params)  # master weights stay float32
    assert len(losses) == STEPS and bool(torch.isfinite(losses).all())
    assert any(not torch.equal(p.detach().cpu(), q.detach()) for p, q in zip(params, _model().parameters()))
    # The first step's loss (the initial weights, the first batch), by the
    # error model: against the CPU's forward under its bfloat16 autocast
    # (for this model's ops, its linear, matmul and attention in bfloat16,
    # as CUDA's policy casts them) and the float64 forward.
    batch = trainer.first_batch
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        host = _model()(input_ids=batch, labels=batch).loss.float()
    with torch.no_grad():
        wide = _model(torch.float64)(input_ids=batch, labels=batch).loss
    assert_judged(losses[0].float().reshape(1), host.reshape(1), wide.reshape(1), "the first bf16 step's loss")
