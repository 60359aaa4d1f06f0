"""Dynamo's device interface for the npu.

torch._dynamo and Inductor ask ``get_interface_for_device(device)`` for a
device's runtime (current device, streams, events, synchronize, properties)
when they trace or compile code that touches it; PyTorch's tests for
out-of-tree devices check that the interface exists. Without one, Dynamo
raises "No interface for device npu" when a traced function uses
``torch.npu`` streams or device guards.

Triton is not there for the npu (``is_triton_capable`` is False): graph mode
runs on npubridge's own backend (``torch.compile(backend="npu")``).
"""
from torch._dynamo import device_interface as _di

from . import _C
from . import npu as _npu


class NpuInterface(_di.DeviceInterface):
    device = _npu.device
    Event = _npu.Event
    Stream = _npu.Stream

    class Worker:
        """What a compile worker process may ask without starting the
        runtime: recorded in the main process first, as CudaInterface does."""

        @staticmethod
        def set_device(device: int) -> None:
            _di.caching_worker_current_devices["npu"] = device

        @staticmethod
        def current_device() -> int:
            if "npu" in _di.caching_worker_current_devices:
                return _di.caching_worker_current_devices["npu"]
            return _npu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            index = (_npu._checked_index(device, "NpuInterface.Worker.get_device_properties")
                     if device is not None else NpuInterface.Worker.current_device())
            if "npu" not in _di.caching_worker_device_properties:
                _di.caching_worker_device_properties["npu"] = [
                    _npu.get_device_properties(i) for i in range(_npu.device_count())
                ]
            return _di.caching_worker_device_properties["npu"][index]

    current_device = staticmethod(_npu.current_device)
    set_device = staticmethod(_npu.set_device)
    device_count = staticmethod(_npu.device_count)
    stream = staticmethod(_npu.stream)
    current_stream = staticmethod(_npu.current_stream)
    set_stream = staticmethod(_npu.set_stream)
    synchronize = staticmethod(_npu.synchronize)
    get_device_properties = staticmethod(_npu.get_device_properties)
    memory_allocated = staticmethod(_npu.memory_allocated)
    is_bf16_supported = staticmethod(_npu.is_bf16_supported)

    @staticmethod
    def is_available() -> bool:
        return _npu.is_available()

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _npu.set_stream(_npu.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # The simulator's stream id (there is no driver handle to expose).
        return _C.current_stream(device_idx)

    exchange_device = staticmethod(_npu._exchange_device)
    maybe_exchange_device = staticmethod(_npu._maybe_exchange_device)

    @staticmethod
    def get_compute_capability(device=None):
        major, minor = _npu.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False


def register() -> None:
    """Registers "npu" and "npu:<i>" for each device the settings give.
    Runs at import: it neither starts the runtime nor warns about a bad
    NPUB_* setting (the first npu use reports that); with one, only "npu"."""
    _di.register_interface_for_device("npu", NpuInterface)
    try:
        count = _C.device_count()  # the settings' count: the runtime has not started
    except RuntimeError:
        count = 0
    for i in range(count):
        _di.register_interface_for_device(f"npu:{i}", NpuInterface)
