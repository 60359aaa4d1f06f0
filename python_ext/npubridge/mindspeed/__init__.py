"""npubridge.mindspeed: faster, lighter training on the npu with the
mindspeed_like plugin's fused kernels (the role of Ascend's MindSpeed).

    import npubridge.mindspeed
    model.to("npu")
    npubridge.mindspeed.patch()   # transformers Llama / Qwen2 on the fused kernels
    optimizer = npubridge.mindspeed.FusedAdamW(model.parameters(), lr=1e-4)

- functional API with torch_npu's names (npu_rms_norm, npu_add_rms_norm,
  npu_rotary_mul, npu_rotary_position_embedding, npu_swiglu,
  npu_fusion_attention, npu_matmul_add_fp32), autograd included;
- FusedAdamW: torch.optim.AdamW's numbers, one kernel call per param group;
- patch() / unpatch() / patched() / features(): named features with
  optimisation levels, over a patch manager (register_patch, apply_patches,
  remove_patches) that also rebinds copies made by ``from x import f``.
"""
import npubridge  # noqa: F401  (the npu device and the plugins)

from . import transformers_patches as _transformers_patches
from .functional import (npu_add_rms_norm, npu_fusion_attention, npu_matmul_add_fp32, npu_rms_norm, npu_rotary_mul,
                         npu_rotary_position_embedding, npu_swiglu)
from .optim import FusedAdamW
from .patch import (PatchError, PatchManager, apply_patches, define_features, features, patch, patched, register_patch,
                    remove_patches, unpatch)

define_features(_transformers_patches.FEATURES)

__all__ = [
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_rotary_position_embedding", "npu_swiglu",
    "npu_fusion_attention", "npu_matmul_add_fp32", "FusedAdamW", "patch", "unpatch", "patched", "features",
    "register_patch", "apply_patches", "remove_patches", "PatchManager", "PatchError"
]
