"""torch.Generator(device="npu") and the default npu generators: seeding,
state, independence; the random ops plugin kernels serve on the device
(normal_, dropout, and exponential_, which vLLM's sampler runs with the
in-place cumsum_ of top-p), and those that fall back to the CPU (Note
[Random fallbacks draw from the npu generator])."""
import pytest
import torch

import npubridge

N = 4096


def test_a_new_generator_is_an_npu_generator_with_pytorchs_default_seed():
    g = torch.Generator(device="npu")
    assert g.device.type == "npu"
    assert g.initial_seed() == 67280421310721
    assert g.get_offset() == 0
    g.manual_seed(7)
    assert g.initial_seed() == 7


def test_the_same_seed_gives_the_same_numbers_and_the_stream_moves_on():
    g = torch.Generator(device="npu").manual_seed(7)
    a = torch.rand(N, device="npu", generator=g).cpu()
    b = torch.rand(N, device="npu", generator=g).cpu()
    g.manual_seed(7)
    a2 = torch.rand(N, device="npu", generator=g).cpu()
    assert torch.equal(a, a2)
    assert not torch.equal(a, b)
    # Uniform on [0, 1): mean 1/2 with standard error 1/sqrt(12 N).
    assert a.min() >= 0 and a.max() < 1
    assert abs(a.double().mean().item() - 0.5) < 5 / (12 * N) ** 0.5
    n = torch.randn(N, device="npu", generator=g).cpu().double()
    assert abs(n.mean().item()) < 5 / N**0.5
    assert abs(n.std().item() - 1) < 5 / (2 * N) ** 0.5


def test_an_explicit_generator_leaves_the_default_one_alone():
    torch.npu.manual_seed(1)
    before = torch.npu.get_rng_state()
    g = torch.Generator(device="npu").manual_seed(1)
    x = torch.rand(N, device="npu", generator=g).cpu()
    assert torch.equal(torch.npu.get_rng_state(), before)
    # ... and draws what the default generator draws from the same seed.
    y = torch.rand(N, device="npu").cpu()
    assert torch.equal(x, y)


def test_two_generators_with_one_seed_are_independent_streams():
    g1 = torch.Generator(device="npu").manual_seed(3)
    g2 = torch.Generator(device="npu").manual_seed(3)
    x1 = torch.rand(N, device="npu", generator=g1).cpu()
    torch.rand(N, device="npu", generator=g1)
    y1 = torch.rand(N, device="npu", generator=g2).cpu()
    assert torch.equal(x1, y1)


def test_state_round_trips_and_a_bad_state_is_refused():
    g = torch.Generator(device="npu").manual_seed(5)
    torch.rand(100, device="npu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.numel() == 16 and state.device.type == "cpu"
    assert int.from_bytes(bytes(state[:8].tolist()), "little") == 5
    assert int.from_bytes(bytes(state[8:].tolist()), "little") == g.get_offset() > 0
    a = torch.rand(N, device="npu", generator=g).cpu()
    g.set_state(state)
    b = torch.rand(N, device="npu", generator=g).cpu()
    assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="ByteTensor"):
        g.set_state(torch.zeros(16, dtype=torch.float32))


def test_the_default_generator_is_the_devices():
    d = torch.npu.default_generators[0]
    assert d.device == torch.device("npu", 0)
    d.manual_seed(9)
    assert torch.npu.initial_seed() == 9
    a = torch.rand(N, device="npu").cpu()
    torch.npu.manual_seed(9)
    b = torch.rand(N, device="npu").cpu()
    assert torch.equal(a, b)
    assert torch.equal(d.get_state(), torch.npu.get_rng_state())


def test_a_cpu_generator_is_refused_naming_the_op():
    with pytest.raises(TypeError, match="generator of device type 'npu'.*found one of 'cpu'"):
        torch.rand(4, device="npu", generator=torch.Generator())


