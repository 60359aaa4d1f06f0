"""npubridge's vLLM hardware platform: the role vllm-ascend's NPUPlatform
plays for Ascend. vLLM finds it through the entry point group
``vllm.platform_plugins`` (pyproject.toml: ``npubridge =
"npubridge.vllm:register"``) and from then on runs its engine on the npu:
the worker (worker.py) puts the model on npu:<local rank>, the attention
backend (attention.py) runs vllm_like's kernels over vLLM's paged KV cache,
and the layers vLLM swaps per platform (RMSNorm, SiluAndMul, rotary
embedding: layers.py) run vllm_like's fused ops.

What the platform settles in check_and_update_config, and why:
- eager execution (no torch.compile, no CUDA graphs): the simulated npu has
  no graph capture, and compiling for it is npubridge's graph mode's job,
  not vLLM's Inductor passes;
- the worker processes start with ``spawn``: a forked child inherits the
  parent's npu runtime threads without the threads themselves ("Cannot
  re-initialize npu in forked subprocess");
- the KV cache's size (Note [The KV cache on a simulated device]).
"""
import os

import torch

from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger(__name__)

ATTENTION_BACKEND = "npubridge.vllm.attention.NpuAttentionBackend"
WORKER = "npubridge.vllm.worker.NpuWorker"

# Note [The KV cache on a simulated device]
# vLLM sizes the KV cache as gpu_memory_utilization (0.9) of the device's
# capacity, less what the model's profile run used. The simulated npu's
# capacity (NPUB_SIM_MEMORY, 16 GiB by default) is a limit, not memory set
# aside: its memory is the host's, and vLLM zeroes the whole cache at start.
# So the worker takes the smaller of vLLM's figure and half of the host
# memory available when it sizes the cache (after the profile run) divided
# among the local workers, and says so in its log; kv_cache_memory_bytes (--kv-cache-memory-bytes) sets the size
# exactly, as on any platform.


class NpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = ""
    dist_backend: str = "npu"  # npubridge.distributed: collectives of npu tensors
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"npu: model dtype {dtype}: vllm_like's kernels take float32, float16 and bfloat16")

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.npu.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"npubridge-sim-{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.npu.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        return float(torch.npu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.npu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.npu.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    def is_sleep_mode_available(self) -> bool:
        return False

    def is_cumem_allocator_available(self) -> bool:
        return False

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's own kernels (vllm._C) are CUDA code; the npu's are
        # vllm_like's, which load with npubridge's runtime.
        import npubridge  # noqa: F401

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from .kernels import triton_overrides
        from vllm.triton_utils.dispatcher import register_kernels
        register_kernels(triton_overrides())

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        # vLLM's selector takes the platform's answer as it is: the platform
        # checks the configuration against what the backend supports, as
        # vLLM's CUDA platform does, so that an unsupported one (MLA, sliding
        # windows on both sides, decode context parallelism, ...) is refused
        # by name instead of running with other semantics.
        from vllm.platforms.interface import DeviceCapability

        from .attention import NpuAttentionBackend
        if selected_backend is not None and getattr(selected_backend, "name", "") != "CUSTOM":
            logger.info("npu: attention backend %s is not available on the npu; using %s", selected_backend.name,
                        ATTENTION_BACKEND)
        reasons = NpuAttentionBackend.validate_configuration(device_capability=DeviceCapability(0, 0),
                                                             **attn_selector_config._asdict())
        if reasons:
            raise ValueError(f"npu attention (vllm_like::flash_attn_varlen) does not support this configuration: "
                             f"{'; '.join(reasons)} ({attn_selector_config!r})")
        return ATTENTION_BACKEND

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # torch.distributed over the device group, whose backend is "npu".
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        # Note [spawn, never fork]: set before vLLM starts its engine core
        # and workers (the engine's processes read it when they start).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

        compilation = vllm_config.compilation_config
        if compilation.mode != CompilationMode.NONE:
            logger.info("npu: running eagerly (compilation mode %s -> NONE)", compilation.mode)
        compilation.mode = CompilationMode.NONE
        # Eager, vLLM's custom-op layers are on ("all"): the npu's versions
        # (layers.py) are what run the fused ops. A compile backend named by
        # the user made vLLM pick "none" before this point; the user's own
        # "+op"/"-op" choices stay.
        compilation.custom_ops = ["all" if c == "none" else c for c in compilation.custom_ops]
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
        if vllm_config.model_config is not None:
            vllm_config.model_config.enforce_eager = True

        cache = vllm_config.cache_config
        if not cache.user_specified_block_size:
            cache.block_size = 16

        scheduler = vllm_config.scheduler_config
        scheduler.async_scheduling = False

        if vllm_config.speculative_config is not None:
            raise ValueError("npu: speculative decoding is not supported (its draft and rejection kernels are "
                             "Triton code with no npu version)")
        from vllm.triton_utils import HAS_TRITON
        if HAS_TRITON:
            # vLLM then sends the sampler's top-k/top-p and other steps to
            # Triton kernels, which cannot take npu tensors.
            raise RuntimeError("npu: vLLM found a usable Triton (a GPU driver is active), whose kernels cannot run on "
                               "npu tensors; run without GPUs visible, or leave npubridge out with VLLM_PLUGINS")
        if getattr(vllm_config, "use_v2_model_runner", False):
            raise ValueError("npu: vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1) is not supported; the npu "
                             "worker runs the V1 runner")

        parallel = vllm_config.parallel_config
        if parallel.data_parallel_size > 1:
            raise ValueError(f"npu: data parallelism ({parallel.data_parallel_size}) is not supported; tensor "
                             f"parallelism is (one npu per rank)")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        if getattr(parallel, "enable_dbo", False):
            parallel.enable_dbo = False
        parallel.disable_custom_all_reduce = True
