"""A 2-rank process group over "hccl" (the name accelerate asks for on an
NPU) is npubridge's npu backend and carries npu collectives."""
import datetime

import torch
import torch.distributed as dist

from harness import run_ranks


def _allreduce_over_hccl(rank, world):
    dist.init_process_group("hccl", timeout=datetime.timedelta(seconds=30))
    assert dist.get_backend() == "hccl"
    assert type(dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu"))).__name__ == \
        "ProcessGroupNPU"
    x = torch.full((4,), float(rank + 1), device="npu")
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((4,), float(sum(range(1, world + 1)))))


def test_allreduce_over_hccl_two_ranks():
    run_ranks(_allreduce_over_hccl, world_size=2, timeout=120)
