"""torch.npu's device calls as torch.cuda has them: init, is_initialized,
the current device, get_device_properties / get_device_capability (the
simulated device's capacity and compute threads), the seeding functions
and the RNG state, streams and events (torch.npu.Stream/Event as
torch.Stream/Event: what DDP and FSDP2 mix); and torch.accelerator on the
npu (devices, memory statistics, streams, events,
get_device_capability)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import npubridge  # noqa: F401
from conftest import assert_matches


def _run(code, **env):
    """`code` in a fresh interpreter with `env` (None: the variable unset)."""
    full_env = dict(os.environ, **{k: v for k, v in env.items() if v is not None})
    for k in [k for k, v in env.items() if v is None]:
        full_env.pop(k, None)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_init_and_is_initialized_as_torch_cuda():
    torch.npu.init()  # nothing to do: the devices run from import on
    assert torch.npu.is_initialized()
    torch.npu.init()  # idempotent, as torch.cuda.init


def test_device_properties_are_the_simulated_devices_capacity_and_threads():
    out = _run(
        """
        import torch, npubridge
        for d in (0, 1, "npu:1", torch.device("npu", 0), None):
            p = torch.npu.get_device_properties(d)
            print(p.name, p.total_memory, p.multi_processor_count, p.major, p.minor)
        print(torch.npu.get_device_capability("npu:1"))
        print(repr(torch.npu.get_device_properties(0)))
        """,
        NPUB_SIM_MEMORY="96M", NPUB_SIM_THREADS="3", NPUB_SIM_DEVICES="2")
    lines = out.splitlines()
    for line in lines[:5]:
        assert line == "npubridge simulated NPU 100663296 3 1 6"  # 96 MiB; ABI 1.6
    assert lines[5] == "(1, 6)"
    assert lines[6] == ("_NpuDeviceProperties(name='npubridge simulated NPU', major=1, minor=6, total_memory=96MB, "
                        "multi_processor_count=3)")


def test_device_properties_default_to_16_gib_and_the_hardware_threads():
    out = _run(
        """
        import os, torch, npubridge
        p = torch.npu.get_device_properties()
        print(p.total_memory, p.multi_processor_count, os.cpu_count())
        """,
        NPUB_SIM_MEMORY=None, NPUB_SIM_THREADS=None)
    total, threads, cpus = map(int, out.split())
    assert total == 16 << 30
    assert threads == cpus
    # total_memory is what the allocator really has: mem_get_info's total.
    assert torch.npu.get_device_properties(0).total_memory == torch.npu.mem_get_info(0)[1]


@pytest.mark.parametrize("device, message", [
    (64, "get_device_properties: expected a device index in [0, {n}) but found 64"),
    ("npu:7", "get_device_properties: expected a device index in [0, {n}) but found 7"),
    (-1, "get_device_properties: expected a device index in [0, {n}) but found -1"),
    ("cpu", "get_device_properties: expected an npu device but found cpu"),
])
def test_device_properties_of_a_device_that_is_not_there_raise(device, message):
    with pytest.raises(ValueError) as e:
        torch.npu.get_device_properties(device)
    assert str(e.value) == message.format(n=torch.npu.device_count())


def test_accelerator_get_device_capability_lists_every_dtype_but_the_quantized_ones():
    # torch.accelerator.get_device_capability asks the device guard
    # (DeviceGuardImplInterface::getDeviceCapability).
    cap = torch.accelerator.get_device_capability("npu:0")
    dtypes = cap["supported_dtypes"]
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int64, torch.bool,
               torch.complex64, torch.uint8):
        assert dt in dtypes
        one = torch.ones(3, dtype=dt)
        assert torch.equal(one.to("npu").cpu(), one)  # each one really lives on the device
    for dt in (torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.quint2x4):
        assert dt not in dtypes
    assert torch.accelerator.get_device_capability(torch.device("npu", 1)) == cap
    with pytest.raises(RuntimeError) as e:
        torch.accelerator.get_device_capability("npu:9")
    n = torch.npu.device_count()
    assert str(e.value) == f"npu:9 does not exist: expected a device index from 0 to {n - 1} (NPUB_SIM_DEVICES={n})"


def _draws(device):
    return torch.randn(4, device=device).cpu()


def test_manual_seed_all_and_initial_seed_as_torch_cuda():
    torch.npu.manual_seed_all(1234)
    for i in range(torch.npu.device_count()):
        with torch.npu.device(i):
            assert torch.npu.initial_seed() == 1234
    # One seed, one stream of numbers, on every device.
    assert torch.equal(_draws("npu:0"), _draws("npu:1"))
    torch.npu.manual_seed_all(1234)
    a = _draws("npu:0")
    torch.npu.manual_seed_all(1234)
    assert torch.equal(a, _draws("npu:0"))
    torch.manual_seed(77)  # torch.manual_seed seeds the device module too
    assert torch.npu.initial_seed() == 77


def test_seed_and_seed_all_draw_a_fresh_seed_as_torch_cuda():
    torch.npu.manual_seed_all(5)
    torch.npu.seed_all()
    fresh = torch.npu.initial_seed()
    assert fresh != 5  # a non-deterministic 64-bit seed: 5 again has odds of 2**-64
    for i in range(torch.npu.device_count()):
        with torch.npu.device(i):
            assert torch.npu.initial_seed() == fresh  # torch.cuda.seed_all: the first device's, for all
    torch.npu.seed_all()
    assert torch.npu.initial_seed() != fresh
    with torch.npu.device(1):
        torch.npu.seed()  # only the current device
        assert torch.npu.initial_seed() != torch.npu.default_generators[0].initial_seed()
    # The seed it reports is the one numbers come from.
    s = torch.npu.initial_seed()
    a = _draws("npu:0")
    torch.npu.manual_seed(s)
    assert torch.equal(a, _draws("npu:0"))


def test_npu_streams_and_events_are_torch_streams_and_events():
    # FSDP2 makes torch.npu.Stream()/Event() and waits them on
    # torch.accelerator.current_stream() (and the reverse); DDP uses
    # torch.Stream(). Both spellings must be the same objects to torch.
    A = torch.accelerator
    assert torch.get_device_module("npu") is torch.npu  # what FSDP2 and DeviceMesh look up
    side = torch.npu.Stream(priority=-1)
    assert isinstance(side, torch.Stream) and isinstance(torch.npu.Event(), torch.Event)
    assert torch.npu.current_stream() == A.current_stream() == torch.npu.default_stream()
    assert hash(torch.npu.current_stream()) == hash(A.current_stream())
    with torch.npu.stream(side):
        assert A.current_stream() == side and torch.npu.current_stream() == side
    with torch.Stream(device="npu") as other:
        assert torch.npu.current_stream() == other
    assert A.current_stream().stream_id == 0
    # Ordering through the mixed APIs: a product on the side stream, the
    # default stream waiting a torch.npu.Event through torch.accelerator, and
    # a torch.npu stream waiting a torch.accelerator stream.
    a = torch.randn(256, 256, device="npu")
    side.wait_stream(A.current_stream())
    with torch.npu.stream(side):
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        b = a @ a
        end.record()
        done = side.record_event()
    assert isinstance(done, torch.npu.Event)
    A.current_stream().wait_event(done)
    c = b + 1
    torch.npu.current_stream().wait_stream(A.current_stream())
    assert torch.equal(c.cpu(), (b.cpu() + 1))
    end.synchronize()
    assert end.query() and start.elapsed_time(end) > 0
    # torch.Event.elapsed_time takes only its exact type; torch.npu's takes both.
    t = torch.Event(device="npu", enable_timing=True)
    t.record()
    t.synchronize()
    assert start.elapsed_time(t) >= start.elapsed_time(end)
    with pytest.raises(TypeError, match="elapsed_time: expected a torch.Event but found int"):
        start.elapsed_time(3)
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.npu.Event().elapsed_time(end)
    # An existing stream, by the fields torch.Stream reports (how
    # torch.compile rebuilds the streams it traced).
    again = torch.npu.Stream(stream_id=side.stream_id, device_index=side.device_index, device_type=side.device_type)
    assert again == side and isinstance(again, torch.npu.Stream)
    with pytest.raises(ValueError, match="torch.npu.Stream: expected device_type 20 \\(npu\\) but found 1"):
        torch.npu.Stream(stream_id=1, device_index=0, device_type=1)
    # A stream of the second device, made by either API, is that device's.
    s1 = torch.npu.Stream("npu:1")
    assert s1.device == torch.device("npu:1")
    with torch.npu.device(1), torch.npu.stream(s1):
        assert A.current_stream(1) == s1
        assert torch.ones(2, device="npu").device == torch.device("npu:1")


def test_is_bf16_supported_as_torch_cuda():
    assert torch.npu.is_bf16_supported() and torch.npu.is_bf16_supported(including_emulation=False)


def test_device_module_and_memory_stats():
    assert torch.npu.is_available()
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        t = torch.empty(1024, device="npu")
        assert t.device.index == 1
    assert torch.npu.current_device() == 0
    before = torch.npu.memory_allocated(0)
    big = torch.empty(1 << 20, device="npu:0")
    assert torch.npu.memory_allocated(0) >= before + 4 * (1 << 20)
    del big
    torch.npu.synchronize()


def test_manual_seed_takes_what_the_cpu_takes():
    # torch.manual_seed seeds npu too (the custom-device hook); a negative
    # seed wraps to uint64 as the CPU generator's does, and an out-of-range
    # one raises the CPU's error, not a TypeError from the binding.
    torch.manual_seed(-1)
    assert torch.initial_seed() == 2**64 - 1
    a = torch.rand(4, device="npu")
    torch.npu.manual_seed(2**64 - 1)
    assert torch.equal(torch.rand(4, device="npu").cpu(), a.cpu())
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="Overflow"):
            torch.manual_seed(bad)
    torch.manual_seed(0)


def test_streams_events_and_rng_state():
    s = torch.npu.Stream()
    assert s != torch.npu.default_stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        a = torch.ones(1000, device="npu") * 3
        m = torch.randn(512, 512, device="npu")
        start, mid, end = (torch.npu.Event(enable_timing=True) for _ in range(3))
        start.record()
        b = a + a
        m2 = m @ m  # real work between the events: a few milliseconds
        mid.record()
        m3 = m2 @ m
        end.record()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    end.synchronize()
    # What the events measure (no timing threshold): the stream's own order,
    # time spent in the products, and additivity.
    first, second, whole = start.elapsed_time(mid), mid.elapsed_time(end), start.elapsed_time(end)
    assert end.query() and first > 0 and second > 0
    assert whole == pytest.approx(first + second, rel=1e-3, abs=1e-3)
    assert mid.elapsed_time(start) == pytest.approx(-first, rel=1e-6)
    assert torch.isfinite(m3).all()
    s.synchronize()
    assert torch.equal(b.cpu(), torch.full((1000,), 6.0))
    state = torch.npu.get_rng_state()
    x1 = torch.randn(100, device="npu")
    torch.npu.set_rng_state(state)
    x2 = torch.randn(100, device="npu")
    assert torch.equal(x1.cpu(), x2.cpu())


def test_torch_accelerator_works_for_npu():
    A = torch.accelerator
    assert A.is_available() and A.current_accelerator() == torch.device("npu") and A.device_count() == 2
    with A.device_index(1):
        assert A.current_device_index() == 1
        assert torch.ones(2, device="npu").device == torch.device("npu:1")
    assert A.current_device_index() == 0
    # Memory statistics come from the simulated device's caching allocator.
    A.synchronize()
    A.empty_cache()
    A.reset_peak_memory_stats(0)
    base = A.memory_allocated(0)
    x = torch.empty(1 << 20, device="npu")  # 4 MiB
    assert A.memory_allocated(0) == base + (4 << 20)
    assert A.max_memory_allocated(0) >= base + (4 << 20)
    assert A.memory_reserved(0) >= A.memory_allocated(0)
    stats = A.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == A.memory_allocated(0)
    assert stats["allocation.all.allocated"] >= 1
    assert A.memory_allocated(0) == torch.npu.memory_allocated(0)
    free, total = A.get_memory_info(0)
    assert total == 16 << 30 and 0 < free <= total
    del x
    assert A.memory_allocated(0) == base
    # Streams and events are the simulator's: work on a side stream, an event
    # recorded after it, the default stream waiting for that event.
    side = torch.Stream(device="npu:0")
    assert side != A.current_stream() and side.stream_id != 0
    start, end = torch.Event(device="npu", enable_timing=True), torch.Event(device="npu", enable_timing=True)
    a = torch.randn(256, 256, device="npu")
    with side:
        assert A.current_stream() == side
        start.record()
        b = a @ a
        end.record()
    A.current_stream().wait_event(end)
    end.synchronize()
    assert end.query() and side.query()
    assert start.elapsed_time(end) > 0  # the 256^3 product ran between them
    assert_matches(b, lambda v: v @ v, a.cpu())
    assert A.current_stream().stream_id == 0
