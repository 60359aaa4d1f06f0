"""torch.npu as the Hugging Face libraries and PyTorch's own machinery use
it: torch.npu.random (checkpointed RNG state), torch.npu.amp (GradScaler,
autocast), Dynamo's device interface, every torch.npu call that
transformers/accelerate/peft make, and the "hccl" name of the npu
collective backend. One file, one interpreter start: these are small."""
import importlib
import importlib.util
import os
import re
import warnings

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.device_interface import get_interface_for_device, get_registered_device_interfaces

import npubridge  # noqa: F401
from conftest import assert_judged


# torch.npu.random: the RNG state functions libraries save in checkpoints
# (transformers' Trainer: torch.npu.random.get_rng_state_all on save,
# set_rng_state on resume) reproduce the same random numbers.


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


# torch.npu.amp: GradScaler on npu tensors scales, unscales, skips steps
# with inf/NaN gradients and updates its scale exactly as torch.amp's
# GradScaler does on the CPU; autocast is torch.autocast("npu").


def _train(device, scaler, grads_to_poison=(), steps=6, dtype=torch.float32):
    """A few SGD steps of a linear layer under a GradScaler; the gradient of
    the steps in grads_to_poison made inf. Returns (weights, scales)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.125)
    x = torch.arange(8.0).reshape(2, 4).to(device, dtype) / 8
    scales = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(x).square().sum()
        scaler.scale(loss).backward()
        if step in grads_to_poison:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


@pytest.mark.parametrize("poison", [(), (1,), (0, 2, 3)])
def test_grad_scaler_matches_the_cpus(poison):
    kw = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    npu_w, npu_scales = _train("npu", torch.npu.amp.GradScaler(**kw), poison)
    cpu_w, cpu_scales = _train("cpu", torch.amp.GradScaler("cpu", **kw), poison)
    wide_w, wide_scales = _train("cpu", torch.amp.GradScaler("cpu", **kw), poison, dtype=torch.float64)
    assert npu_scales == cpu_scales == wide_scales
    # Scales are powers of two, so scaling and unscaling are exact: the
    # weights are judged by the error model against the same steps in
    # float64, as any other training.
    for a, b, w in zip(npu_w, cpu_w, wide_w):
        assert_judged(a, b, w, "weights after the scaled steps")
    if poison:
        assert min(npu_scales) < kw["init_scale"]  # backed off


def test_skipped_step_leaves_weights_unchanged():
    scaler = torch.npu.amp.GradScaler(init_scale=4.0)
    p = torch.nn.Parameter(torch.ones(3, device="npu"))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler.scale((p * 2).sum()).backward()
    assert torch.equal(p.grad.cpu(), torch.full((3,), 8.0))  # scaled by 4
    p.grad[1] = float("nan")
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach().cpu(), torch.ones(3))
    assert scaler.get_scale() == 2.0


def test_unscale_gives_the_true_gradient():
    scaler = torch.npu.amp.GradScaler(init_scale=2.0**8)
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], device="npu"))
    opt = torch.optim.SGD([p], lr=0.5)
    scaler.scale((p * p).sum()).backward()
    scaler.unscale_(opt)
    assert torch.equal(p.grad.cpu(), torch.tensor([2.0, -4.0, 6.0]))
    scaler.step(opt)
    scaler.update()
    assert torch.equal(p.detach().cpu(), torch.tensor([0.0, 0.0, 0.0]))


def test_static_scale_with_dynamic_false():
    scaler = torch.npu.amp.GradScaler(init_scale=16.0, dynamic=False, growth_interval=1)
    weights, scales = _train("npu", scaler, grads_to_poison=(1,), steps=4)
    assert scales == [16.0] * 4
    # The poisoned step was skipped: three steps' weights, not four.
    three, _ = _train("npu", torch.npu.amp.GradScaler(init_scale=16.0, dynamic=False), steps=3)
    assert all(torch.equal(a, b) for a, b in zip(weights, three))
    assert scaler.state_dict()["dynamic"] is False
    other = torch.npu.amp.GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other._dynamic is False and other.get_scale() == 16.0
    with pytest.raises(TypeError, match="dynamic to be a bool"):
        torch.npu.amp.GradScaler(dynamic="no")


def test_no_deprecation_warning_as_torch_npu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.npu.amp.GradScaler()
        with torch.npu.amp.autocast():
            pass


def test_autocast_is_npu_autocast():
    from torch.npu.amp import autocast

    a = torch.randn(4, 4, device="npu")
    with autocast():
        assert torch.is_autocast_enabled("npu")
        assert torch.get_autocast_dtype("npu") == torch.float16
        assert (a @ a).dtype == torch.float16
    with autocast(dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(enabled=False):
        assert (a @ a).dtype == torch.float32
    assert not torch.is_autocast_enabled("npu")


def test_custom_fwd_casts_inputs():
    class Square(torch.autograd.Function):
        @staticmethod
        @torch.npu.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.npu.amp.custom_bwd
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.ones(3, device="npu", dtype=torch.float16, requires_grad=True)
    with torch.npu.amp.autocast():
        y = Square.apply(x)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0, dtype=torch.float16))


# Dynamo's device interface for the npu: what torch._dynamo and Inductor
# ask a device's runtime, answered by torch.npu.


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


# Every ``torch.npu.<name>`` that the installed transformers, accelerate,
# peft and trl call in their NPU branches exists on npubridge's torch.npu (found by
# reading their sources, so that a new release's new call fails here rather
# than in a user's Trainer run).


_CALL = re.compile(r"\btorch\.npu\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


def _calls(package):
    spec = importlib.util.find_spec(package)
    if spec is None:
        pytest.skip(f"{package} is not installed")
    root = os.path.dirname(spec.origin)
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for match in _CALL.finditer(f.read()):
                        found.setdefault(match.group(1), os.path.relpath(path, root))
    return found


@pytest.mark.parametrize("package", ["transformers", "accelerate", "peft", "trl"])
def test_every_torch_npu_call_exists(package):
    calls = _calls(package)
    missing = []
    for dotted, where in sorted(calls.items()):
        obj = torch.npu
        for part in dotted.split("."):
            if not hasattr(obj, part):
                missing.append(f"torch.npu.{dotted} ({package}/{where})")
                break
            obj = getattr(obj, part)
    assert not missing, "missing on torch.npu: " + ", ".join(missing)
    if package in ("transformers", "accelerate", "trl"):
        assert calls, f"found no torch.npu call in {package}: the scan is broken"


# The npu collective backend answers to "hccl", the name Ascend's stack
# and accelerate use for NPU collectives ("npu" stays the npu's default);
# a 2-rank run over it: distributed/test_hccl_alias.py.


def test_hccl_is_registered_for_npu():
    assert dist.Backend("hccl") == "hccl"
    assert "npu" in dist.Backend.backend_capability["hccl"]
    assert dist.Backend.default_device_backend_map["npu"] == "npu"
