"""torch_npu._C: what clients call of Ascend's extension module directly.

TRL's activation offloading counts a storage's users with
``torch_npu._C._storage_Use_Count`` on an NPU (``torch._C``'s elsewhere).
An npubridge npu storage is a torch storage: torch's own count is the one.
"""
from torch._C import _storage_Use_Count  # noqa: F401
