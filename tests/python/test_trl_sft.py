"""TRL's SFTTrainer on the npu as a user runs it: with the torch_npu
compatibility package it trains on npu:0 by itself. A tiny Llama (random
weights) and a word-level tokenizer built here (nothing downloaded)
fine-tune on a small text dataset; each step's loss and the trained weights
are judged against the same run on the CPU in float32 and float64
(npubridge's error model, never a fixed tolerance against the CPU), and no
op falls back to the CPU."""
import torch

import npubridge
from conftest import assert_judged, assert_no_fallbacks, import_torch_npu_compat
from tiny_models import llama_config

import_torch_npu_compat()  # before transformers and trl, which decide at import

import datasets  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

STEPS = 4
WORDS = [f"w{i}" for i in range(56)]
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def _tokenizer():
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                                bos_token="[BOS]", eos_token="[EOS]")


def _dataset():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 12, (32,), generator=g)
    texts = [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(n),), generator=g)) for n in lengths]
    return datasets.Dataset.from_dict({"text": texts})


def _model(tokenizer, dtype):
    torch.manual_seed(0)
    cfg = llama_config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, max_position_embeddings=32,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    return transformers.LlamaForCausalLM(cfg).to(dtype)


class _LossRecorder(trl.SFTTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs, **kw)
        self.step_losses.append((loss[0] if return_outputs else loss).detach().double().cpu())
        return loss


def _run(out_dir, use_cpu, dtype=torch.float32):
    tokenizer = _tokenizer()
    args = trl.SFTConfig(output_dir=str(out_dir), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-2,
                         logging_steps=1, save_strategy="no", report_to=[], seed=0, use_cpu=use_cpu, max_length=16,
                         dataloader_num_workers=0, disable_tqdm=True, dataset_num_proc=None)
    trainer = _LossRecorder(model=_model(tokenizer, dtype), args=args, train_dataset=_dataset(),
                            processing_class=tokenizer)
    trainer.step_losses = []
    trainer.train()
    return trainer, torch.stack(trainer.step_losses)


def test_sft_trainer_trains_on_the_npu(tmp_path):
    npubridge.reset_stats()
    npu, npu_losses = _run(tmp_path / "npu", use_cpu=False)
    assert_no_fallbacks("ops the SFTTrainer run sent to the CPU")
    assert npu.args.device == torch.device("npu", 0)
    assert next(npu.model.parameters()).device.type == "npu"
    cpu, cpu_losses = _run(tmp_path / "cpu", use_cpu=True)
    wide, wide_losses = _run(tmp_path / "wide", use_cpu=True, dtype=torch.float64)
    assert len(npu_losses) == STEPS
    assert_judged(npu_losses.float(), cpu_losses.float(), wide_losses, "SFTTrainer losses per step")
    start = dict(_model(_tokenizer(), torch.float32).named_parameters())
    for (name, pn), (_, pc), (_, pw) in zip(npu.model.named_parameters(), cpu.model.named_parameters(),
                                           wide.model.named_parameters()):
        assert not torch.equal(pn.detach().cpu(), start[name].detach()), f"{name} did not train"
        assert_judged(pn.detach(), pc.detach(), pw.detach(), f"{name} after {STEPS} SFT steps")
