"""The npu collective backend answers to "hccl", the name Ascend's stack
and accelerate use for NPU collectives ("npu" stays the npu's default)."""
import torch
import torch.distributed as dist

import npubridge  # noqa: F401


def test_hccl_is_registered_for_npu():
    assert dist.Backend("hccl") == "hccl"
    assert "npu" in dist.Backend.backend_capability["hccl"]
    assert dist.Backend.default_device_backend_map["npu"] == "npu"


def test_init_process_group_hccl_runs_collectives_on_npu(monkeypatch):
    # What accelerate does under torchrun on an NPU: init_process_group("hccl").
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    store = dist.HashStore()
    dist.init_process_group("hccl", store=store, rank=0, world_size=1)
    try:
        x = torch.arange(3.0, device="npu")
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.arange(3.0)) and dist.get_backend() == "hccl"
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("npu"))
        assert type(backend).__name__ == "ProcessGroupNPU"  # npubridge's backend, not another under the name
    finally:
        dist.destroy_process_group()
