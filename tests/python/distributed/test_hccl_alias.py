"""The npu collective backend answers to "hccl", the name Ascend's stack
and accelerate use for NPU collectives ("npu" stays the npu's default)."""
import datetime

import torch
import torch.distributed as dist

from harness import run_ranks


def test_hccl_is_registered_for_npu():
    import npubridge  # noqa: F401

    assert dist.Backend("hccl") == "hccl"
    assert "npu" in dist.Backend.backend_capability["hccl"]
    assert dist.Backend.default_device_backend_map["npu"] == "npu"


def _allreduce_over_hccl(rank, world):
    dist.init_process_group("hccl", timeout=datetime.timedelta(seconds=30))
    assert dist.get_backend() == "hccl"
    x = torch.full((4,), float(rank + 1), device="npu")
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((4,), float(sum(range(1, world + 1)))))
    dist.destroy_process_group()


def test_allreduce_over_hccl_two_ranks():
    run_ranks(_allreduce_over_hccl, world_size=2, timeout=120)
