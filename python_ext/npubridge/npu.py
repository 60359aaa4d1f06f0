"""``torch.npu``: the device module of npubridge's simulated NPU."""
import contextlib

import torch

from . import _C
from ._memory import (  # noqa: F401  (torch.npu.<name>, as torch.cuda's memory functions)
    empty_cache, max_memory_allocated, max_memory_cached, max_memory_reserved, mem_get_info, memory_allocated,
    memory_cached, memory_reserved, memory_snapshot, memory_stats, memory_summary, get_per_process_memory_fraction,
    reset_max_memory_allocated, reset_max_memory_cached, reset_peak_memory_stats, set_per_process_memory_fraction,
)


# Note [The runtime starts at the first npu use] (python_ext/csrc/init.cpp):
# as torch.cuda, nothing starts at import. The first npu use (an npu
# tensor, a device or stream query, torch.npu.init()) starts the devices and
# loads the plugins from the NPUB_* settings as they are then; a bad setting
# raises there, naming the variable, at every use until it is fixed. What
# must not start the runtime (is_available, device_count, is_initialized,
# seeding) reads the settings or queues the call, as torch.cuda._lazy_call.
_queued_calls = []


def _device_count_or_warn():
    """The device count without starting anything (the runtime's once
    started, else what the NPUB_* settings ask for); 0, with one warning,
    when a setting is bad."""
    try:
        return _C.device_count()
    except RuntimeError as err:
        import warnings

        warnings.warn(str(err), RuntimeWarning, stacklevel=3)  # "npubridge: the npu runtime did not start: NAME: ..."
        return 0


def is_available() -> bool:
    """Whether the settings give at least one device; does not start the
    runtime (torch.cuda.is_available does not create a context either)."""
    return _device_count_or_warn() > 0


def is_initialized() -> bool:
    """Whether the runtime has started (and this is not a process forked
    after it did, where the devices are unusable, as torch.cuda says)."""
    return _C._is_started() and not _C._is_in_bad_fork()


def _lazy_init() -> None:
    """Starts the runtime if it has not (torch.cuda._lazy_init): raises the
    forked-child error, or the error of a bad NPUB_* setting naming it."""
    _C._check_not_in_bad_fork()  # "Cannot re-initialize npu in forked subprocess. ..."
    _C._start()


def _lazy_call(fn) -> None:
    """Runs `fn` now if the runtime has started, else when it starts."""
    if _C._is_started():
        fn()
    else:
        _queued_calls.append(fn)


def _run_queued_calls() -> None:
    calls = list(_queued_calls)
    _queued_calls.clear()
    for fn in calls:
        fn()


def init() -> None:
    """As torch.cuda.init(): starts the runtime, raising what the first npu
    use would (a bad setting, a forked child)."""
    _lazy_init()


def device_count() -> int:
    """The number of devices: the runtime's once started, before that what
    the settings ask for (it does not start the runtime)."""
    return _device_count_or_warn()


def current_device() -> int:
    return _C.current_device()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else current_device()


