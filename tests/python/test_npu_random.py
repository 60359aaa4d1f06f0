"""torch.npu.random: the RNG state functions libraries save in checkpoints
(transformers' Trainer: torch.npu.random.get_rng_state_all on save,
set_rng_state on resume) reproduce the same random numbers."""
import importlib

import torch

import npubridge  # noqa: F401


def test_random_is_torch_cuda_random_surface():
    import torch.cuda.random as cuda_random

    assert torch.npu.random is importlib.import_module("torch.npu.random")
    for name in cuda_random.__all__:
        assert callable(getattr(torch.npu.random, name)), name
    # One state under two names.
    assert torch.npu.random.get_rng_state is torch.npu.get_rng_state


def test_state_round_trip_reproduces_the_numbers():
    torch.npu.random.manual_seed(1234)
    torch.randn(5, device="npu")  # move the generator off its seed
    state = torch.npu.random.get_rng_state()
    first = (torch.randn(64, device="npu").cpu(), torch.rand(7, device="npu").cpu(),
             torch.nn.functional.dropout(torch.ones(32, device="npu"), 0.5).cpu())
    torch.randn(100, device="npu")  # draw something else
    torch.npu.random.set_rng_state(state)
    again = (torch.randn(64, device="npu").cpu(), torch.rand(7, device="npu").cpu(),
             torch.nn.functional.dropout(torch.ones(32, device="npu"), 0.5).cpu())
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    # And a different state gives different numbers (the state is not ignored).
    torch.npu.random.manual_seed(4321)
    assert not torch.equal(torch.randn(64, device="npu").cpu(), first[0])


def test_state_all_round_trip_per_device():
    n = torch.npu.device_count()
    assert n >= 2  # NPUB_SIM_DEVICES defaults to 2
    torch.npu.random.manual_seed_all(7)
    states = torch.npu.random.get_rng_state_all()
    assert len(states) == n and all(s.dtype == torch.uint8 for s in states)
    draws = [torch.randn(16, device=f"npu:{i}").cpu() for i in range(n)]
    torch.npu.random.set_rng_state_all(states)
    assert all(torch.equal(torch.randn(16, device=f"npu:{i}").cpu(), draws[i]) for i in range(n))
    # manual_seed_all seeds each device alike: the same seed, the same numbers.
    assert torch.equal(draws[0], draws[1])


def test_seed_and_initial_seed():
    torch.npu.random.manual_seed(99)
    assert torch.npu.random.initial_seed() == 99
    torch.npu.random.seed()
    s = torch.npu.random.initial_seed()
    x = torch.randn(8, device="npu").cpu()
    torch.npu.random.manual_seed(s)
    assert torch.equal(torch.randn(8, device="npu").cpu(), x)
    torch.npu.random.seed_all()
    assert len({torch.npu.get_rng_state(i)[:8].tolist().__repr__() for i in range(torch.npu.device_count())}) == 1


def test_torch_save_of_state_round_trips(tmp_path):
    # As the Trainer saves it: a dict of states through torch.save/torch.load.
    torch.npu.random.manual_seed(5)
    states = {"npu": torch.npu.random.get_rng_state_all()}
    torch.save(states, tmp_path / "rng.pth")
    x = torch.randn(10, device="npu").cpu()
    loaded = torch.load(tmp_path / "rng.pth", weights_only=True)
    torch.npu.random.set_rng_state(loaded["npu"][0])
    assert torch.equal(torch.randn(10, device="npu").cpu(), x)
