"""DLPack on npu tensors (npubridge/_dlpack.py): torch.from_dlpack, the
__dlpack__/__dlpack_device__ protocol and capsules from another producer,
zero-copy both ways (a write through one view is read through the other)."""
import ctypes

import torch
from torch.utils.dlpack import DLDeviceType

import npubridge  # noqa: F401

NPUB_DEVICE_NPU = 12  # plugin_api.h


def test_the_npu_dlpack_device_is_npub_device_npu_and_the_index():
    x = torch.zeros(3, device="npu:1")
    assert npubridge._C.DLPACK_DEVICE_TYPE == NPUB_DEVICE_NPU
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1) == (NPUB_DEVICE_NPU, 1)
    assert torch._C._torchDeviceToDLDevice(torch.device("npu:1")) == (NPUB_DEVICE_NPU, 1)
    # Other devices still get PyTorch's answer.
    assert torch.zeros(1).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)


def test_from_dlpack_of_an_npu_tensor_shares_its_memory():
    x = torch.arange(12.0).reshape(3, 4).to("npu:1")
    y = torch.from_dlpack(x)
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    assert y.shape == x.shape and y.stride() == x.stride()
    y[1, 2] = -5.0  # written through the import, read through the original
    x[0, 0] = 42.0  # and the other way
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1, 2], expected[0, 0] = -5.0, 42.0
    assert torch.equal(x.cpu(), expected) and torch.equal(y.cpu(), expected)


def test_dunder_dlpack_capsules_round_trip_strided_views():
    base = torch.arange(24, dtype=torch.int32).reshape(4, 6).to("npu")
    view = base[1:, ::2]  # offset and non-unit strides
    for kwargs in ({}, {"max_version": (1, 0)}):
        capsule = view.__dlpack__(**kwargs)
        back = torch.from_dlpack(capsule)
        assert back.device == view.device and back.data_ptr() == view.data_ptr()
        assert back.stride() == view.stride()
        back.add_(1000)
        assert torch.equal(view.cpu(), back.cpu())
    assert base.cpu()[0].tolist() == list(range(6))  # outside the view: untouched
    assert base.cpu()[1, 0].item() == 6 + 2000


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class ForeignProducer:
    """Another library's view of npu memory: a DLPack 0.x producer written
    with ctypes (no torch), exporting `numel` float32s at `address` on
    npu:`device_id` as a 1-d array, counting its deleter's calls."""

    def __init__(self, address, numel, device_id):
        self.shape = (ctypes.c_int64 * 1)(numel)
        self.deleted = 0
        self._deleter = _Deleter(self._delete)
        self.managed = _DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.device = address, _DLDevice(NPUB_DEVICE_NPU, device_id)
        t.ndim, t.dtype, t.shape, t.strides, t.byte_offset = 1, _DLDataType(2, 32, 1), self.shape, None, 0
        self.managed.deleter = self._deleter
        self.device = (NPUB_DEVICE_NPU, device_id)

    def _delete(self, _):
        self.deleted += 1

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


def test_a_capsule_of_another_producer_with_the_npu_device_type_imports_as_an_npu_tensor():
    owner = torch.zeros(8, device="npu:1")  # the memory the foreign library "owns"
    producer = ForeignProducer(owner.data_ptr(), 8, 1)
    for source in (producer, producer.__dlpack__()):  # the protocol, then a bare capsule
        imported = torch.from_dlpack(source)
        assert imported.device == torch.device("npu:1") and imported.data_ptr() == owner.data_ptr()
        imported[3] = 7.5  # written by torch, seen by the owner
        owner[5] = -2.0  # written by the owner, seen by torch
        assert imported.cpu().tolist() == [0, 0, 0, 7.5, 0, -2.0, 0, 0]
        del imported
    assert producer.deleted == 2  # torch released each import exactly once
