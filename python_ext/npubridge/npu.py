"""``torch.npu``: the device module of npubridge's simulated NPU."""
import contextlib

import torch

from . import _C


def is_available() -> bool:
    return _C.device_count() > 0


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else current_device()


def set_device(device) -> None:
    _C.set_device(_index(device))


@contextlib.contextmanager
def device(device):
    previous = current_device()
    set_device(device)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device=None) -> None:
    _C.synchronize(_index(device) if device is not None else -1)


def manual_seed(seed: int) -> None:
    _C.manual_seed(current_device(), int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _C.manual_seed(i, int(seed))


def memory_stats(device=None) -> dict:
    return _C.memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    _C.empty_cache()


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return False
