"""``torch.npu``'s memory functions: statistics, snapshot, summary, the
per-process memory fraction, all read from the simulated device's caching
allocator (device_sim/src/caching_allocator.cpp), with torch.cuda's names
and shapes."""
import collections

import torch

from . import _C
from . import npu as _npu


def memory_stats(device=None) -> dict:
    """torch.cuda.memory_stats' keys ("allocated_bytes.all.current", ...;
    torch.accelerator.memory_stats reads the same allocator), plus the
    allocator's own flat counters ("allocated_bytes", "peak_reserved_bytes",
    "num_allocs", ...)."""
    index = _npu._checked_index(device, "memory_stats")
    stats = collections.OrderedDict(torch.accelerator.memory_stats(torch.device("npu", index)))
    stats.update(_C.memory_stats(index))
    return stats


def memory_allocated(device=None) -> int:
    return _C.memory_stats(_npu._checked_index(device, "memory_allocated"))["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _C.memory_stats(_npu._checked_index(device, "max_memory_allocated"))["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    return _C.memory_stats(_npu._checked_index(device, "memory_reserved"))["reserved_bytes"]


def max_memory_reserved(device=None) -> int:
    return _C.memory_stats(_npu._checked_index(device, "max_memory_reserved"))["peak_reserved_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    _C.reset_peak_memory_stats(_npu._checked_index(device, "reset_peak_memory_stats"))


def _reset_peaks_under_old_name(old_name, device) -> None:
    """torch.cuda's deprecated peak resets, with the same warning: each
    resets every peak statistic (reset_peak_memory_stats)."""
    import warnings

    warnings.warn(f"torch.npu.{old_name} now calls torch.npu.reset_peak_memory_stats, which resets "
                  "/all/ peak memory stats.", FutureWarning, stacklevel=3)
    reset_peak_memory_stats(device)


def reset_max_memory_allocated(device=None) -> None:
    _reset_peaks_under_old_name("reset_max_memory_allocated", device)


def reset_max_memory_cached(device=None) -> None:
    _reset_peaks_under_old_name("reset_max_memory_cached", device)


def memory_cached(device=None) -> int:
    """torch.cuda's old name of memory_reserved."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """torch.cuda's old name of max_memory_reserved."""
    return max_memory_reserved(device)


def empty_cache() -> None:
    _C.empty_cache()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the device, as torch.cuda.mem_get_info: total
    is the capacity (NPUB_SIM_MEMORY), free what the caching allocator has
    not reserved. Like cudaMemGetInfo, it ignores the memory fraction."""
    index = _npu._checked_index(device, "mem_get_info")
    return torch.accelerator.get_memory_info(torch.device("npu", index))


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Limits what this process's caching allocator may reserve on the
    device to fraction * capacity, as torch.cuda's: an allocation beyond it
    raises torch.OutOfMemoryError naming the fraction. The same argument
    checks as torch.cuda (a float in [0, 1])."""
    index = _npu._checked_index(device, "set_per_process_memory_fraction")
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C.set_memory_fraction(index, fraction)


def get_per_process_memory_fraction(device=None) -> float:
    return _C.memory_fraction(_npu._checked_index(device, "get_per_process_memory_fraction"))


def memory_snapshot(device=None) -> list:
    """The caching allocator's segments, as torch.cuda.memory_snapshot lists
    them: per segment device, address, total_size, allocated_size,
    active_size, requested_size, stream (the npu stream id), segment_type
    ("small" or "large") and blocks (address, size, requested_size, state
    "active_allocated" or "inactive"), in address order: every device's,
    as torch.cuda lists them, or the given device's."""
    if device is None:
        return [seg for i in range(_npu.device_count()) for seg in _C.memory_snapshot(i)]
    return _C.memory_snapshot(_npu._checked_index(device, "memory_snapshot"))


def _format_size(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB"):
        if n < 768 * 1024 or unit == "GiB":
            return f"{n:6d} {unit}"
        n //= 1024
    raise AssertionError("unreachable")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the allocator's statistics in torch.cuda.memory_summary's
    layout (current, peak, total allocated, total freed), for the memory
    and the counts the simulated device's allocator keeps. It has one pool
    of statistics, so there are no per-pool rows; `abbreviated` is accepted
    for torch.cuda's signature."""
    index = _npu._checked_index(device, "memory_summary")
    stats = memory_stats(index)
    rows = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "NPU reserved memory", _format_size),
        ("allocation", "Allocations", lambda n: f"{n:10d}"),
        ("active", "Active allocs", lambda n: f"{n:10d}"),
        ("segment", "NPU reserved segments", lambda n: f"{n:10d}"),
    ]
    lines = ["=" * 75, f" PyTorch NPU memory summary, device ID {index}", "-" * 75,
             f"  NPU OOMs: {stats['num_ooms']}  |  capacity: {_npu.get_device_properties(index).total_memory} bytes, "
             f"memory fraction: {get_per_process_memory_fraction(index):g}",
             "=" * 75,
             "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for key, name, fmt in rows:
        values = [stats[f"{key}.all.{field}"] for field in ("current", "peak", "allocated", "freed")]
        lines.append("-" * 75)
        lines.append(f" {name:<21} | " + " | ".join(fmt(v) for v in values) + " ")
    lines.append("=" * 75)
    return "|" + "|\n|".join(lines) + "|\n"
