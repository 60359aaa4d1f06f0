"""torch_npu.npu.amp: torch.npu.amp (npubridge/_npu_amp.py)."""
from npubridge._npu_amp import GradScaler, autocast, custom_bwd, custom_fwd  # noqa: F401

__all__ = ["GradScaler", "autocast", "custom_fwd", "custom_bwd"]
