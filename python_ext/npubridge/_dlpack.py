"""DLPack for npu tensors: ``torch.from_dlpack(t)``, ``t.__dlpack__()`` and
``t.__dlpack_device__()``.

PyTorch's C++ converter already maps PrivateUse1 to DLPack's ``kDLExtDev``
both ways (``torch.utils.dlpack.to_dlpack`` and ``from_dlpack`` of a capsule
work, zero-copy), and ``kDLExtDev`` is the npu's DLPack device type
(``NPUB_DEVICE_NPU`` in plugin_api.h). But ``Tensor.__dlpack_device__``
recognises the backend only under its original name, ``"privateuse1"``: once
it is renamed ``npu`` it raises "Unknown device type npu for Dlpack", and
``torch.from_dlpack`` and every ``__dlpack__`` consumer ask it first.
``install()`` puts a ``__dlpack_device__`` in front of PyTorch's that answers
for npu tensors and hands every other tensor to PyTorch's own.
"""
import torch
from torch.overrides import handle_torch_function, has_torch_function_unary
from torch.utils.dlpack import DLDeviceType

from . import _C

_torch_dlpack_device = torch.Tensor.__dlpack_device__


def _npu_dlpack_device_type() -> DLDeviceType:
    device_type = DLDeviceType(_C.DLPACK_DEVICE_TYPE)
    # ATen's converter (DLConvertor.cpp) turns PrivateUse1 into kDLExtDev and
    # back; the device this method reports must be the one the capsule holds.
    if device_type != DLDeviceType.kDLExtDev:
        raise AssertionError(
            f"npubridge: NPUB_DEVICE_NPU is {int(device_type)}, but PyTorch exports PrivateUse1 tensors as "
            f"kDLExtDev ({int(DLDeviceType.kDLExtDev)})"
        )
    return device_type


def __dlpack_device__(self):
    if has_torch_function_unary(self):
        return handle_torch_function(__dlpack_device__, (self,), self)
    if self.device.type == "npu":
        return (_npu_dlpack_device_type(), self.device.index if self.device.index is not None else 0)
    return _torch_dlpack_device(self)


def install() -> None:
    _npu_dlpack_device_type()  # fails at import, not at the first export, if the two ever differ
    __dlpack_device__.__doc__ = _torch_dlpack_device.__doc__
    torch.Tensor.__dlpack_device__ = __dlpack_device__
