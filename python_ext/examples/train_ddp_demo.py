"""npubridge demo of multi-process training: train_demo.py's model trained by 2 processes with
DistributedDataParallel over the "npu" collective backend, each rank on its own npu and half of
the data, checked against one process training on the whole batch on the CPU.

    torchrun --standalone --nproc_per_node=2 python_ext/examples/train_ddp_demo.py
"""
import os
import sys

# DDP's logger would say, once per rank, that it times only CPU and CUDA devices (read at import).
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DistributedSampler, TensorDataset  # noqa: E402

import npubridge  # noqa: F401,E402  (the npu device and the "npu" backend)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_demo import make_model  # noqa: E402  (the same model)

STEPS = 8
LR = 0.04
N = 256  # samples in the whole batch
# The bounds. DDP's gradient is the mean of two 128-sample means, the reference's one 256-sample
# mean, on other kernels (the npu's GEMMs against the CPU's): the same terms summed in other
# orders. Any order of a sum of n terms is within gamma_n * sum|terms| of the exact sum
# (gamma_n = n u / (1 - n u), u = 2**-24; Higham, "Accuracy and Stability", 4.2), so two orders
# differ by at most 2 gamma_256 ~ 3.1e-5 of the mean |term|.
# - loss: a mean of 256 cross entropies, all >= 0, so sum|terms| / n is the loss itself.
# - weights: plain SGD moves a weight by lr times its gradient, so the two trainings drift apart
#   by at most STEPS * LR * 2 gamma_256 * |terms| ~ 9.8e-6 for |terms| <= 1 (LayerNorm'd
#   activations, softmax errors within 1; the step map of a smooth loss is close to the identity),
#   hence 1e-5; rounding errors mostly cancel (sqrt(n) u), measured ~1e-8 (printed). AdamW would not do: its
#   m / sqrt(v) turns a gradient entry near zero whose sign the rounding flips into a whole lr.
GAMMA = N * 2.0 ** -24 / (1 - N * 2.0 ** -24)
WEIGHT_ATOL = 1e-5


def data():
    torch.manual_seed(0)
    return torch.randn(N, 16), torch.randint(0, 4, (N,))


def train_reference(init_state, x, y):
    """One process, the whole batch, on the CPU: the independent reference."""
    model = make_model()
    model.load_state_dict(init_state)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.set_num_threads(1)  # one compute thread per process: the ranks share the machine's cores
    torch.npu.set_device(local_rank % torch.npu.device_count())
    device = torch.device("npu", torch.npu.current_device())
    dist.init_process_group("npu", device_id=device)  # the rank's device, for barrier()

    x, y = data()
    # DistributedSampler's split (no shuffle): rank r takes samples r, r + world, ...; with equal
    # shards, DDP's average of the ranks' mean gradients is the whole batch's mean gradient.
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=False)
    idx = torch.tensor(list(sampler))
    xs, ys = x[idx].to(device), y[idx].to(device)

    torch.manual_seed(0)
    model = make_model()
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    ddp = DDP(model.to(device))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)

    where = torch.tensor([device.index], dtype=torch.int64, device=device)
    everywhere = [torch.empty_like(where) for _ in range(world)]
    dist.all_gather(everywhere, where)
    if rank == 0:
        print(f"{world} ranks, backend {dist.get_backend()}, devices "
              + ", ".join(f"rank {r}: npu:{int(t.item())}" for r, t in enumerate(everywhere))
              + f"; {len(idx)} of {len(x)} samples per rank")

    losses = []
    for step in range(STEPS):
        loss = F.cross_entropy(ddp(xs), ys)
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients across the ranks during backward
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        losses.append(mean.item())
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f} (mean over ranks; rank 0 {loss.item():.6f})")

    # Every rank applied the same averaged gradients to the same weights: identical bit for bit.
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    for r, g in enumerate(gathered):
        torch.testing.assert_close(g.cpu(), flat.cpu(), atol=0, rtol=0, msg=lambda m: f"rank {r}'s weights: {m}")

    if rank == 0:
        ref_losses, ref = train_reference(init_state, x, y)
        for step, (a, b) in enumerate(zip(losses, ref_losses)):
            assert abs(a - b) <= 2 * GAMMA * abs(b), f"step {step}: loss {a} (ddp) vs {b} (1 process)"
        worst = 0.0
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=WEIGHT_ATOL, rtol=0,
                                       msg=lambda m: f"{name}: {m}")
            worst = max(worst, (p.detach().cpu() - q.detach()).abs().max().item())
        print(f"1 process on the CPU, whole batch: losses {', '.join(f'{v:.6f}' for v in ref_losses[:3])}, ...")
        print(f"DDP on {world} ranks and 1 process agree: losses within 2 gamma_{N} (relative "
              f"{2 * GAMMA:.1e}), weights within {WEIGHT_ATOL} (largest difference {worst:.2e}); "
              f"the ranks' weights are identical")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
