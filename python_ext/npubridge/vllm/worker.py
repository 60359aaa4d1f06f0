"""The npu's vLLM worker and model runner: vLLM's GPU worker and model runner
with the device, the memory figures and the streams of the npu.

vLLM's GPU classes are written against torch.cuda; what differs on the npu:
- init_device: npu:<local rank>, the "npu" collective backend
  (npubridge.distributed) for tensor parallelism;
- determine_available_memory: the KV cache's size (Note [The KV cache on a
  simulated device], platform.py);
- the model runner's streams and events are torch.npu's, created while it
  is built (the only place the eager path asks for them).
"""
import contextlib
import gc
import os

import torch

from vllm.logger import init_logger
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

import npubridge  # noqa: F401  (the npu device, its plugins and the "npu" collective backend)

logger = init_logger(__name__)


@contextlib.contextmanager
def _npu_streams():
    """torch.cuda's Stream and Event, and torch.Event, as the npu's while vLLM's
    GPU model runner builds its copy streams and events."""
    saved = (torch.cuda.Stream, torch.cuda.Event, torch.Event)
    torch.cuda.Stream, torch.cuda.Event = torch.npu.Stream, torch.npu.Event
    torch.Event = torch.npu.Event
    try:
        yield
    finally:
        torch.cuda.Stream, torch.cuda.Event, torch.Event = saved


class NpuModelRunner(GPUModelRunner):

    def __init__(self, vllm_config, device: torch.device):
        with _npu_streams():
            super().__init__(vllm_config, device)

    def _sync_device(self) -> None:
        torch.npu.synchronize(self.device)


class NpuWorker(Worker):

    def init_device(self):
        self.device = torch.device("npu", self.local_rank)
        if self.local_rank >= torch.npu.device_count():
            raise RuntimeError(f"npu: worker {self.rank} needs npu:{self.local_rank} but the simulated npu has "
                               f"{torch.npu.device_count()} devices (NPUB_SIM_DEVICES sets the count)")
        torch.npu.set_device(self.device)
        from vllm.platforms import current_platform
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.npu.empty_cache()
        self._init_workspace_and_model_runner()

    # npubridge's per-op counters of this worker's process, for
    # `llm.collective_rpc("npu_stats")`: calls, kernels and CPU fallbacks
    # per op (npubridge.stats()), so that a user (and the tests) can see
    # that a serving step ran on the npu's kernels.
    def npu_stats(self) -> dict:
        return npubridge.stats()

    def npu_reset_stats(self) -> None:
        npubridge.reset_stats()

    def npu_device(self) -> str:
        return str(self.device)

    def _make_model_runner(self):
        return NpuModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        return contextlib.nullcontext()

    def sleep(self, level: int = 1) -> None:
        raise RuntimeError("npu: sleep mode is not supported (the simulated npu has no memory pool to release)")

    def wake_up(self, tags=None) -> None:
        raise RuntimeError("npu: sleep mode is not supported (the simulated npu has no memory pool to release)")

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache (Note [The KV cache on a simulated device])."""
        from vllm.config import set_current_vllm_config
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.profile_run()
        if self.cache_config.kv_cache_memory_bytes:
            return int(self.cache_config.kv_cache_memory_bytes)
        torch.npu.synchronize(self.device)
        total = torch.npu.get_device_properties(self.device).total_memory
        peak = torch.npu.max_memory_allocated(self.device)
        by_device = int(total * self.cache_config.gpu_memory_utilization) - peak
        host = _host_available_bytes() // (2 * max(1, self.parallel_config.local_world_size))
        kv = min(by_device, host)
        if kv <= 0:
            raise ValueError(f"npu: no memory left for the KV cache on {self.device}: capacity {total} bytes x "
                             f"gpu_memory_utilization {self.cache_config.gpu_memory_utilization} less the profile "
                             f"run's peak {peak} bytes is {by_device} bytes (NPUB_SIM_MEMORY sets the capacity; "
                             f"kv_cache_memory_bytes sets the cache's size)")
        logger.info("npu: KV cache of %.2f GiB on %s (device figure %.2f GiB, half the host's available memory "
                    "per local worker %.2f GiB)", kv / 2**30, self.device, by_device / 2**30, host / 2**30)
        return kv

    def compile_or_warm_up_model(self):
        from vllm.v1.worker.worker_base import CompilationTimes
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=0.0, encoder=0.0)


def _host_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
