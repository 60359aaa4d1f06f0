"""torch_npu.contrib: ``import torch_npu.contrib.transfer_to_npu`` (the
migration switch for CUDA-written scripts)."""
