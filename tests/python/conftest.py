import os
import subprocess
import sys

import pytest
import torch

import npubridge  # noqa: F401  (registers the npu backend)


@pytest.fixture
def npu():
    return torch.device("npu:0")


def assert_matches(got, fn, *inputs):
    """`got` (an npu result) against `fn` on the CPU tensors `inputs`, judged
    by npubridge's error model (docs/plugin-authoring.md, "How your kernels
    are judged"): fn in float64 is the reference, fn in the inputs' dtype
    calibrates the bound. Never a fixed tolerance against the CPU's own
    float32 output, which moves between CPUs."""
    host = fn(*inputs)
    wide = fn(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs])
    assert_judged(got, host, wide)


def assert_judged(got, host, wide, what=""):
    """`got` (an npu result) against `host` (the same computation on the CPU
    in got's dtype) and `wide` (on the CPU in float64), by npubridge's error
    model: within a few times the CPU's own error against float64."""
    msg = npubridge._C.judge(got.detach().cpu(), host.detach(), wide.detach())
    assert not msg, f"{what}: {msg}" if what else msg


def assert_no_fallbacks(what="", stats=None):
    """No op fell back to the CPU since the last npubridge.reset_stats()
    (or in `stats`, a npubridge.stats() taken earlier); the message lists
    the ops that did, with their counts."""
    fell = {op: s["fallbacks"] for op, s in (npubridge.stats() if stats is None else stats).items() if s["fallbacks"]}
    assert not fell, f"{what}: {fell}" if what else fell


def assert_gradients_judged(cpu, npu, wide, what=""):
    """Each parameter's gradient in `npu` (the model on npu) against the same
    parameter's in `cpu` and `wide` (the model on the CPU in npu's dtype and
    in float64), by the error model; a parameter has a gradient on both
    devices or on neither. Returns how many gradients were judged."""
    checked = 0
    for (pname, pc), (_, pn), (_, pw) in zip(cpu.named_parameters(), npu.named_parameters(), wide.named_parameters()):
        where = f"{what}.{pname}" if what else pname
        assert (pn.grad is None) == (pc.grad is None), f"{where}: gradient on one device only"
        if pc.grad is None:
            continue
        assert pn.grad.device.type == "npu", where
        assert_judged(pn.grad, pc.grad, pw.grad, f"{where} gradient")
        checked += 1
    return checked


def run_case(case, device):
    """A differential case's outcome on `device`: ("ok", the result on the
    CPU) or (the exception's class, the first line of its message)."""
    try:
        out = case(device)
        return "ok", out.cpu() if isinstance(out, torch.Tensor) else out
    except Exception as e:  # noqa: BLE001  (the class is compared)
        return type(e), str(e).splitlines()[0]


def assert_same_outcome(name, case, equal_nan=False):
    """A differential case gives on npu what it gives on the CPU: the same
    dtype, shape and values (exactly), or an exception of the same class
    whose message carries ATen's."""
    cpu, npu = run_case(case, "cpu"), run_case(case, "npu")
    if cpu[0] == "ok":
        assert npu[0] == "ok", f"{name}: the cpu computed, the npu raised {npu}"
        assert npu[1].dtype == cpu[1].dtype and npu[1].shape == cpu[1].shape, f"{name}: {npu[1]} vs {cpu[1]}"
        torch.testing.assert_close(npu[1], cpu[1], rtol=0, atol=0, equal_nan=equal_nan, msg=name)
    else:
        assert npu[0] is cpu[0], f"{name}: the cpu raised {cpu}, the npu gave {npu}"
        assert cpu[1] in npu[1], f"{name}: {npu[1]!r} does not carry ATen's {cpu[1]!r}"


def run_python(code, **env):
    """`code` run by a fresh Python with `env` added to the environment; the
    subprocess.CompletedProcess (text output). For what one process cannot
    show: settings read at the start, a crash or a hang, the exit."""
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=120)


def plugins_loaded_with(**env):
    """(names of the loaded plugins, npubridge.load_failures() as text) of a
    fresh Python that imports npubridge with `env` added to the environment."""
    code = "import torch, npubridge; print([p['name'] for p in npubridge.plugins()]); print(npubridge.load_failures())"
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                       env=dict(os.environ, NPUB_LOG_LEVEL="error", **env), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    names, failures = r.stdout.strip().splitlines()
    return names, failures


# npubridge's torch_npu compatibility package (compat/torch_npu): ctest puts
# it on PYTHONPATH for the tests that use it; run by hand, they take it from
# the source tree. It must come before transformers/accelerate are imported,
# which decide at import whether an NPU is there.
TORCH_NPU_COMPAT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "compat", "torch_npu")


def import_torch_npu_compat():
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        sys.path.insert(0, os.path.normpath(TORCH_NPU_COMPAT_DIR))
    import torch_npu

    assert getattr(torch_npu, "__npubridge_compat__", False), f"not npubridge's torch_npu: {torch_npu.__file__}"
    return torch_npu
