"""``torch.npu.random``: the RNG functions of torch.npu under the name
torch.cuda.random gives them.

Libraries reach the device's generator state through this submodule
(transformers' Trainer saves ``torch.npu.random.get_rng_state_all()`` in each
checkpoint and restores it on resume; accelerate does the same). The
functions are torch.npu's own (npubridge/npu.py): one state, two names.
"""
from .npu import (  # noqa: F401  (torch.npu.random.<name>, as torch.cuda.random's)
    get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all, set_rng_state,
    set_rng_state_all,
)

__all__ = [
    "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed", "manual_seed_all",
    "seed", "seed_all", "initial_seed",
]