def test_random_fallbacks_draw_from_the_npu_generator():
    # randperm and multinomial have no plugin kernel: ATen's CPU kernels run
    # on a CPU generator seeded from the npu generator.
    g = torch.Generator(device="npu").manual_seed(11)
    p1 = torch.randperm(100, device="npu", generator=g)
    p2 = torch.randperm(100, device="npu", generator=g)
    assert p1.device.type == "npu"
    assert torch.equal(p1.cpu().sort().values, torch.arange(100))
    assert not torch.equal(p1.cpu(), p2.cpu())
    g.manual_seed(11)
    assert torch.equal(torch.randperm(100, device="npu", generator=g).cpu(), p1.cpu())
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], device="npu")
    g.manual_seed(2)
    m1 = torch.multinomial(probs, 64, replacement=True, generator=g).cpu()
    g.manual_seed(2)
    m2 = torch.multinomial(probs, 64, replacement=True, generator=g).cpu()
    assert torch.equal(m1, m2)
    assert m1.min() >= 0 and m1.max() <= 3
    # Without an explicit generator, the device's default one decides: the
    # CPU's generator does not.
    torch.npu.manual_seed(4)
    q1 = torch.randperm(100, device="npu").cpu()
    torch.default_generator.manual_seed(123)
    torch.npu.manual_seed(4)
    q2 = torch.randperm(100, device="npu").cpu()
    assert torch.equal(q1, q2)


def test_random_ops_run_on_the_device_and_follow_the_seed():
    npubridge.reset_stats()
    torch.manual_seed(7)
    a = torch.randn(1000, device="npu")
    b = torch.rand(1000, device="npu")
    torch.manual_seed(7)
    a2 = torch.randn(1000, device="npu")
    assert torch.equal(a.cpu(), a2.cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    assert abs(a.cpu().mean().item()) < 0.2 and 0.8 < a.cpu().std().item() < 1.2
    assert 0 <= b.cpu().min().item() and b.cpu().max().item() < 1
    s = npubridge.stats()
    assert s["aten::normal_"]["native"]["cann_like"] >= 2 and s["aten::normal_"]["fallbacks"] == 0
    # dropout in training mode uses the same stream
    torch.manual_seed(1)
    d1 = torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5, training=True)
    torch.manual_seed(1)
    d2 = torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5, training=True)
    assert torch.equal(d1.cpu(), d2.cpu())


def test_exponential_and_in_place_cumsum_run_on_the_device():
    """What vLLM's sampler runs at temperature > 0: exponential_ (the
    Gumbel-max trick divides the probabilities by it) and the in-place
    cumsum_ of top-p."""
    npubridge.reset_stats()
    torch.manual_seed(3)
    q = torch.empty(200_000, device="npu").exponential_(2.0).cpu().double()
    torch.manual_seed(3)
    assert torch.equal(torch.empty(200_000, device="npu").exponential_(2.0).cpu().double(), q)
    # Exp(2): mean 1/2, variance 1/4; the sample mean's standard error is
    # 0.5 / sqrt(2e5) ~ 1.1e-3, the variance's about 1.7e-3: 6 sigma bounds.
    assert q.min().item() > 0 and torch.isfinite(q).all()
    assert abs(q.mean().item() - 0.5) < 7e-3 and abs(q.var().item() - 0.25) < 1.1e-2
    with pytest.raises(RuntimeError, match=r"exponential_ expects lambda > 0.0, but found lambda=-1"):
        torch.empty(4, device="npu").exponential_(-1.0)
    x = torch.rand(4, 1000)
    xn = x.npu()
    xn.cumsum_(-1)
    # float64 accumulation rounded once to float32: within an ulp of the
    # float64 sums (at most 1000).
    ref = x.double().cumsum(-1)
    assert ((xn.cpu().double() - ref).abs() <= ref.abs() * 2**-23).all()
    s = npubridge.stats()
    assert s["aten::exponential_"]["fallbacks"] == 0 and s["aten::cumsum.out"]["fallbacks"] == 0
