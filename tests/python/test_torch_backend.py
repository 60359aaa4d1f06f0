"""PyTorch on npu through npubridge, checked against PyTorch on the CPU."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import npubridge
from conftest import assert_judged, assert_matches


def test_acceptance_snippet():
    x = torch.ones(3).to("npu")
    assert torch.equal((x + x).cpu(), torch.tensor([2.0, 2.0, 2.0]))
    assert torch.npu.device_count() == 2
    assert (x + x).device == torch.device("npu:0")


def test_factories_devices_and_printing():
    y = torch.randn(2, 3, device="npu:1")
    assert y.device == torch.device("npu:1")
    assert "device='npu:1'" in repr(y)
    z = torch.zeros(4, 5, device="npu")
    assert torch.equal(z.cpu(), torch.zeros(4, 5))
    assert z.is_npu
    assert torch.full((2,), 7.0).npu().cpu().tolist() == [7.0, 7.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_elementwise_and_reductions_match_cpu(dtype):
    torch.manual_seed(0)
    a = (torch.randn(6, 7) * 3).to(dtype)
    b = (torch.randn(7) * 3).to(dtype)
    na, nb = a.npu(), b.npu()
    for fn in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - 2 * y, torch.maximum, lambda x, y: x > y):
        assert_matches(fn(na, nb), fn, a, b)
    assert_matches(na.sum(dim=1), lambda x: x.sum(dim=1), a)
    assert_matches(na.amax(dim=0), lambda x: x.amax(dim=0), a)
    if dtype != torch.int64:
        assert_matches(na.mean(dim=1), lambda x: x.mean(dim=1), a)
        assert_matches(torch.softmax(na, dim=1), lambda x: torch.softmax(x, dim=1), a)


def test_views_are_native_and_strided_inputs_work():
    a = torch.randn(4, 6)
    na = a.npu()
    t = na.t()
    assert t.data_ptr() == na.data_ptr()  # a view, not a copy
    assert_matches(t @ na, lambda x: x.t() @ x, a)
    assert torch.equal(na[1:3, ::2].cpu(), a[1:3, ::2])  # a view and a relu compute nothing: exact
    assert torch.equal(na.view(3, 8).relu().cpu(), a.view(3, 8).relu())


def test_inplace_and_out_variants():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    na, nb = a.npu(), b.npu()
    na.add_(nb, alpha=2)
    assert_matches(na, lambda x, y: x + 2 * y, a, b)
    out = torch.empty(3, 4, device="npu")
    torch.mul(na, nb, out=out)
    assert_matches(out, lambda x, y: (x + 2 * y) * y, a, b)
    before = na.cpu()
    na.relu_()
    assert torch.equal(na.cpu(), before.relu())  # exact


def test_nn_ops_and_a_few_training_steps_match_cpu():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(*[m for m in model])  # same parameters object graph
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    cpu_model.load_state_dict(model.state_dict())
    npu_model = model.npu()
    wide_model = copy.deepcopy(cpu_model).double()  # the reference: float64 on the CPU
    opt_n = torch.optim.SGD(npu_model.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    opt_w = torch.optim.SGD(wide_model.parameters(), lr=0.1)
    for step in range(3):
        ln = F.cross_entropy(npu_model(x.npu()), y.npu())
        lc = F.cross_entropy(cpu_model(x), y)
        lw = F.cross_entropy(wide_model(x.double()), y)
        assert_judged(ln, lc, lw, f"loss of step {step}")
        for o in (opt_n, opt_c, opt_w):
            o.zero_grad()
        for loss in (ln, lc, lw):
            loss.backward()
        for o in (opt_n, opt_c, opt_w):
            o.step()
    for i, (pn, pc, pw) in enumerate(zip(npu_model.parameters(), cpu_model.parameters(), wide_model.parameters())):
        assert_judged(pn, pc, pw, f"parameter {i} after 3 steps")
    del ref


def test_statistics_count_native_calls_and_fallbacks():
    npubridge.reset_stats()
    a = torch.randn(5).npu()
    (a + a).cpu()
    torch.tan(a).cpu()  # no plugin serves tan: CPU fallback
    s = npubridge.stats()
    assert s["aten::add.out"]["native"]["cann_like"] >= 1
    assert s["aten::tan"]["fallbacks"] >= 1 if "aten::tan" in s else s["aten::tan.out"]["fallbacks"] >= 1


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


def test_mixed_devices_raise_pytorchs_message():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.randn(3).npu() + torch.randn(3)


def test_plugin_errors_surface_as_python_exceptions():
    # Shapes are checked by ATen's meta kernel first, with PyTorch's message.
    with pytest.raises(RuntimeError, match="reduction dim|cannot be multiplied"):
        torch.randn(2, 3).npu() @ torch.randn(4, 5).npu()
    # A plugin's own check names the op, the plugin and the reason, with
    # the class the CPU raises (IndexError for an index out of range).
    weight = torch.randn(10, 4).npu()
    with pytest.raises(IndexError, match=r"aten::embedding.*cann_like.*index out of range"):
        F.embedding(torch.tensor([3, 12]).npu(), weight)


def test_device_module_and_memory_stats():
    assert torch.npu.is_available()
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        t = torch.empty(1024, device="npu")
        assert t.device.index == 1
    assert torch.npu.current_device() == 0
    before = torch.npu.memory_allocated(0)
    big = torch.empty(1 << 20, device="npu:0")
    assert torch.npu.memory_allocated(0) >= before + 4 * (1 << 20)
    del big
    torch.npu.synchronize()


def test_plugin_control():
    names = [p["name"] for p in npubridge.plugins()]
    assert "cann_like" in names
    a = torch.randn(4, 4).npu()
    npubridge.disable_plugin("cann_like")
    try:
        npubridge.reset_stats()
        assert_matches(a @ a, lambda v: v @ v, a.cpu())
        assert npubridge.stats()["aten::mm.out"]["fallbacks"] == 1
    finally:
        npubridge.enable_plugin("cann_like")


def _run(code, **env):
    import os
    import subprocess
    import sys

    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120)


def test_fallback_error_mode():
    r = _run("import torch, npubridge\ntorch.tan(torch.ones(3).npu())", NPUB_FALLBACK="error")
    assert r.returncode != 0
    assert "aten::tan" in r.stderr and "NPUB_FALLBACK=error" in r.stderr


def test_out_of_memory_raises_torch_oom_with_the_allocators_message():
    code = (
        "import torch, npubridge\n"
        "try:\n"
        "    torch.empty(64 << 20, device='npu')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('OOM:', e)\n"
    )
    r = _run(code, NPUB_SIM_MEMORY="64M")
    assert r.returncode == 0, r.stderr
    assert "OOM: npu:0 out of memory: tried to allocate 256.00 MiB" in r.stdout
    assert "capacity of 64.00 MiB" in r.stdout


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


def test_plugin_ops_appear_under_torch_ops():
    assert set(npubridge.routed_ops()["custom"]) >= {"mindspeed_like::npu_rms_norm", "vllm_like::silu_and_mul",
                                                      "cann_like::conv2d_bias_relu"}
    x, g = torch.randn(2, 3, 16), torch.randn(16)
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(x.npu(), g.npu(), 1e-6)
    assert_matches(y, lambda v, w: v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, g)
    assert_matches(rstd, lambda v: torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6), x)
    inp = torch.randn(4, 32)
    out = torch.empty(4, 16, device="npu")
    torch.ops.vllm_like.silu_and_mul(out, inp.npu())
    assert_matches(out, lambda v: F.silu(v[:, :16]) * v[:, 16:], inp)
    xc, w, b = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    yc = torch.ops.cann_like.conv2d_bias_relu(xc.npu(), w.npu(), b.npu(), [1, 1], [1, 1], [1, 1], 1)
    assert_matches(yc, lambda v, k, c: F.relu(F.conv2d(v, k, c, padding=1)), xc, w, b)


def _rms_norm_reference(x, g, eps=1e-6):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * g, rstd


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plugin_op_autograd_comes_from_the_plugins_derivative_formula(dtype):
    assert "mindspeed_like::npu_rms_norm" in [d["op"] for d in npubridge._C.derivatives()]
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    g = torch.randn(16, dtype=dtype, requires_grad=True)
    xn = x.detach().npu().requires_grad_()
    gn = g.detach().npu().requires_grad_()
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(xn, gn)
    # The oracle: PyTorch's own autograd through the formula, in float64.
    x64, g64 = x.detach().double().requires_grad_(), g.detach().double().requires_grad_()
    y64, _ = _rms_norm_reference(x64, g64)
    dy = torch.randn(3, 5, 16, dtype=dtype)
    (y * dy.npu()).sum().backward()
    (y64 * dy.double()).sum().backward()
    # Judged by the error model (conftest.assert_judged): the same formula's
    # autograd on the CPU in `dtype` calibrates the bound.
    y_host, _ = _rms_norm_reference(x, g)
    (y_host * dy).sum().backward()
    assert_judged(xn.grad, x.grad, x64.grad, "d x")
    assert_judged(gn.grad, g.grad, g64.grad, "d gamma")
    assert npubridge.stats()["mindspeed_like::npu_rms_norm_backward"]["native"]["mindspeed_like"] >= 1
    # Only the second output reaches the loss: the backward gets zeros for dy.
    xn.grad = None
    _, rstd = torch.ops.mindspeed_like.npu_rms_norm(xn, gn)
    rstd.sum().backward()
    assert xn.grad is not None and torch.count_nonzero(xn.grad.cpu()) == 0


def test_plugin_ops_have_fake_kernels_for_compile_and_export():
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Meta tensors and fake tensors: shapes from the plugin's meta function.
    y, rstd = torch.ops.mindspeed_like.npu_rms_norm(torch.empty(3, 5, 8, device="meta"), torch.empty(8, device="meta"))
    assert (y.shape, rstd.shape, rstd.dtype) == ((3, 5, 8), (3, 5, 1), torch.float32)
    with FakeTensorMode():
        y, rstd = torch.ops.mindspeed_like.npu_rms_norm(torch.empty(2, 8, dtype=torch.bfloat16, device="npu"),
                                                        torch.empty(8, dtype=torch.bfloat16, device="npu"))
        assert (y.shape, y.dtype, y.device, rstd.dtype) == ((2, 8), torch.bfloat16, torch.device("npu:0"), torch.float32)
    # The meta function rejects what the kernel rejects, with its message.
    with pytest.raises(RuntimeError, match=r"npu_rms_norm' \(plugin 'mindspeed_like'\): gamma: expected the trailing shape"):
        torch.ops.mindspeed_like.npu_rms_norm(torch.empty(3, 8, device="meta"), torch.empty(7, device="meta"))
    with pytest.raises(RuntimeError, match=r"silu_and_mul.*out: expected shape \[3, 8\] but found \[3, 9\]"):
        torch.ops.vllm_like.silu_and_mul(torch.empty(3, 9, device="meta"), torch.empty(3, 16, device="meta"))

    # PyTorch's own custom-op checker: schema, fake tensor and AOT dispatch
    # (its autograd-registration check supports only CPU/CUDA/XPU devices).
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    x, g = torch.randn(4, 8).npu().requires_grad_(), torch.randn(8).npu().requires_grad_()
    r = torch.library.opcheck(torch.ops.mindspeed_like.npu_rms_norm.default, (x, g), test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r
    r = torch.library.opcheck(torch.ops.vllm_like.silu_and_mul.default,
                              (torch.empty(3, 8).npu(), torch.randn(3, 16).npu()), test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r
    xc, w, b = torch.randn(1, 3, 8, 8).npu(), torch.randn(4, 3, 3, 3).npu(), torch.randn(4).npu()
    r = torch.library.opcheck(torch.ops.cann_like.conv2d_bias_relu.default, (xc, w, b, [2, 2], [1, 1], [1, 1], 1),
                              test_utils=utils)
    assert set(r.values()) == {"SUCCESS"}, r

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            y, _ = torch.ops.mindspeed_like.npu_rms_norm(x, self.w)
            return (y * 2).sum()

    m = Block().npu()
    xx = torch.randn(4, 8).npu()
    eager = m(xx)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)(xx)
    torch.testing.assert_close(compiled.cpu(), eager.cpu())
    ep = torch.export.export(m, (xx,))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.mindspeed_like.npu_rms_norm.default in targets
    torch.testing.assert_close(ep.module()(xx).cpu(), eager.cpu())


def test_autocast_follows_pytorchs_policy():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.autocast("npu", dtype=torch.bfloat16):
        c = a.npu() @ b.npu()
        s = torch.softmax(c, dim=-1)
        lin = F.linear(a.npu(), b.npu())
    assert c.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert s.dtype == torch.float32
    assert_matches(c, lambda x, y: x @ y, a.bfloat16(), b.bfloat16())


def test_save_load_and_dlpack_round_trips():
    import io

    from torch.utils.dlpack import from_dlpack, to_dlpack

    x = torch.arange(6.0).reshape(2, 3).to("npu:1")
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    for location, device in ((None, "npu:1"), ("cpu", "cpu"), ("npu:0", "npu:0")):
        buf.seek(0)
        y = torch.load(buf, map_location=location)["x"]
        assert y.device == torch.device(device)
        assert torch.equal(y.cpu(), x.cpu())
    z = from_dlpack(to_dlpack(x))
    assert z.device == x.device and torch.equal(z.cpu(), x.cpu())


def test_streams_events_and_rng_state():
    s = torch.npu.Stream()
    assert s != torch.npu.default_stream()
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
        a = torch.ones(1000, device="npu") * 3
        m = torch.randn(512, 512, device="npu")
        start, mid, end = (torch.npu.Event(enable_timing=True) for _ in range(3))
        start.record()
        b = a + a
        m2 = m @ m  # real work between the events: a few milliseconds
        mid.record()
        m3 = m2 @ m
        end.record()
    assert torch.npu.current_stream() == torch.npu.default_stream()
    end.synchronize()
    # What the events measure (no timing threshold): the stream's own order,
    # time spent in the products, and additivity.
    first, second, whole = start.elapsed_time(mid), mid.elapsed_time(end), start.elapsed_time(end)
    assert end.query() and first > 0 and second > 0
    assert whole == pytest.approx(first + second, rel=1e-3, abs=1e-3)
    assert mid.elapsed_time(start) == pytest.approx(-first, rel=1e-6)
    assert torch.isfinite(m3).all()
    s.synchronize()
    assert torch.equal(b.cpu(), torch.full((1000,), 6.0))
    state = torch.npu.get_rng_state()
    x1 = torch.randn(100, device="npu")
    torch.npu.set_rng_state(state)
    x2 = torch.randn(100, device="npu")
    assert torch.equal(x1.cpu(), x2.cpu())


def test_torch_accelerator_works_for_npu():
    A = torch.accelerator
    assert A.is_available() and A.current_accelerator() == torch.device("npu") and A.device_count() == 2
    with A.device_index(1):
        assert A.current_device_index() == 1
        assert torch.ones(2, device="npu").device == torch.device("npu:1")
    assert A.current_device_index() == 0
    # Memory statistics come from the simulated device's caching allocator.
    A.synchronize()
    A.empty_cache()
    A.reset_peak_memory_stats(0)
    base = A.memory_allocated(0)
    x = torch.empty(1 << 20, device="npu")  # 4 MiB
    assert A.memory_allocated(0) == base + (4 << 20)
    assert A.max_memory_allocated(0) >= base + (4 << 20)
    assert A.memory_reserved(0) >= A.memory_allocated(0)
    stats = A.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == A.memory_allocated(0)
    assert stats["allocation.all.allocated"] >= 1
    assert A.memory_allocated(0) == torch.npu.memory_allocated(0)
    free, total = A.get_memory_info(0)
    assert total == 16 << 30 and 0 < free <= total
    del x
    assert A.memory_allocated(0) == base
    # Streams and events are the simulator's: work on a side stream, an event
    # recorded after it, the default stream waiting for that event.
    side = torch.Stream(device="npu:0")
    assert side != A.current_stream() and side.stream_id != 0
    start, end = torch.Event(device="npu", enable_timing=True), torch.Event(device="npu", enable_timing=True)
    a = torch.randn(256, 256, device="npu")
    with side:
        assert A.current_stream() == side
        start.record()
        b = a @ a
        end.record()
    A.current_stream().wait_event(end)
    end.synchronize()
    assert end.query() and side.query()
    assert start.elapsed_time(end) > 0  # the 256^3 product ran between them
    assert_matches(b, lambda v: v @ v, a.cpu())
    assert A.current_stream().stream_id == 0


def test_precision_check_agrees_with_atens_cpu_kernels_on_a_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).to("npu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16).npu(), torch.randint(0, 4, (8,)).npu()
    npubridge.reset_stats()
    npubridge.precision_check(True, raise_on_mismatch=True)
    try:
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert npubridge.precision_mismatches() == []
    finally:
        npubridge.precision_check(False)
    stats = npubridge.stats()
    assert stats["aten::addmm.out"]["native"]["cann_like"] >= 2
    assert all(s.get("precision_mismatches", 0) == 0 for s in stats.values())


def test_precision_check_catches_a_wrong_kernel():
    import os

    # The sloppy test plugin serves aten::neg.out (float32) off by 1e-3.
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
x = torch.randn(64)
assert torch.allclose((-x.npu()).cpu(), -x, atol=2e-3)  # unchecked: runs, slightly wrong
npubridge.precision_check(True)
y = (-x.npu()).cpu()
m = npubridge.precision_mismatches()
assert len(m) == 1, m
m = m[0]
assert (m["op"], m["plugin"], m["output"]) == ("aten::neg", "sloppy", "return 0"), m
assert m["mismatched"] == 64 and m["numel"] == 64, m
assert abs(m["abs_error"] - 1e-3) < 1e-5, m
assert "precision check failed for op 'aten::neg' (plugin 'sloppy')" in m["message"], m
assert "exceed their error bound" in m["message"] and "exact (" in m["message"], m  # neg computes nothing: exact
assert m["bound"] == 0, m
assert npubridge.stats()["aten::neg.out"]["precision_mismatches"] == 1
npubridge.precision_check(True, raise_on_mismatch=True)
try:
    -x.npu()
    raise SystemExit("no error")
except RuntimeError as e:
    assert "precision check failed for op 'aten::neg' (plugin 'sloppy')" in str(e), e
npubridge.precision_check(True)
(x.npu() @ x.npu().unsqueeze(1), x.npu().sum(), x.npu() * 3)  # accurate kernels pass, whatever their summation order
assert npubridge.precision_mismatches() == [], npubridge.precision_mismatches()
print("ok")
"""
    r = _run(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_process_exits_cleanly_after_an_npu_backward():
    code = (
        "import torch, npubridge\n"
        "x = torch.randn(4, 5, device='npu', requires_grad=True)\n"
        "parts = torch.split(x, [1, 3])\n"
        "torch.autograd.grad(sum(p.sum() for p in parts), [x])\n"
    )
    for _ in range(5):
        r = _run(code)
        assert r.returncode == 0, r.stderr[-500:]


def test_tied_weights_stay_tied_through_to_and_back():
    # Module._apply keeps Parameter objects only for shallow-copy compatible
    # tensor types (Note [npu tensors are shallow-copy compatible with CPU
    # ones]); a tied embedding must stay one tensor and get one gradient.
    torch.manual_seed(0)
    e = torch.nn.Embedding(8, 4)
    lin = torch.nn.Linear(4, 8, bias=False)
    lin.weight = e.weight
    m = torch.nn.ModuleList([e, lin])
    w0 = e.weight.detach().clone()
    m = m.to("npu")
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "npu"
    assert isinstance(m[0].weight, torch.nn.Parameter)
    ids = torch.tensor([1, 5, 1, 7])
    m[1](m[0](ids.npu())).square().sum().backward()

    def tied_grad(w):  # the gradient of the tied weight through both uses, on the CPU
        w = w.clone().requires_grad_(True)
        torch.nn.functional.linear(torch.nn.functional.embedding(ids, w), w).square().sum().backward()
        return w.grad

    assert_matches(m[0].weight.grad, tied_grad, w0)
    back = m.to("cpu")
    assert back[0].weight is back[1].weight and back[0].weight.device.type == "cpu"


def test_manual_seed_takes_what_the_cpu_takes():
    # torch.manual_seed seeds npu too (the custom-device hook); a negative
    # seed wraps to uint64 as the CPU generator's does, and an out-of-range
    # one raises the CPU's error, not a TypeError from the binding.
    torch.manual_seed(-1)
    assert torch.initial_seed() == 2**64 - 1
    a = torch.rand(4, device="npu")
    torch.npu.manual_seed(2**64 - 1)
    assert torch.equal(torch.rand(4, device="npu").cpu(), a.cpu())
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="Overflow"):
            torch.manual_seed(bad)
    torch.manual_seed(0)


