"""npubridge.vllm: vLLM on the npu.

- The hardware platform plugin for the real vLLM (platform.py, worker.py,
  attention.py, layers.py, kernels.py): with npubridge installed,
  `vllm.LLM(model=...)` and `vllm serve` run on the npu (pyproject.toml's
  entry points `vllm.platform_plugins` -> register, `vllm.general_plugins`
  -> register_ops).
- _custom_ops: vLLM's attention and KV-cache op names over the vllm_like
  plugin's kernels.
"""
import npubridge  # noqa: F401  (the npu device and the plugins)

PLATFORM = "npubridge.vllm.platform.NpuPlatform"


def register() -> str:
    """vLLM's platform plugin entry point: the npu's Platform class."""
    return PLATFORM


def register_ops() -> None:
    """vLLM's general plugin entry point (every vLLM process calls it): the
    npu's layers (RMSNorm, SiluAndMul, rotary embedding) on vllm_like's ops,
    when the npu is vLLM's platform."""
    from vllm.platforms import current_platform
    if type(current_platform).__module__ + "." + type(current_platform).__qualname__ == PLATFORM:
        from . import layers  # noqa: F401  (registers them with CustomOp.register_oot)

