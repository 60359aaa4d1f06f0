"""torch_npu.optim: NpuFusedAdamW on mindspeed_like's fused AdamW kernel
(``npu_apply_adam_w``, one call per param group and dtype); the other
torch_npu fused optimizers raise NotImplementedError naming themselves."""
from npubridge.mindspeed.optim import FusedAdamW as _FusedAdamW

from .._not_implemented import OPTIMIZERS as _OPTIMIZERS
from .._not_implemented import stub_class as _stub_class

__all__ = ["NpuFusedAdamW", *_OPTIMIZERS]


class NpuFusedAdamW(_FusedAdamW):
    """torch_npu.optim.NpuFusedAdamW: torch.optim.AdamW's update and state
    (state_dicts load both ways), fused into one plugin call per param group
    and dtype. Arguments as torch.optim.AdamW (``lr=1e-3, betas=(0.9,
    0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False``, keyword
    ``maximize``). Parameters must be npu tensors of float32, float16 or
    bfloat16 when ``step()`` runs."""


for _name in _OPTIMIZERS:
    globals()[_name] = _stub_class(f"torch_npu.optim.{_name}")
del _name