def test_an_op_pytorch_refuses_is_disabled_alone():
    # refused::named takes a Dimname, a type PyTorch's schema parser refuses
    # outside ATen: npubridge accepts the schema, PyTorch does not. That op is disabled with
    # a warning naming it, its plugin and PyTorch's reason; import torch and
    # the plugin's other op work.
    import os

    code = """
import torch, npubridge
x = torch.arange(3.0).npu()  # plugin ops exist under torch.ops once the runtime started
print(torch.ops.refused.twice(x).cpu().tolist())
"""
    r = _run(code, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_REFUSED_PLUGIN_DIR"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "[0.0, 2.0, 4.0]", r.stdout + r.stderr
    assert ("op 'refused::named' of plugin 'refused' is not available under PyTorch: PyTorch refuses its schema"
            in r.stderr), r.stderr
    assert "unknown type specifier" in r.stderr, r.stderr


def test_subtraction_with_bool_operands_is_refused_as_on_the_cpu():
    # ATen's sub_check: two bools, or one bool and a number, are errors
    # (the npu computed `int - bool` before).
    b = torch.tensor([True, False])
    i = torch.tensor([1, 2])
    for x, y, message in [(b, b, "with two bool tensors"), (i, b, "with a bool tensor"),
                          (b, True, "with two bool tensors"), (i, True, "with a bool tensor")]:
        with pytest.raises(RuntimeError, match=message):
            x - y
        yn = y.to("npu") if isinstance(y, torch.Tensor) else y
        with pytest.raises(RuntimeError, match=message):
            x.to("npu") - yn


def test_a_call_the_dispatcher_falls_back_returns_on_the_npu():
    # Note [One way to the CPU]: with no eligible kernel (optimisation level
    # 0 disables every plugin), a CPU scalar first operand used to bring the
    # result back on the CPU.
    x = torch.arange(4.0, device="npu")
    npubridge.set_optim_level(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f, expect in [(lambda: torch.mul(torch.tensor(3.0), x), [0.0, 3, 6, 9]),
                              (lambda: torch.add(torch.tensor(3.0), x), [3.0, 4, 5, 6]),
                              (lambda: torch.tensor(2.0) - x, [2.0, 1, 0, -1])]:
                r = f()
                assert r.device == x.device
                assert r.cpu().tolist() == expect
    finally:
        npubridge.set_optim_level(2)


def test_new_streams_share_one_pool_and_threads_stay_bounded():
    # torch.npu.Stream() made a stream (and a thread) per call, never freed,
    # while torch.Stream(device="npu") used a pool: both draw from the
    # device's pool now.
    import os
    threads = lambda: len(os.listdir("/proc/self/task"))
    for _ in range(8):
        torch.npu.Stream(), torch.Stream(device="npu:0")
    before = threads()
    ids = {torch.npu.Stream().stream_id for _ in range(20)} | {torch.Stream(device="npu:0").stream_id for _ in range(20)}
    assert threads() == before
    assert 0 not in ids and len(ids) <= 4
