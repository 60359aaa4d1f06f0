"""npubridge's torch_npu compatibility package (distribution
``npubridge-torch-npu``), not Ascend's torch_npu.

``import torch_npu`` makes code written for Ascend run on npubridge's
simulated npu: torch.npu is npubridge's device module, the fused operators
(``npu_rms_norm``, ``npu_add_rms_norm``, ``npu_rotary_mul``, ``npu_swiglu``,
``npu_fusion_attention``, ...) run on the mindspeed_like plugin's kernels
with torch_npu's signatures and return values, ``torch_npu.optim.
NpuFusedAdamW`` on its fused AdamW, and ``import
torch_npu.contrib.transfer_to_npu`` sends a CUDA script's ``.cuda()``,
``device="cuda"`` and ``torch.cuda.*`` to the npu. transformers'
``is_torch_npu_available()``, accelerate's ``is_npu_available()`` and peft's
device inference see an NPU. The torch_npu APIs not provided raise
NotImplementedError naming themselves (docs/torch-npu-compat.md).

It refuses to import where Ascend's torch_npu is installed too (_guard.py).
"""
from ._guard import check_no_real_torch_npu as _check_no_real_torch_npu

_check_no_real_torch_npu()

import torch  # noqa: E402

import npubridge  # noqa: E402,F401  (torch.npu, the plugins)

from . import _C  # noqa: E402,F401
from . import npu  # noqa: E402
from . import optim  # noqa: E402,F401
from ._fused_ops import (  # noqa: E402,F401
    get_npu_format, npu_add_rms_norm, npu_format_cast, npu_fusion_attention, npu_matmul_add_fp32, npu_rms_norm,
    npu_rotary_mul, npu_rotary_position_embedding, npu_swiglu,
)
from ._not_implemented import FUNCTIONS as _NOT_IMPLEMENTED  # noqa: E402
from ._not_implemented import stub as _stub  # noqa: E402

__version__ = "0.1.0"
# Marks this package as npubridge's, for code that must tell it from Ascend's.
__npubridge_compat__ = True

for _name in _NOT_IMPLEMENTED:
    globals()[_name] = _stub(f"torch_npu.{_name}")
del _name

# torch_npu's switches where Ascend scripts call them: torch.npu.<name>.
for _name in ("set_compile_mode", "is_jit_compile_false", "config"):
    if not hasattr(torch.npu, _name):
        setattr(torch.npu, _name, getattr(npu, _name))
del _name


def _npu_format_cast_method(self, acl_format):
    return npu_format_cast(self, acl_format)


# torch_npu's Tensor method of the same name.
if not hasattr(torch.Tensor, "npu_format_cast"):
    torch.Tensor.npu_format_cast = _npu_format_cast_method
