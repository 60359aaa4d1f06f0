"""The unboxed entry for the common signatures (Note [Unboxed entry for the
common signatures], python_ext/csrc/aten/unboxed_bridge.cpp): an op made of
tensors and scalars takes the boxed bridge at the first call of a signature
and the unboxed entry at the repeats. Both agree with ATen, in place too; the
unboxed entry falls back where the boxed bridge would (a dtype no plugin
serves, complex, a plugin disabled after the signature was cached) and
hands the calls it does not take (another device, a CPU scalar operand) over,
and bad shapes raise ATen's message."""
import pytest
import torch

import npubridge
from conftest import assert_judged, assert_matches


def test_unboxed_entry_agrees_with_the_cpu_for_every_signature_shape():
    # Ops made of tensors and scalars get an unboxed entry (Note [Unboxed
    # entry for the common signatures]); the first call of a signature takes
    # the boxed bridge, the repeats the unboxed one. Both must agree with ATen.
    torch.manual_seed(0)
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    i = torch.randint(-5, 5, (4, 5))
    na, nb, ni = a.npu(), b.npu(), i.npu()
    aten = torch.ops.aten
    cases = [
        (lambda x, y, k: aten.relu(x), (na, nb, ni), (a, b, i)),                           # (Tensor)
        (lambda x, y, k: aten.mul.Tensor(x, y), (na, nb, ni), (a, b, i)),                  # (Tensor, Tensor)
        (lambda x, y, k: aten.add.Tensor(x, y, alpha=2.5), (na, nb, ni), (a, b, i)),       # (Tensor, Tensor, Scalar)
        (lambda x, y, k: aten.sub.Tensor(k, k, alpha=3), (na, nb, ni), (a, b, i)),
        (lambda x, y, k: aten.mul.Scalar(x, 3), (na, nb, ni), (a, b, i)),                  # (Tensor, Scalar)
        (lambda x, y, k: aten.mul.Scalar(k, 2.5), (na, nb, ni), (a, b, i)),                # int * float -> float
        (lambda x, y, k: aten.add.Scalar(k, True, alpha=2), (na, nb, ni), (a, b, i)),      # (Tensor, Scalar, Scalar)
    ]
    for fn, dev_args, cpu_args in cases:
        want = fn(*cpu_args)
        for _ in range(3):
            got = fn(*dev_args)
            assert got.device == torch.device("npu:0")
            assert got.dtype == want.dtype
            assert_matches(got, fn, *cpu_args)


def test_unboxed_inplace_entry_writes_self_like_the_cpu():
    torch.manual_seed(0)
    a, b, c = torch.randn(4, 5), torch.randn(4, 5), torch.rand(4, 5) + 0.5
    cases = [
        lambda x, y, z: x.add_(y, alpha=-1.5),                   # (Tensor(a!), Tensor, Scalar)
        lambda x, y, z: x.mul_(y),                               # (Tensor(a!), Tensor)
        lambda x, y, z: x.mul_(0.25),                            # (Tensor(a!), Scalar)
        lambda x, y, z: x.addcmul_(y, z, value=0.5),             # (Tensor(a!), Tensor, Tensor, Scalar)
        lambda x, y, z: x.addcdiv_(y, z, value=-2),
        lambda x, y, z: x.lerp_(y, 0.3),
        lambda x, y, z: x.t().mul_(y.t()),                       # a non-contiguous self
        lambda x, y, z: x[1:].sub_(y[1:]),
    ]
    for fn in cases:
        want = a.clone()
        ret_cpu = fn(want, b, c)
        wide = a.double()
        fn(wide, b.double(), c.double())
        for dev in ("npu:0", "npu:1"):
            with torch.npu.device(dev):
                x = a.to(dev)
                for _ in range(2):  # the second call of a signature takes the unboxed entry
                    x.copy_(a.to(dev))
                    ret = fn(x, b.to(dev), c.to(dev))
                    assert ret.data_ptr() == x.data_ptr() + (ret_cpu.data_ptr() - want.data_ptr())
                    assert_judged(x, want, wide)
    with pytest.raises(RuntimeError, match=r"aten::add.out.*cann_like"):
        torch.zeros(3).npu().add_(torch.ones(2, 3).npu())
    z = torch.randn(3, dtype=torch.complex64)
    nz = z.npu()
    nz.mul_(nz)
    assert torch.equal(nz.cpu(), z * z)  # complex: the host's own kernel computes it


def test_unboxed_entry_falls_back_and_hands_over_unusual_calls():
    torch.manual_seed(0)
    # complex has no dtype code plugins know: the host computes it
    c = torch.randn(3, dtype=torch.complex64)
    nc = c.npu()
    npubridge.reset_stats()
    for _ in range(3):
        assert torch.equal((nc * nc).cpu(), c * c)  # the host's own kernels: exact
        assert torch.equal((nc + 1j).cpu(), c + 1j)
    torch.empty(3, device="npu").copy_(torch.ones(3, device="npu"))  # a float copy_: served natively
    torch.empty_like(nc).copy_(nc)  # a complex one: by the host
    s = npubridge.stats()
    assert s["aten::mul.Tensor"]["fallbacks"] == 3
    assert s["aten::copy_"]["fallbacks"] >= 1 and s["aten::copy_"]["native"]["cann_like"] >= 1
    # a dtype the plugin does not serve (int16 matmul): the dispatcher falls
    # back from inside the unboxed call
    s16 = torch.randint(-3, 3, (3, 3), dtype=torch.int16)
    n16 = s16.npu()
    for _ in range(3):
        assert torch.equal((n16 @ n16).cpu(), s16 @ s16)
    # another device than the current one, and a CPU scalar operand
    a = torch.randn(6)
    n1 = a.to("npu:1")
    for _ in range(3):
        r = torch.ops.aten.mul.Tensor(n1, n1)
        assert r.device == torch.device("npu:1")
        assert_matches(r, lambda v: v * v, a)
        assert_matches(n1 * 2.0, lambda v: v * 2.0, a)
    # a plugin disabled after the signature was cached
    x = torch.randn(4, 4)
    nx = x.npu()
    assert_matches(nx @ nx, lambda v: v @ v, x)
    npubridge.disable_plugin("cann_like")
    try:
        npubridge.reset_stats()
        assert_matches(nx @ nx, lambda v: v @ v, x)
        assert torch.equal((nx + nx).cpu(), x + x)  # the fallback: the host's own kernel
        s = npubridge.stats()
        assert s["aten::mm.out"]["fallbacks"] == 1 and s["aten::add.out"]["fallbacks"] == 1
    finally:
        npubridge.enable_plugin("cann_like")
    # bad shapes raise ATen's message, and are not reported as a fallback
    import warnings

    npubridge.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="must match the size"):
            torch.randn(3).npu() - torch.randn(4).npu()
    assert "aten::sub.Tensor" not in npubridge.stats()
