"""torch.npu's memory calls as torch.cuda has them, read from the simulated
device's caching allocator: mem_get_info, memory_stats' torch.cuda keys,
memory_snapshot, memory_summary, and set_per_process_memory_fraction, which
really limits what the process may allocate."""
import pytest
import torch

import npubridge  # noqa: F401
from conftest import Zygote

MiB = 1 << 20


@pytest.fixture(scope="module")
def run():
    """Runs code with the given settings in a process of its own, for
    devices of their own size, and returns its stdout once it exited with
    0: a child forked from a fresh interpreter that imported torch (a
    zygote, conftest.py), which starts its own runtime with those settings."""
    with Zygote() as zygote:
        def run_child(code, **env):
            r = zygote.run(code, **env)
            assert r.returncode == 0, r.stderr
            return r.stdout

        yield run_child


def test_mem_get_info_is_the_capacity_and_what_the_allocator_has_not_reserved():
    torch.npu.empty_cache()
    free, total = torch.npu.mem_get_info(0)
    assert total == torch.npu.get_device_properties(0).total_memory
    assert free == total - torch.npu.memory_reserved(0)
    x = torch.empty(12 * MiB // 4, device="npu:0")  # 12 MiB: a segment of its own (over 10 MiB)
    free_after, _ = torch.npu.mem_get_info("npu:0")
    assert free - free_after == 12 * MiB
    assert free_after == total - torch.npu.memory_reserved(0)
    del x
    torch.npu.empty_cache()
    assert torch.npu.mem_get_info(0) == (free, total)


def test_memory_stats_have_torch_cudas_keys_with_the_allocators_values():
    x = torch.empty(1000, device="npu:0")
    s = torch.npu.memory_stats(0)
    assert s["allocated_bytes.all.current"] == s["allocated_bytes"] == torch.npu.memory_allocated(0)
    assert s["reserved_bytes.all.current"] == s["reserved_bytes"] == torch.npu.memory_reserved(0)
    assert s["allocated_bytes.all.peak"] == torch.npu.max_memory_allocated(0)
    assert s["reserved_bytes.all.peak"] == torch.npu.max_memory_reserved(0)
    del x


def test_num_ooms_counts_each_refused_allocation_of_its_device(run):
    out = run(
        """
        import torch, npubridge
        MiB = 1 << 20
        def ooms(d):
            return torch.npu.memory_stats(d)["num_ooms"]
        print(ooms(0), ooms(1))
        for _ in range(2):  # over the capacity
            try:
                torch.empty(65 * MiB, dtype=torch.uint8, device="npu:0")
            except torch.OutOfMemoryError:
                pass
        print(ooms(0), ooms(1))
        torch.npu.set_per_process_memory_fraction(0.25, 1)  # 16 of 64 MiB
        try:  # under the capacity, over the fraction
            torch.empty(17 * MiB, dtype=torch.uint8, device="npu:1")
        except torch.OutOfMemoryError:
            pass
        x = torch.empty(8 * MiB, dtype=torch.uint8, device="npu:1")  # fits: no OOM
        print(ooms(0), ooms(1))
        """,
        NPUB_SIM_MEMORY="64M", NPUB_SIM_DEVICES="2")
    assert out.splitlines() == ["0 0", "2 0", "2 1"]


def test_memory_snapshot_lists_the_caching_allocators_segments_and_blocks():
    torch.npu.empty_cache()
    x = torch.empty(1000, device="npu:1")  # 4000 bytes: a small (2 MiB) segment, block rounded to 4096
    y = torch.empty(3 * MiB // 4, device="npu:1")  # 3 MiB: a large (20 MiB) segment
    segments = torch.npu.memory_snapshot("npu:1")
    assert sum(s["total_size"] for s in segments) == torch.npu.memory_reserved(1)
    assert sum(s["allocated_size"] for s in segments) == torch.npu.memory_allocated(1)
    assert [s["address"] for s in segments] == sorted(s["address"] for s in segments)
    blocks = {b["address"]: (s, b) for s in segments for b in s["blocks"]}
    for t, size, requested, kind, seg_size in ((x, 4096, 4000, "small", 2 * MiB), (y, 3 * MiB, 3 * MiB, "large", 20 * MiB)):
        seg, block = blocks[t.data_ptr()]
        assert (block["size"], block["requested_size"], block["state"]) == (size, requested, "active_allocated")
        assert (seg["segment_type"], seg["total_size"], seg["device"]) == (kind, seg_size, 1)
    for seg in segments:  # blocks tile their segment
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["blocks"][0]["address"] == seg["address"]
    freed = {x.data_ptr(), y.data_ptr()}
    del x, y, t, seg, block, blocks
    after = torch.npu.memory_snapshot(1)
    assert not [b for s in after for b in s["blocks"] if b["address"] in freed and b["state"] != "inactive"]
    torch.npu.empty_cache()  # releases every segment without a live block
    after = torch.npu.memory_snapshot(1)
    assert all(any(b["state"] == "active_allocated" for b in s["blocks"]) for s in after)
    assert sum(s["total_size"] for s in after) == torch.npu.memory_reserved(1)
    # With no device: every device's segments, as torch.cuda.memory_snapshot.
    z = torch.empty(10, device="npu:0")
    assert torch.npu.memory_snapshot() == torch.npu.memory_snapshot(0) + torch.npu.memory_snapshot(1)
    assert 0 in {s["device"] for s in torch.npu.memory_snapshot()}
    del z


def test_memory_summary_reports_the_allocators_figures():
    torch.npu.empty_cache()
    x = torch.empty(12 * MiB // 4, device="npu:0")
    text = torch.npu.memory_summary(0)
    assert "PyTorch NPU memory summary, device ID 0" in text
    row = next(line for line in text.splitlines() if "Allocated memory" in line)
    value, unit = row.split("|")[2].split()
    # torch.cuda.memory_summary's units: the largest that keeps the value >= 768.
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    assert int(value) == torch.npu.memory_allocated(0) // scale
    assert int(value) >= 768 or unit == "B"
    segments = next(line for line in text.splitlines() if "NPU reserved segments" in line)
    assert int(segments.split("|")[2]) == len(torch.npu.memory_snapshot(0))
    del x


def test_set_per_process_memory_fraction_limits_allocations_with_a_clear_oom(run):
    out = run(
        """
        import torch, npubridge
        MiB = 1 << 20
        assert torch.npu.get_per_process_memory_fraction(0) == 1.0
        torch.npu.set_per_process_memory_fraction(0.25, 0)  # 16 of 64 MiB
        a = torch.empty(12 * MiB // 4, device="npu:0")
        try:
            torch.empty(6 * MiB // 4, device="npu:0")  # 18 MiB would be reserved
            print("no error")
        except torch.OutOfMemoryError as e:
            print("OOM:", e)
        b = torch.empty(6 * MiB // 4, device="npu:1")  # the other device is not limited
        torch.npu.set_per_process_memory_fraction(1.0, "npu:0")
        c = torch.empty(6 * MiB // 4, device="npu:0")  # fits again
        print("after:", torch.npu.memory_allocated(0) // MiB)
        """,
        NPUB_SIM_MEMORY="64M")
    lines = out.splitlines()
    assert lines[0] == (
        "OOM: npu:0 out of memory: tried to allocate 6.00 MiB; the device has a capacity of 64.00 MiB (this "
        "process may use 16.00 MiB of it: set_per_process_memory_fraction(0.25)), of which 12.00 MiB is allocated "
        "and 12.00 MiB is reserved by the caching allocator (0 bytes cached and free). Free tensors, call "
        "empty_cache(), or raise the memory fraction.")
    assert lines[1] == "after: 18"


def test_the_fraction_releases_the_cache_before_it_refuses(run):
    out = run(
        """
        import torch, npubridge
        MiB = 1 << 20
        a = torch.empty(30 * MiB // 4, device="npu:0")
        del a  # 30 MiB reserved, cached and free
        torch.npu.set_per_process_memory_fraction(0.5, 0)  # 32 of 64 MiB
        b = torch.empty(24 * MiB // 4, device="npu:0")  # the cached block serves it: no new segment
        print(torch.npu.memory_reserved(0) // MiB)
        del b
        c = torch.empty(31 * MiB // 4, device="npu:0")  # the 30 MiB segment is released first, then 32 fits
        print(torch.npu.memory_reserved(0) // MiB)
        """,
        NPUB_SIM_MEMORY="64M")
    assert out.split() == ["30", "32"]


@pytest.mark.parametrize("fraction, error, message", [
    (1, TypeError, "Invalid type for fraction argument, must be `float`"),
    (1.5, ValueError, "Invalid fraction value: 1.5. Allowed range: 0~1"),
    (-0.5, ValueError, "Invalid fraction value: -0.5. Allowed range: 0~1"),
])
def test_set_per_process_memory_fraction_checks_its_argument_as_torch_cuda(fraction, error, message):
    with pytest.raises(error) as e:
        torch.npu.set_per_process_memory_fraction(fraction, 0)
    assert str(e.value) == message
    assert torch.npu.get_per_process_memory_fraction(0) == 1.0


def test_out_of_memory_raises_torch_oom_with_the_allocators_message(run):
    out = run(
        """
        import torch, npubridge
        try:
            torch.empty(64 << 20, device='npu')
        except torch.OutOfMemoryError as e:
            print('OOM:', e)
        """,
        NPUB_SIM_MEMORY="64M")
    assert "OOM: npu:0 out of memory: tried to allocate 256.00 MiB" in out
    assert "capacity of 64.00 MiB" in out
