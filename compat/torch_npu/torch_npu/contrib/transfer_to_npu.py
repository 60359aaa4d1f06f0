"""Ascend's migration switch: ``import torch_npu.contrib.transfer_to_npu``
at the top of a script written for CUDA sends it to the npu unchanged.

After the import, in this process:
- ``torch.cuda.<fn>`` is ``torch.npu.<fn>`` for every function torch.npu
  has (is_available, device_count, set_device, synchronize, streams and
  events, seeding and RNG state, memory statistics, ...), and
  ``torch.cuda.amp`` / ``torch.cuda.random`` hold torch.npu's;
- ``Tensor.cuda()`` and ``Module.cuda()`` are ``.npu()``; ``Tensor.is_cuda``
  is ``is_npu``;
- "cuda" / "cuda:N" / ``torch.device("cuda")`` given as a device to torch's
  factory functions (``torch.randn(..., device="cuda")``), ``Tensor.to``,
  ``Tensor.new_*``, ``Module.to``/``to_empty``, ``torch.load(map_location=)``
  and ``torch.set_default_device`` mean the npu;
- ``torch.autocast("cuda")`` and ``torch.amp.GradScaler("cuda")`` are the
  npu's;
- ``torch.distributed.init_process_group("nccl")`` (and "cpu:gloo,cuda:nccl",
  ``new_group(backend="nccl")``) uses the npu backend ("hccl").

Not redirected: ``torch.Generator(device="cuda")`` (a C type; use
``torch.Generator("npu")``) and code that compares ``tensor.device.type``
with "cuda" (it says "npu"). The switch is process-wide and cannot be undone.
"""
import functools

import torch

import torch_npu  # noqa: F401  (the guard, torch.npu)

__all__ = []

_DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id")

# torch functions that take a device (as torch_npu's switch lists them).
_TORCH_FUNCTIONS = (
    "arange", "as_tensor", "bartlett_window", "blackman_window", "empty", "empty_like", "empty_strided", "eye",
    "frombuffer", "full", "full_like", "hamming_window", "hann_window", "kaiser_window", "linspace", "load",
    "logspace", "normal", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "randperm", "range", "scalar_tensor", "set_default_device", "sparse_coo_tensor", "sparse_csr_tensor", "tensor",
    "tril_indices", "triu_indices", "zeros", "zeros_like",
)
_TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros", "to")
_MODULE_METHODS = ("to", "to_empty")


def _cuda_to_npu(value):
    """`value` with a CUDA device replaced by the npu device of the same
    index; anything else unchanged."""
    if isinstance(value, str):
        if value == "cuda" or value.startswith("cuda:"):
            return "npu" + value[4:]
        return value
    if isinstance(value, torch.device):
        return torch.device("npu", value.index) if value.type == "cuda" else value
    if isinstance(value, dict):  # torch.load's map_location={"cuda:0": "cuda:1"}
        return {_cuda_to_npu(k): _cuda_to_npu(v) for k, v in value.items()}
    return value


def _redirect_devices(fn):
    @functools.wraps(fn)
    def redirected(*args, **kwargs):
        args = tuple(_cuda_to_npu(a) for a in args)
        for key in _DEVICE_KWARGS:
            if key in kwargs:
                kwargs[key] = _cuda_to_npu(kwargs[key])
        return fn(*args, **kwargs)

    redirected.__wrapped_by_transfer_to_npu__ = True
    return redirected


def _patch(owner, name, make):
    current = getattr(owner, name, None)
    if current is None or getattr(current, "__wrapped_by_transfer_to_npu__", False):
        return
    setattr(owner, name, make(current))


def _cuda_backend_to_npu(backend):
    """"nccl" -> "hccl" (the npu backend), also in "cpu:gloo,cuda:nccl"."""
    if not isinstance(backend, str):
        return backend
    parts = []
    for part in backend.split(","):
        device, sep, name = part.rpartition(":")
        name = "hccl" if name.strip().lower() == "nccl" else name
        device = "npu" if device.strip() == "cuda" else device
        parts.append(f"{device}{sep}{name}")
    return ",".join(parts)


def _redirect_backend(fn):
    @functools.wraps(fn)
    def redirected(*args, **kwargs):
        if args:
            args = (_cuda_backend_to_npu(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _cuda_backend_to_npu(kwargs["backend"])
        if "device_id" in kwargs:
            kwargs["device_id"] = _cuda_to_npu(kwargs["device_id"])
        return fn(*args, **kwargs)

    redirected.__wrapped_by_transfer_to_npu__ = True
    return redirected


class _Autocast(torch.amp.autocast_mode.autocast):
    """torch.autocast with "cuda" meaning the npu."""

    def __init__(self, device_type, *args, **kwargs):
        super().__init__(_cuda_to_npu(device_type), *args, **kwargs)


class _GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler whose default (and any "cuda") device is the npu."""

    def __init__(self, device="cuda", *args, **kwargs):
        super().__init__(_cuda_to_npu(device), *args, **kwargs)


def _patch_torch_cuda():
    import torch.cuda.amp
    import torch.cuda.random

    npu = torch.npu
    for name in dir(npu):
        if name.startswith("__") or name in ("amp", "random"):
            continue
        value = getattr(npu, name)
        if callable(value) and hasattr(torch.cuda, name):
            setattr(torch.cuda, name, value)
    for name in torch.cuda.random.__all__:
        setattr(torch.cuda.random, name, getattr(npu.random, name))
    for name in ("autocast", "GradScaler", "custom_fwd", "custom_bwd"):
        setattr(torch.cuda.amp, name, getattr(npu.amp, name))
    torch.cuda.is_bf16_supported = npu.is_bf16_supported


def _install():
    _patch_torch_cuda()
    for name in _TORCH_FUNCTIONS:
        _patch(torch, name, _redirect_devices)
    for name in _TENSOR_METHODS:
        _patch(torch.Tensor, name, _redirect_devices)
    for name in _MODULE_METHODS:
        _patch(torch.nn.Module, name, _redirect_devices)
    torch.Tensor.cuda = torch.Tensor.npu
    torch.Tensor.is_cuda = torch.Tensor.is_npu
    torch.nn.Module.cuda = torch.nn.Module.npu
    torch.autocast = torch.amp.autocast = _Autocast
    torch.amp.GradScaler = _GradScaler
    if torch.distributed.is_available():
        import torch.distributed as dist

        for name in ("init_process_group", "new_group"):
            _patch(dist, name, _redirect_backend)
        _patch(dist.distributed_c10d, "init_process_group", _redirect_backend)


if not getattr(torch.cuda, "_npubridge_transferred", False):
    _install()
    torch.cuda._npubridge_transferred = True
