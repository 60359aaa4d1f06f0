"""Hostile and careless input, cpu against npu: every case runs on both
devices, and the npu must give the CPU's values (dtype and shape included)
or raise the CPU's exception class with ATen's message."""
import os

import pytest
import torch
import torch.nn.functional as F

import npubridge  # noqa: F401  (registers the npu device)
from conftest import Zygote, assert_same_outcome


def t(values, device, dtype=None):
    return torch.tensor(values, device=device, dtype=dtype)


MASK = [True, False, True]
NAN, INF = float("nan"), float("inf")

CASES = {
    # scalars that do not fit the tensor's dtype
    "masked_fill int8 with 300": lambda d: torch.zeros(3, dtype=torch.int8, device=d).masked_fill(t(MASK, d), 300),
    "masked_fill int32 with nan": lambda d: torch.zeros(3, dtype=torch.int32, device=d).masked_fill(t(MASK, d), NAN),
    "masked_fill uint8 with -1 wraps": lambda d: torch.zeros(3, dtype=torch.uint8, device=d).masked_fill(t(MASK, d), -1),
    "masked_fill uint8 with -256": lambda d: torch.zeros(3, dtype=torch.uint8, device=d).masked_fill(t(MASK, d), -256),
    "masked_fill float16 with 1e40": lambda d: torch.zeros(3, dtype=torch.float16, device=d).masked_fill(t(MASK, d), 1e40),
    "masked_fill float32 with inf": lambda d: torch.zeros(3, device=d).masked_fill(t(MASK, d), INF),
    "fill_ uint8 with -1 wraps": lambda d: torch.zeros(2, dtype=torch.uint8, device=d).fill_(-1),
    "fill_ int8 with 300": lambda d: torch.zeros(2, dtype=torch.int8, device=d).fill_(300),
    "fill_ float32 with 1e40": lambda d: torch.zeros(2, device=d).fill_(1e40),
    "fill_ float16 with 1e40": lambda d: torch.zeros(2, dtype=torch.float16, device=d).fill_(1e40),
    "fill_ one float16 with 1e40 is inf": lambda d: torch.zeros(1, dtype=torch.float16, device=d).fill_(1e40),
    "add int8 with alpha 300": lambda d: torch.add(torch.zeros(2, dtype=torch.int8, device=d), torch.ones(2, dtype=torch.int8, device=d), alpha=300),
    "add float16 with alpha 1e40": lambda d: torch.add(torch.zeros(2, dtype=torch.float16, device=d), torch.ones(2, dtype=torch.float16, device=d), alpha=1e40),
    "sub int8 with alpha 128 (-128 fits)": lambda d: torch.sub(torch.zeros(2, dtype=torch.int8, device=d), torch.ones(2, dtype=torch.int8, device=d), alpha=128),
    "sub int8 with alpha -128": lambda d: torch.sub(torch.zeros(2, dtype=torch.int8, device=d), torch.ones(2, dtype=torch.int8, device=d), alpha=-128),
    "add float32 same shape with alpha 1e39": lambda d: torch.add(torch.zeros(4, device=d), torch.ones(4, device=d), alpha=1e39),
    "add bfloat16 same shape with alpha 1e39": lambda d: torch.add(torch.zeros(4, dtype=torch.bfloat16, device=d), torch.ones(4, dtype=torch.bfloat16, device=d), alpha=1e39),
    "add int32 with a float alpha": lambda d: torch.add(t([1, 2], d), t([1, 2], d), alpha=0.5),
    # NaN
    "clamp min=nan": lambda d: torch.arange(4.0, device=d).clamp(min=NAN),
    "clamp max=nan": lambda d: torch.arange(4.0, device=d).clamp(max=NAN),
    "clamp of nan": lambda d: t([NAN, 1.0, 5.0], d).clamp(0, 2),
    "addmm alpha=0 ignores a nan product": lambda d: torch.addmm(torch.ones(2, 2, device=d), torch.full((2, 2), NAN, device=d), torch.ones(2, 2, device=d), alpha=0),
    "addmm beta=0 ignores a nan self": lambda d: torch.addmm(torch.full((2, 2), NAN, device=d), torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), beta=0),
    "addmm alpha=0 beta=0": lambda d: torch.addmm(torch.full((2, 2), NAN, device=d), torch.full((2, 2), NAN, device=d), torch.ones(2, 2, device=d), alpha=0, beta=0),
    # random bounds
    "uniform_ to inf": lambda d: torch.empty(3, device=d).uniform_(0, INF),
    "uniform_ from nan": lambda d: torch.empty(3, device=d).uniform_(NAN, 1),
    "uniform_ float16 to 1e5": lambda d: torch.empty(3, dtype=torch.float16, device=d).uniform_(0, 1e5),
    "uniform_ to-from over the max": lambda d: torch.empty(3, device=d).uniform_(-3e38, 3e38),
    # empty dimensions, dtypes of out=, integer powers
    "argmax over an empty dim": lambda d: torch.empty(3, 0, device=d).argmax(1),
    "argmax over a full dim of an empty tensor": lambda d: torch.empty(0, 3, device=d).argmax(1),
    "argmax of an empty tensor": lambda d: torch.empty(0, device=d).argmax(),
    "sum into an int64 out": lambda d: torch.sum(t([0.5, 1.5, 2.0], d), 0, out=torch.empty((), dtype=torch.int64, device=d)),
    "mean into a float64 out": lambda d: torch.mean(t([0.5, 1.5, 2.0], d), 0, out=torch.empty((), dtype=torch.float64, device=d)),
    "sum with dtype and a wrong out": lambda d: torch.sum(t([1.0], d), 0, dtype=torch.float64, out=torch.empty((), dtype=torch.float32, device=d)),
    "sum with dtype int64 and a float out": lambda d: torch.sum(t([1.0], d), 0, dtype=torch.int64, out=torch.empty((), dtype=torch.float32, device=d)),
    "int pow of negative tensor exponents": lambda d: torch.pow(t([2, 1, -1, -1, 0, 3], d), t([-1, -3, -3, -2, 2, 2], d)),
    "int pow of a negative scalar exponent": lambda d: torch.pow(t([2, 3], d), -1),
    # indices out of range: IndexError where the CPU raises it
    "index": lambda d: torch.arange(4.0, device=d)[t([5], d)],
    "index negative": lambda d: torch.arange(4.0, device=d)[t([-5], d)],
    "index_select": lambda d: torch.index_select(torch.arange(4.0, device=d), 0, t([5], d)),
    "index_put_": lambda d: torch.zeros(4, device=d).index_put_((t([7], d),), t([1.0], d)),
    "embedding": lambda d: F.embedding(t([9], d), torch.ones(4, 2, device=d)),
    "nll_loss": lambda d: F.nll_loss(torch.zeros(2, 3, device=d), t([0, 5], d)),
    "gather": lambda d: torch.gather(torch.arange(4.0, device=d), 0, t([5], d)),
    "scatter_": lambda d: torch.zeros(4, device=d).scatter_(0, t([5], d), 1.0),
    # convolutions: cann_like serves float32 of every rank, regular and transposed; int64 falls back to ATen's
    "conv3d": lambda d: F.conv3d(torch.arange(27.0, device=d).view(1, 1, 3, 3, 3), torch.ones(1, 1, 2, 2, 2, device=d)),
    "conv_transpose2d": lambda d: F.conv_transpose2d(torch.arange(9.0, device=d).view(1, 1, 3, 3), torch.ones(1, 1, 2, 2, device=d), stride=2),
    "conv2d int64": lambda d: F.conv2d(torch.ones(1, 1, 3, 3, dtype=torch.int64, device=d), torch.ones(1, 1, 2, 2, dtype=torch.int64, device=d)),
    "conv1d": lambda d: F.conv1d(torch.arange(5.0, device=d).view(1, 1, 5), torch.ones(1, 1, 2, device=d)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_npu_agrees_with_the_cpu(name):
    assert_same_outcome(name, CASES[name], equal_nan=True)


def test_convolutions_that_fall_back_train_as_on_the_cpu():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 5, 5, 5), torch.randn(4, 3, 2, 2, 2), torch.randn(4)
    grads = []
    for d in ("cpu", "npu"):
        xs = [v.double().to(d).requires_grad_() for v in (x, w, b)]
        F.conv3d(*xs, padding=1).square().sum().backward()
        grads.append([v.grad.cpu() for v in xs])
    for g_npu, g_cpu in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_npu, g_cpu)


