"""Collectives of npu tensors made under torch.inference_mode() (vLLM's
engine runs its steps under it, and tensor parallelism all-reduces and
all-gathers there): npubridge's staging buffers stay normal tensors, so
gloo's threads may write them (Note [Staging tensors are never inference
tensors])."""
import datetime

import torch
import torch.distributed as dist

from harness import run_ranks


def _collectives_in_inference_mode(rank, world):
    dist.init_process_group("npu", timeout=datetime.timedelta(seconds=30))
    with torch.inference_mode():
        x = torch.full((5,), float(rank + 1), device="npu")
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.full((5,), float(sum(range(1, world + 1)))))
        out = torch.empty(world * 3, device="npu")
        dist.all_gather_into_tensor(out, torch.arange(3, dtype=torch.float32, device="npu") + 10 * rank)
        expected = torch.cat([torch.arange(3, dtype=torch.float32) + 10 * r for r in range(world)])
        assert torch.equal(out.cpu(), expected)
        parts = [torch.empty(2, device="npu") for _ in range(world)]
        dist.all_gather(parts, torch.full((2,), float(rank), device="npu"))
        assert [p.cpu().tolist() for p in parts] == [[float(r)] * 2 for r in range(world)]
    dist.destroy_process_group()


def test_collectives_of_inference_tensors_two_ranks():
    run_ranks(_collectives_in_inference_mode, world_size=2, timeout=120)
