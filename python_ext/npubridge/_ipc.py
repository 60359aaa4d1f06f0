"""npu tensors and torch.multiprocessing.

Note [npu tensors are not shared between processes yet]
torch.multiprocessing pickles a tensor for another process by sharing its
storage (a file descriptor for CPU memory, an IPC handle for CUDA). For an
npu tensor, PyTorch's reducer calls the CPU-only _share_fd_ ("only
available on CPU"); and through a multiprocessing.Queue that error is
raised in the queue's feeder thread, where it is printed and dropped, so the
consumer waits for the tensor forever. npu memory lives in the caching
allocator's private mappings (device_sim/src/caching_allocator.cpp), which
another process cannot map; sharing it would need shared-memory segments.
Until then the reducers of tensors and storages refuse npu ones at once
with an error that says so, naming the reducer and what to do instead. In a
Queue's feeder thread, where no caller can see an exception, the tensor is
pickled as that same error instead: the consumer's get() raises it (and the
producer's process warns), so neither side hangs.
"""
import threading
import warnings
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _reductions

# The feeder thread multiprocessing.Queue.put hands objects to (CPython names
# it so in multiprocessing/queues.py).
_QUEUE_FEEDER_THREAD = "QueueFeederThread"


def _device(obj) -> torch.device:
    """The device of a tensor or storage; a TypedStorage's through its
    untyped storage (its own `.device` warns that TypedStorage is
    deprecated, in every DataLoader worker that sends a batch)."""
    if isinstance(obj, torch.TypedStorage):
        return obj._untyped_storage.device
    return obj.device


def _message(obj, reducer) -> str:
    kind = "tensor" if isinstance(obj, torch.Tensor) else "storage"
    return (f"npubridge: npu tensors cannot be shared between processes yet (torch.multiprocessing's "
            f"{reducer} was given a {kind} on {_device(obj)}); move it to the CPU first (tensor.cpu()), send "
            f"that, and move it to the npu in the receiving process")


def _raise_not_shared(message: str):
    """What the consumer unpickles in place of an npu tensor a Queue's feeder
    thread could not refuse to its producer."""
    raise RuntimeError(message)


def _refusing(reducer):
    def reduce(obj):
        if _device(obj).type != "npu":
            return reducer(obj)
        message = _message(obj, f"{reducer.__module__}.{reducer.__name__}")
        if threading.current_thread().name == _QUEUE_FEEDER_THREAD:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return _raise_not_shared, (message,)
        raise RuntimeError(message)

    reduce.__name__ = reducer.__name__
    reduce.__wrapped__ = reducer
    return reduce


_TORCH_REDUCERS = (_reductions.reduce_tensor, _reductions.reduce_storage, _reductions.reduce_typed_storage,
                   _reductions.reduce_typed_storage_child)


def install():
    """Wraps every reducer torch.multiprocessing registered for tensors and
    storages (torch.multiprocessing.reductions.init_reductions, run when
    torch is imported) with the refusal above."""
    for cls, reducer in list(ForkingPickler._extra_reducers.items()):
        if reducer in _TORCH_REDUCERS:
            ForkingPickler.register(cls, _refusing(reducer))
