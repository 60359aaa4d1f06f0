"""torch_npu.npu: the device module, which torch_npu also installs as
torch.npu. Here torch.npu is npubridge's (npubridge/npu.py); this module
forwards every name to it and adds torch_npu's own switches, which have
nothing to switch on the simulated device (``set_compile_mode``,
``config.allow_internal_format``). ``import torch_npu`` puts those on
torch.npu as well, where Ascend scripts call them."""
import torch

import npubridge  # noqa: F401  (torch.npu)

from . import amp  # noqa: F401

__all__ = ["set_compile_mode", "is_jit_compile_false", "config", "amp"]


def set_compile_mode(jit_compile: bool = False) -> None:
    """torch_npu chooses between compiled-ahead and just-in-time kernels;
    the plugins' kernels are always compiled ahead. Accepted; recorded."""
    config._jit_compile = bool(jit_compile)


def is_jit_compile_false() -> bool:
    return not config._jit_compile


class config:  # noqa: N801 - torch_npu's name
    """torch_npu.npu.config: ``allow_internal_format`` lets torch_npu keep
    tensors in private layouts (FRACTAL_NZ...); the simulated npu has only
    the plain layout, so it is recorded and has no effect."""

    allow_internal_format = False
    _jit_compile = False


def __getattr__(name):
    return getattr(torch.npu, name)
