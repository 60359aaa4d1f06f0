"""Dynamo's device interface for the npu: what torch._dynamo and Inductor
ask a device's runtime, answered by torch.npu."""
import pytest
import torch
from torch._dynamo.device_interface import get_interface_for_device, get_registered_device_interfaces

import npubridge  # noqa: F401


def test_interface_is_registered_for_npu_and_each_device():
    iface = get_interface_for_device("npu")
    assert get_interface_for_device(torch.device("npu", 1)) is iface
    assert get_interface_for_device("npu:0") is iface
    assert ("npu", iface) in list(get_registered_device_interfaces())


def test_interface_answers_as_torch_npu():
    iface = get_interface_for_device("npu")
    assert iface.is_available() and iface.device_count() == torch.npu.device_count()
    assert iface.current_device() == torch.npu.current_device()
    assert issubclass(iface.Stream, torch.Stream) and issubclass(iface.Event, torch.Event)
    props = iface.get_device_properties(0)
    assert props.total_memory > 0
    major, minor = torch.npu.get_device_capability(0)
    assert iface.get_compute_capability(0) == major * 10 + minor
    assert iface.is_bf16_supported() and iface.is_dtype_supported(torch.bfloat16)
    assert not iface.is_triton_capable()
    assert iface.Worker.get_device_properties("npu:0").name == props.name
    x = torch.ones(1024, device="npu")
    assert iface.memory_allocated(0) >= x.numel() * 4


def test_device_exchange_and_streams():
    iface = get_interface_for_device("npu")
    assert iface.exchange_device(1) == 0
    assert torch.npu.current_device() == 1
    assert iface.maybe_exchange_device(0) == 1
    assert iface.maybe_exchange_device(-1) == -1 and torch.npu.current_device() == 0
    with iface.device(1):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    s = iface.Stream()
    with iface.stream(s):
        assert iface.current_stream() == s
        assert iface.get_raw_stream(0) == s.stream_id
    iface._set_stream_by_id(s.stream_id, s.device_index, s.device_type)
    assert iface.current_stream() == s
    iface.set_stream(torch.npu.default_stream())
    e = iface.Event()
    e.record()
    iface.synchronize()
    assert e.query()


def test_compiled_code_creates_npu_streams_and_events():
    # Dynamo builds torch.Stream/torch.Event values of the npu in a graph.
    def f(x):
        e = torch.Event(device="npu")
        e.record()
        return x * 2

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    x = torch.arange(4.0, device="npu")
    assert torch.equal(compiled(x).cpu(), torch.arange(4.0) * 2)


def test_unknown_device_still_raises():
    with pytest.raises(NotImplementedError, match="No interface for device nosuch"):
        get_interface_for_device("nosuch")
