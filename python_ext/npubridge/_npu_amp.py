"""``torch.npu.amp``: autocast and GradScaler for the npu, as torch_npu
spells them (``torch.npu.amp.GradScaler()``, ``torch.npu.amp.autocast()``).

torch.cuda.amp's classes are deprecated aliases of torch.amp's that warn on
every construction; torch_npu's are not deprecated, and accelerate builds
``torch.npu.amp.GradScaler(**kwargs)`` for every fp16 run on an NPU. These
follow torch_npu: no warning, the npu device fixed, torch.amp underneath
(the same scaling, unscaling and inf/NaN step skipping as on the CPU and
CUDA; GradScaler's two ATen ops run where the npu serves them).
"""
import functools

import torch

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 - torch's name
    """``torch.autocast("npu", ...)`` with torch.cuda.amp.autocast's
    arguments; the default dtype is float16, as there."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("npu", ...)`` with torch_npu's arguments.

    ``dynamic=False`` (torch_npu's static loss scale) keeps the scale at
    ``init_scale``: steps whose gradients hold inf or NaN are still skipped,
    but the scale never grows or backs off."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, dynamic: bool = True):
        if not isinstance(dynamic, bool):
            raise TypeError(f"torch.npu.amp.GradScaler: expected dynamic to be a bool but found "
                            f"{type(dynamic).__name__} {dynamic!r}")
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    def update(self, new_scale=None) -> None:
        if not self._dynamic and new_scale is None and self._enabled and self._scale is not None:
            new_scale = self._scale.clone()  # the scale as it is, without a host sync (get_scale() would .item())
        super().update(new_scale)

    def state_dict(self):
        state = super().state_dict()
        if state:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        self._dynamic = state_dict.pop("dynamic", self._dynamic)
        super().load_state_dict(state_dict)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(device_type="npu")``, as torch.cuda.amp.custom_fwd."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """``torch.amp.custom_bwd(device_type="npu")``, as torch.cuda.amp.custom_bwd."""
    if bwd is None:
        return functools.partial(custom_bwd)
    return torch.amp.custom_bwd(bwd, device_type="npu")