@pytest.fixture(scope="module")
def truncated_plugin_dir(tmp_path_factory):
    """A folder with libnpub_cut.so: the first 3000 bytes of vllm_like's."""
    plugins = os.path.join(os.path.dirname(npubridge._C.__file__), "..", "..", "lib", "npubridge", "plugins")
    source = os.path.join(plugins, "libnpub_vllm_like.so")
    if not os.path.exists(source):  # an installed wheel's layout
        source = os.path.join(os.path.dirname(npubridge.__file__), "lib", "npubridge", "plugins", "libnpub_vllm_like.so")
    folder = tmp_path_factory.mktemp("truncated")
    with open(source, "rb") as f:
        (folder / "libnpub_cut.so").write_bytes(f.read(3000))
    return folder


@pytest.fixture(scope="module")
def python(truncated_plugin_dir):
    """Runs code in a process of its own with npubridge's environment and
    the given settings (read at the runtime's start): a child forked from a
    fresh interpreter that imported torch (a zygote, conftest.py), which
    starts its own runtime and devices, and may crash alone. That import
    had the bad plugins of the tests below in the plugin path (import torch
    works with them); a program given no plugin path gets it as it is here.
    The zygote imported torch._dynamo too, which the first npu op of most of
    these programs imports (through one of torch._refs' Python meta
    functions): seconds each."""
    bad_plugins = ":".join(p for p in (os.environ.get("NPUB_TEST_PLUGIN_DIR"), str(truncated_plugin_dir)) if p)
    with Zygote("import torch, npubridge, torch._dynamo", flags=("-W", "ignore"), NPUB_LOG_LEVEL="error",
                NPUB_PLUGIN_PATH=bad_plugins) as zygote:
        as_it_is = {"NPUB_PLUGIN_PATH": os.environ.get("NPUB_PLUGIN_PATH")}
        yield lambda code, **env: zygote.run(code, **dict(as_it_is, **env))