def _checked_index(device, function: str) -> int:
    """`device` as an npu index, refusing another device type or an index
    out of range with the function's name, what was expected and what was
    found (torch.cuda says "Invalid device id" for the latter)."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type != "npu":
        raise ValueError(f"{function}: expected an npu device but found {torch.device(device)}")
    index = _index(device)
    if not 0 <= index < device_count():
        raise ValueError(f"{function}: expected a device index in [0, {device_count()}) but found {index}")
    return index


class _NpuDeviceProperties:
    """What torch.npu.get_device_properties returns; the fields of
    torch.cuda's _CudaDeviceProperties that describe the simulated device."""

    __slots__ = ("name", "major", "minor", "total_memory", "multi_processor_count")

    def __init__(self, props: dict):
        for key in self.__slots__:
            setattr(self, key, props[key])

    def __repr__(self):
        return (f"_NpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None) -> _NpuDeviceProperties:
    """The simulated device's name, total_memory (its capacity,
    NPUB_SIM_MEMORY), multi_processor_count (its compute threads,
    NPUB_SIM_THREADS) and major.minor: the plugin ABI version its kernels
    are built against, which is what a kernel may rely on (as a CUDA
    device's compute capability)."""
    _lazy_init()
    return _NpuDeviceProperties(_C.device_properties(_checked_index(device, "get_device_properties")))


def get_device_capability(device=None) -> tuple:
    """(major, minor) of get_device_properties, as torch.cuda's."""
    props = get_device_properties(device)
    return props.major, props.minor


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


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


def _exchange_device(device: int) -> int:
    """Makes `device` current and returns the previous one (torch.cuda's
    _exchange_device; -1 leaves the device as it is and returns -1)."""
    if device < 0:
        return -1
    previous = current_device()
    if device != previous:
        set_device(device)
    return previous


_maybe_exchange_device = _exchange_device


def ipc_collect() -> None:
    """As torch.cuda.ipc_collect: frees memory of tensors shared with other
    processes once they are gone; npu tensors are never shared between
    processes (npubridge/_ipc.py), so there is nothing to collect."""


def synchronize(device=None) -> None:
    _C.synchronize(_index(device) if device is not None else -1)


def _seed64(seed) -> int:
    """A seed as PyTorch's generators take it: any int in [-2**63, 2**64),
    negative ones wrapping to uint64 (torch.manual_seed(-1) seeds
    18446744073709551615 on the CPU too), anything else the CPU's error."""
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError("Overflow when unpacking long long")
    return seed & 0xFFFF_FFFF_FFFF_FFFF


def manual_seed(seed: int) -> None:
    """Seeds the current device; before the runtime starts, queued for the
    device current then (torch.cuda.manual_seed does the same)."""
    seed = _seed64(seed)
    _lazy_call(lambda: _C.manual_seed(current_device(), seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device; queued until the runtime starts, so that
    torch.manual_seed() in a CPU-only program starts nothing."""
    seed = _seed64(seed)

    def seed_all_devices():
        for i in range(_C.device_count()):
            _C.manual_seed(i, seed)

    _lazy_call(seed_all_devices)


def get_rng_state(device="npu") -> torch.Tensor:
    """The device generator's state: seed and next Philox counter (16 bytes)."""
    seed, offset = _C.get_rng_state(_index(device))
    return torch.tensor(list(seed.to_bytes(8, "little") + offset.to_bytes(8, "little")), dtype=torch.uint8)


def set_rng_state(new_state: torch.Tensor, device="npu") -> None:
    data = bytes(new_state.to(torch.uint8).tolist())
    if len(data) != 16:
        raise ValueError(f"set_rng_state: expected a state of 16 bytes but found {len(data)}")
    _C.set_rng_state(_index(device), int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little"))


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


def __getattr__(name):
    # torch.npu.default_generators, as torch.cuda's: each device's own
    # generator (the one manual_seed seeds and random npu ops draw from).
    if name == "default_generators":
        return tuple(_C.default_generator(i) for i in range(device_count()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def initial_seed() -> int:
    """The current device's seed (what manual_seed or seed set last)."""
    _lazy_init()
    return _C.get_rng_state(current_device())[0]


def seed() -> None:
    """Seeds the current device with a non-deterministic random number, as
    torch.cuda.seed()."""
    _lazy_init()
    _C.default_generator(current_device()).seed()


def seed_all() -> None:
    """One non-deterministic random seed for every device, as
    torch.cuda.seed_all(): the first device draws it, the others take it."""
    _lazy_init()
    if device_count() == 0:
        return
    first = _C.default_generator(0)
    first.seed()
    for i in range(1, device_count()):
        _C.manual_seed(i, first.initial_seed())


# c10's number for PrivateUse1, the device type of npu streams and events.
_NPU_DEVICE_TYPE = 20


class Event(torch.Event):
    """A marker in an npu stream (record, query, synchronize, wait,
    elapsed_time). A torch.Event, as torch.cuda.Event is: torch.Stream and
    torch.accelerator.current_stream() take it (FSDP2 waits torch.npu
    events on torch.accelerator streams and the reverse), and its methods are
    the device guard's (python_ext/csrc/runtime/guard.cpp), whose events
    are the simulator's."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, device="npu", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def elapsed_time(self, end_event) -> float:
        # torch.Event.elapsed_time takes only an exact torch.Event.
        return _C.event_elapsed_ms(self, end_event)

    def __repr__(self):
        return f"<torch.npu.Event {self.event_id:#x}>"


class Stream(torch.Stream):
    """An npu stream: work on it runs in order; `with torch.npu.stream(s)`
    (or `with s`) makes it the current stream that kernels are ordered on.
    A torch.Stream, as torch.cuda.Stream is, so that torch.Stream,
    torch.Event and torch.accelerator take it and equal streams compare
    equal whichever API made them. New streams come from the device's pool
    (the one torch.Stream(device="npu") draws from); priority is accepted
    and ignored (the simulated streams have none)."""

    def __new__(cls, device=None, priority: int = 0, _stream_id=None, *, stream_id=None, device_index=None,
                device_type=None):
        # stream_id/device_index/device_type: an existing stream, as
        # torch.Stream and torch.cuda.Stream take them back (torch.compile
        # rebuilds the streams it traced that way).
        if stream_id is not None:
            if device_type is not None and device_type != _NPU_DEVICE_TYPE:
                raise ValueError(f"torch.npu.Stream: expected device_type {_NPU_DEVICE_TYPE} (npu) but found "
                                 f"{device_type}")
            index = _checked_index(device_index if device_index is not None else device, "torch.npu.Stream")
            return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_NPU_DEVICE_TYPE)
        index = _index(device)
        stream_id = _C.stream_new(index) if _stream_id is None else _stream_id
        return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_NPU_DEVICE_TYPE)

    def __init__(self, *args, **kwargs):
        pass

    def record_event(self, event=None):
        # A torch.npu.Event, as torch.cuda.Stream's is a torch.cuda.Event.
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __repr__(self):
        return f"<torch.npu.Stream device=npu:{self.device_index} id={self.stream_id}>"


def current_stream(device=None) -> Stream:
    index = _index(device)
    return Stream(index, _stream_id=_C.current_stream(index))


def default_stream(device=None) -> Stream:
    return Stream(_index(device), _stream_id=0)


def set_stream(stream: Stream) -> None:
    _C.set_current_stream(stream.device_index, stream.stream_id)


@contextlib.contextmanager
def stream(stream: Stream):
    if stream is None:
        yield
        return
    previous = current_stream(stream.device_index)
    set_stream(stream)
    try:
        yield
    finally:
        set_stream(previous)


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """As torch.cuda.is_bf16_supported (libraries ask it before choosing a
    bf16 mixed-precision policy): the kernels take bf16 natively."""
    return is_available()


def _is_in_bad_fork() -> bool:
    """True in a process forked after npubridge started its devices (at the
    first npu use): the devices and their threads stayed with the parent,
    and npu use raises instead of hanging (Note [A forked child cannot use
    the npu], device_sim/src/fork_guard.cpp). torch.manual_seed skips the npu
    there. CPU work is unaffected; device_count() still reports the devices,
    as torch.cuda.device_count() does in a bad fork. A process forked before
    the start is not a bad fork: it starts its own runtime."""
    return _C._is_in_bad_fork()


# Graph capture and replay (npubridge/_graphs.py); torch.accelerator.Graph
# finds the same graph under the backend's renamed key.
from ._graphs import (  # noqa: E402,F401
    NPUGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)

_C._register_graph_impl()

# torch.npu.random and torch.npu.amp, as torch.cuda.random and torch.cuda.amp
# (and importable as modules: `from torch.npu.amp import GradScaler`).
import sys as _sys  # noqa: E402

from . import _npu_amp as amp  # noqa: E402
from . import _npu_random as random  # noqa: E402

_sys.modules["torch.npu.random"] = random
_sys.modules["torch.npu.amp"] = amp
