"""The training script of test_accelerate_launch.py, written as a Hugging Face
user writes one for any device: `accelerate launch accelerate_train.py OUT`.

A tiny Llama (random weights, seed 0) trains with AdamW on the rows of a
fixed token table, in order, per_rank rows per process and step. The main
process saves each step's loss averaged over the ranks, the trained weights
and what each rank saw (its device, the distributed type, the backend) to
OUT with torch.save."""
import sys

import torch

import torch_npu  # noqa: F401  (npubridge's compatibility package: accelerate finds the npu)
from accelerate import Accelerator

import transformers

VOCAB, ROWS, LENGTH, PER_RANK, LR = 64, 16, 12, 2, 1e-2


def tokens():
    return torch.randint(0, VOCAB, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))


def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg)


def main(out):
    acc = Accelerator()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens()), batch_size=PER_RANK, shuffle=False)
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    net, opt, loader = acc.prepare(net, opt, loader)
    seen = {"device": str(acc.device), "distributed_type": str(acc.distributed_type),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "param_device": str(next(net.parameters()).device), "batch_device": None}
    losses = []
    for (ids,) in loader:
        seen["batch_device"] = str(ids.device)
        loss = net(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.gather(loss.detach()).double().mean().cpu())
    everyone = acc.gather_for_metrics([seen], use_gather_object=True)
    if acc.is_main_process:
        weights = {k: v.detach().cpu() for k, v in acc.unwrap_model(net).state_dict().items()}
        torch.save({"losses": torch.stack(losses), "weights": weights, "ranks": everyone,
                    "num_processes": acc.num_processes}, out)
    acc.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