def test_out_of_memory_inside_a_kernel_is_torch_out_of_memory_error(python):
    # nonzero's output (8 MiB of indices) is allocated by the kernel, after
    # the input took half the device.
    r = python("""
        import torch, npubridge
        x = torch.ones(1024 * 1024 + 100, device="npu")
        try:
            torch.nonzero(x)
        except torch.OutOfMemoryError as e:
            print("OOM", "tried to allocate 8.00 MiB" in str(e), torch.npu.memory_allocated() == x.nbytes + 512 - x.nbytes % 512)
        print(torch.nonzero(x[:10]).shape)
    """, NPUB_SIM_MEMORY="8M")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["OOM True True", "torch.Size([10, 1])"]


def test_devices_smaller_than_a_segment_serve_what_fits(python):
    r = python("""
        import torch, npubridge
        a = torch.ones(1000, device="npu")
        b = torch.ones(200000, device="npu")
        print(float(a.sum()), float(b.sum()))
    """, NPUB_SIM_MEMORY="1M")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1000.0", "200000.0"]
    r = python("""
        import torch, npubridge
        a = torch.ones(1, device="npu")
        b = torch.ones(262145, device="npu")   # 1 MiB + 4 bytes
        c = torch.ones(3 * 1024 * 1024, device="npu")  # 12 MiB
        print(float(b.sum() + c.sum()))
    """, NPUB_SIM_MEMORY="19M")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(float(262145 + 3 * 1024 * 1024))]


