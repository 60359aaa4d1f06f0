"""The torch.distributed backend "npu" (the role of HCCL on Ascend).

Registered when npubridge is imported, for the npu device type, so that

    dist.init_process_group("npu")               # npu tensors only
    dist.init_process_group("cpu:gloo,npu:npu")  # CPU tensors over gloo too
    dist.init_process_group(device_id=torch.device("npu", i))  # "npu", the default for npu
    dist.init_process_group("hccl")              # the same backend under Ascend's name

work. (`dist.init_process_group()` with neither a backend nor a device_id
uses this backend for npu tensors too, but torch 2.13 then sets the group's
default backend type to gloo, which it never creates: DDP fails with "Could
not find backend type 1". The creator has no hold on that; the README says
to name the backend.) The creator builds a real
ProcessGroupGloo of the same ranks on the group's store (under the prefix
"npu_gloo/", apart from any "cpu:gloo" group of the same ranks) and wraps it
in the C++ backend `npubridge._C_dist.ProcessGroupNPU`, which stages npu
tensors through pinned host memory on a collective stream of the device and
lets gloo carry them (python_ext/csrc/distributed/).

NPUB_DIST_CHECK=0 turns off the check that all ranks call the same
collective with the same dtypes and shapes (one small allgather per
collective); NPUB_DIST_CHUNK_BYTES sets the chunk of pipelined allreduce and
broadcast (default 4 MiB).
"""
import torch.distributed as _dist

BACKEND_NAME = "npu"
# The name Ascend's stack gives its collective backend: accelerate asks for
# "hccl" on an NPU and refuses any other name. The same creator answers to
# it; "npu" stays the npu device's default backend.
ALIAS_NAMES = ("hccl",)


def _create_npu_backend(store, rank, size, timeout):
    """torch.distributed's creator for "npu": `(store, rank, size, timeout)`,
    the store already prefixed for this group by torch.distributed."""
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import ProcessGroupGloo

    from .. import _C_dist
    from .. import npu as _npu

    _npu._lazy_init()  # the backend's streams are the runtime's (Note [The runtime starts at the first npu use])

    gloo = ProcessGroupGloo(PrefixStore("npu_gloo/", store), rank, size, timeout)
    return _C_dist.ProcessGroupNPU(gloo, rank, size, timeout)


def _register():
    if not _dist.is_available():
        return
    if BACKEND_NAME.upper() in _dist.Backend._plugins:
        return  # a re-import (importlib.reload)
    _dist.Backend.register_backend(BACKEND_NAME, _create_npu_backend, devices=["npu"])
    for alias in ALIAS_NAMES:
        if alias.upper() not in _dist.Backend._plugins:
            _dist.Backend.register_backend(alias, _create_npu_backend, devices=["npu"])


_register()
