"""The runtime starts at the first npu use, not at import (Note [The runtime
starts at the first npu use], python_ext/csrc/init.cpp), as torch.cuda does:
`import torch` imports npubridge through the torch.backends entry point, so
whatever starts at import would start in every PyTorch program.

Each case runs in a process of its own, since the start happens once per
process: what `import` does, in a fresh interpreter; what happens after the
import, in a child forked from one that imported torch with the settings a
case starts with (a zygote, tests/python/conftest.py: a fresh interpreter
costs seconds), which starts its own runtime at its first npu use."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import Zygote

_CRASH_DIR = os.path.join(os.path.dirname(os.environ.get("NPUB_TEST_PLUGIN_DIR", "")), "plugins_crash")
_CRASH_PLUGINS = ("crash_in_init", "hang_in_init")

# What the zygote's import saw, besides the settings as they are here:
# test_settings_made_after_import_apply_at_the_first_npu_use's settings at
# the start, which every other case puts back (_AS_THEY_ARE).
_AT_IMPORT = {"NPUB_SIM_DEVICES": "3", "NPUB_SIM_MEMORY": "1G", "NPUB_SIM_THREADS": "2"}
_AS_THEY_ARE = {name: os.environ.get(name) for name in _AT_IMPORT}


@pytest.fixture(scope="module")
def zygote():
    with Zygote(**_AT_IMPORT) as z:
        yield z


@pytest.fixture(scope="module")
def crash_zygote():
    # Both plugins that die in initialize in the plugin path at the import.
    paths = [os.path.join(_CRASH_DIR, f"libnpub_test_bad_{plugin}.so") for plugin in _CRASH_PLUGINS]
    with Zygote(NPUB_PLUGIN_PATH=":".join(paths)) as z:
        yield z


def _run(code, timeout=120, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def _ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout.strip().splitlines()


def test_import_starts_no_thread_and_loads_no_plugin():
    # CPU work, is_available, device_count and torch.manual_seed (which
    # seeds every backend) start nothing either.
    lines = _ok(_run("""
        import os, torch
        def tasks():
            return len(os.listdir("/proc/self/task"))
        def plugins_mapped():
            with open("/proc/self/maps") as f:
                return sorted({l.split("/")[-1].strip() for l in f if "libnpub_" in l and "_like" in l})
        before = tasks()
        import npubridge
        torch.manual_seed(0)
        x = torch.randn(64, 64) @ torch.randn(64, 64)
        assert torch.npu.is_available() and torch.npu.device_count() == 2
        print(tasks() - before, plugins_mapped(), npubridge._C._is_started(), torch.npu.is_initialized())
        y = torch.ones(3, device="npu")
        print(tasks() > before, plugins_mapped(), npubridge._C._is_started(), torch.npu.is_initialized())
    """, NPUB_SIM_DEVICES="2", OMP_NUM_THREADS="1"))
    assert lines[0] == "0 [] False False", lines
    after = lines[1].split(" ", 1)
    assert after[0] == "True" and "libnpub_cann_like.so" in after[1] and after[1].endswith("True True"), lines


@pytest.mark.parametrize("first", ["npubridge", "torch._dynamo"])
def test_import_leaves_dynamo_alone_and_graph_mode_still_finds_the_npu(first):
    # Note [Dynamo is set up when it is imported] (_after_import.py):
    # torch._dynamo is imported by the first torch.compile, not by
    # `import npubridge`, and the backend "npu" and the device interface
    # are there whichever comes first. A set-up that failed would warn:
    # warnings are errors here.
    lines = _ok(_run(f"""
        import sys, warnings
        warnings.simplefilter("error", RuntimeWarning)
        import torch
        import {first}
        import npubridge
        print("torch._dynamo" in sys.modules)
        def f(x):
            return torch.nn.functional.gelu(x) * 2 + 1
        x = torch.linspace(-3, 3, 64, dtype=torch.float64)
        compiled = torch.compile(f, backend="npu")
        got = compiled(x.to("npu")).cpu()
        assert torch.allclose(got, f(x), rtol=1e-12, atol=1e-12), (got - f(x)).abs().max()
        from torch._dynamo.device_interface import get_interface_for_device
        print("npu" in torch._dynamo.list_backends(exclude_tags=()),
              get_interface_for_device("npu:0").__name__, len(npubridge.compile_report(compiled)["graphs"]))
    """, OMP_NUM_THREADS="1"))
    assert lines == [str(first == "torch._dynamo"), "True NpuInterface 1"], lines


def test_settings_made_after_import_apply_at_the_first_npu_use(zygote):
    # As CUDA_VISIBLE_DEVICES set after `import torch` and before the first
    # CUDA call: the zygote imported torch with _AT_IMPORT.
    lines = _ok(zygote.run("""
        import os, torch, npubridge
        os.environ["NPUB_SIM_DEVICES"] = "1"
        os.environ["NPUB_SIM_MEMORY"] = "64M"
        os.environ["NPUB_SIM_THREADS"] = "1"
        print(torch.npu.device_count())
        x = torch.arange(4.0, device="npu") * 2
        p = torch.npu.get_device_properties(0)
        print(torch.npu.device_count(), p.total_memory, p.multi_processor_count, x.cpu().tolist())
    """))
    assert lines == ["1", f"1 {64 << 20} 1 [0.0, 2.0, 4.0, 6.0]"], lines


def test_a_setting_made_bad_after_import_fails_the_first_npu_use_naming_it(zygote):
    lines = _ok(zygote.run("""
        import os, torch, npubridge
        os.environ["NPUB_SIM_DEVICES"] = "many"
        try:
            torch.ones(2, device="npu")
        except RuntimeError as e:
            print(str(e).splitlines()[0])
        os.environ["NPUB_SIM_DEVICES"] = "1"  # fixed: the next use starts
        print(torch.ones(2, device="npu").sum().item(), torch.npu.device_count())
    """, **_AS_THEY_ARE))
    assert lines == ["npubridge: the npu runtime did not start: NPUB_SIM_DEVICES: expected a device count from 1 "
                     "to 64 but found 'many'", "2.0 1"], lines


@pytest.mark.parametrize("plugin", _CRASH_PLUGINS)
def test_a_plugin_that_dies_in_initialize_cannot_touch_a_cpu_only_program(crash_zygote, plugin):
    path = os.path.join(_CRASH_DIR, f"libnpub_test_bad_{plugin}.so")
    assert os.path.exists(path), path
    assert crash_zygote.prelude.returncode == 0, crash_zygote.prelude.stderr  # imported with it in the path
    cpu_only = crash_zygote.run("""
        import torch, npubridge
        torch.manual_seed(0)
        print(float((torch.ones(3) * 2).sum()), torch.npu.is_available())
    """, timeout=60, NPUB_PLUGIN_PATH=path)
    assert _ok(cpu_only) == ["6.0 True"]
    # The same plugin is really loaded at the first npu use: that process
    # dies or hangs there (npub-plugins --check vets such files). The
    # imports are done before the child starts: a slow import on a loaded
    # machine is not taken for the hang.
    code = "import torch, npubridge; torch.ones(3, device='npu'); print('survived')"
    if plugin == "hang_in_init":
        with pytest.raises(subprocess.TimeoutExpired):
            crash_zygote.run(code, timeout=10, NPUB_PLUGIN_PATH=path)  # still in initialize
    else:
        r = crash_zygote.run(code, NPUB_PLUGIN_PATH=path)
        assert r.returncode != 0
        assert "survived" not in r.stdout


def test_seeds_set_before_the_start_apply_to_the_devices(zygote):
    # torch.manual_seed seeds every backend; before the start the npu's
    # seeds are queued (torch.cuda._lazy_call), not lost.
    lines = _ok(zygote.run("""
        import torch, npubridge
        torch.manual_seed(1234)
        a = torch.randn(8, device="npu").cpu()
        torch.npu.manual_seed(99)
        b = torch.randn(8, device="npu").cpu()
        torch.manual_seed(1234)
        print(torch.equal(torch.randn(8, device="npu").cpu(), a), torch.equal(a, b))
    """, **_AS_THEY_ARE))
    assert lines == ["True False"], lines


def test_a_child_forked_before_the_start_starts_its_own_runtime(zygote):
    lines = _ok(zygote.run("""
        import os, torch, npubridge
        pid = os.fork()
        if pid == 0:
            try:
                ok = torch.npu.is_initialized() is False and not torch.npu._is_in_bad_fork()
                ok = ok and float((torch.ones(4, device="npu") * 3).sum().cpu()) == 12.0
            except BaseException as e:
                print("child:", e, flush=True)
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), npubridge._C._is_started())
    """, **_AS_THEY_ARE))
    assert lines == ["0 False"], lines


def test_a_plugin_op_looked_up_before_the_first_npu_tensor_starts_the_runtime(zygote):
    # Python looks `torch.ops.ns.op` up before the argument that makes the
    # first npu tensor (Note [A plugin op lookup starts the runtime]); torch's
    # own probes (torch.library.define's hasattr, while torch._dynamo
    # imports) and ATen lookups start nothing.
    lines = _ok(zygote.run("""
        import torch, npubridge
        import torch._dynamo
        print(hasattr(torch.ops.aten, "no_such_op"), npubridge._C._is_started())
        x = torch.ops.mindspeed_like.npu_swiglu(torch.ones(2, 4, device="npu"), -1)
        print(x.shape, x.device, npubridge._C._is_started())
        print(hasattr(torch.ops.mindspeed_like, "no_such_op"))
    """, **_AS_THEY_ARE))
    assert lines == ["False False", "torch.Size([2, 2]) npu:0 True", "False"], lines