def test_integer_division_edge_cases_do_not_kill_the_process(python):
    # INT_MIN // -1 and INT_MIN % -1 trap (SIGFPE) in a naive kernel; ATen
    # wraps. In a child, so that a regression is a failed test, not a crash.
    r = python("""
        import torch, npubridge
        for dtype, lo in ((torch.int64, -2**63), (torch.int32, -2**31), (torch.int16, -2**15), (torch.int8, -2**7)):
            for dev in ("cpu", "npu"):
                a = torch.tensor([lo, 7, -7], dtype=dtype, device=dev)
                b = torch.tensor([-1, -1, 2], dtype=dtype, device=dev)
                out = [torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), torch.fmod(a, b), a % -1]
                print(dtype, dev, [t.cpu().tolist() for t in out])
    """)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 8
    for cpu, npu in zip(lines[0::2], lines[1::2]):
        assert cpu.replace(" cpu ", " npu ") == npu


def test_a_truncated_plugin_file_is_rejected_and_import_torch_works(python, truncated_plugin_dir):
    r = python("""
        import torch, npubridge
        print(float((torch.ones(3, device="npu") * 2).sum()))
        print([f for f in npubridge.load_failures() if "libnpub_cut.so" in f])
    """, NPUB_PLUGIN_PATH=str(truncated_plugin_dir))
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    total, failures = r.stdout.strip().splitlines()
    assert total == "6.0"
    assert "truncated: the file has 3000 bytes but its loadable segments need" in failures


def test_streams_keep_memory_bounded():
    # 2,000 torch.npu.Stream() used to cost 4.3 GB (a simulated stream and
    # its worker thread each, never freed); they come from a pool now.
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    x = torch.ones(10, device="npu")
    with torch.npu.stream(torch.npu.Stream()):
        x = x + 1
    before = rss_mb()
    streams = [torch.npu.Stream() for _ in range(20000)]
    assert rss_mb() - before < 64
    assert len({s.stream_id for s in streams}) <= 4


def test_new_streams_share_one_pool_and_threads_stay_bounded():
    # torch.npu.Stream() made a stream (and a thread) per call, never freed,
    # while torch.Stream(device="npu") used a pool: both draw from the
    # device's pool now.
    threads = lambda: len(os.listdir("/proc/self/task"))
    for _ in range(8):
        torch.npu.Stream(), torch.Stream(device="npu:0")
    before = threads()
    ids = {torch.npu.Stream().stream_id for _ in range(20)} | {torch.Stream(device="npu:0").stream_id for _ in range(20)}
    assert threads() == before
    assert 0 not in ids and len(ids) <= 4


def test_every_bad_plugin_in_the_plugin_path_is_rejected_and_import_torch_works(python):
    # The test plugin folder: one plugin per way of being bad (wrong ABI,
    # bad schemas, kernels, derivatives, an initialize that fails or throws,
    # not a library at all, ...) beside good ones. The library without any
    # entry point is not a plugin: in a folder it is skipped, not rejected
    # (Note [A directory may hold libraries that are not plugins]).
    folder = os.environ["NPUB_TEST_PLUGIN_DIR"]
    not_a_plugin = "libnpub_test_bad_no_entry.so"
    bad = sorted(f for f in os.listdir(folder)
                 if f.startswith(("libnpub_test_bad_", "libnot_a_library", "libnpub_test_init_throws"))
                 # kernel_error loads (its kernel fails when called); schema_conflict
                 # and good_c define one op two ways: whichever loads second goes
                 and f not in ("libnpub_test_bad_kernel_error.so", "libnpub_test_bad_schema_conflict.so", not_a_plugin))
    r = python("""
        import torch, npubridge
        assert float((torch.ones(3, device="npu") * 2).sum()) == 6.0
        assert float(torch.ones(2).add(1).sum()) == 4.0
        for f in npubridge.load_failures():
            print(f)
        for f in npubridge.load_skipped():
            print("SKIPPED", f)
    """, NPUB_PLUGIN_PATH=folder)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    lines = r.stdout.strip().splitlines()
    failures = [f for f in lines if not f.startswith("SKIPPED ")]
    for name in bad:
        assert any(os.path.join(folder, name) in f for f in failures), f"{name} was not rejected: {failures}"
    assert len(bad) >= 19
    path = os.path.join(folder, not_a_plugin)
    assert not any(path in f for f in failures), failures
    assert f"SKIPPED '{path}' skipped: not an npubridge plugin (no npub_plugin_init_v1)" in lines, lines
    assert sum("is already defined (by plugin" in f and "with a different schema" in f for f in failures) == 1


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
