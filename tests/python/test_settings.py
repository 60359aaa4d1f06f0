"""Every NPUB_* setting under PyTorch (Note [A setting is read strictly or
refused], support/include/npubridge/support/env.h): a bad value never breaks
`import torch` (npubridge autoloads into it) and is never ignored or misread.
Nothing starts at import (Note [The runtime starts at the first npu use],
python_ext/csrc/init.cpp), so import says nothing; CPU ops work;
torch.npu.is_available() is False with one warning, and the first npu use
raises, both naming the variable, the value found and what was expected.
The NPUB_DIST_* settings of the collective backend are read when an npu
process group is made: a bad one fails that init_process_group with the same
message (in this process, a group of one rank).

A fresh interpreter costs seconds, so not one per value: each of a few
interpreters imports torch with one bad value of every variable at once
(that import says nothing holds for all of them together), then serves as a
zygote (tests/python/conftest.py) for the cases of its values: each case in
a child forked from it, its own process, which puts the other variables back
as they were and meets its bad value at the first npu use, as a fresh
process would (the settings are read when the runtime starts)."""
import os

import pytest

from conftest import Zygote

# What `import torch` does with a bad value: nothing (no warning from
# npubridge, nothing started).
_IMPORT = """
import warnings
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    import torch, npubridge
assert not [str(x.message) for x in w if "npubridge" in str(x.message)], [str(x.message) for x in w]
assert not npubridge._C._is_started()
"""

# What a process with a bad value does after the import.
_CHILD = """
import warnings
import torch, npubridge
warnings.simplefilter("always")
assert torch.ones(2).add(1).sum().item() == 4
assert not npubridge._C._is_started()
with warnings.catch_warnings(record=True) as w:
    assert not torch.npu.is_available()
msgs = [str(x.message) for x in w if "npubridge" in str(x.message)]
assert len(msgs) == 1, msgs
print(msgs[0])
try:
    torch.ones(2).to("npu")
    raise SystemExit("npu use succeeded")
except RuntimeError as e:
    print(str(e).splitlines()[0])
assert not npubridge._C._is_started()
"""

_DISABLED = "npubridge: the npu runtime did not start: "
_NOT_A_PLUGIN = __file__  # a regular file that is no plugin library

_CASES = [
    *[("NPUB_SIM_DEVICES", v, f"expected a device count from 1 to 64 but found '{v}'")
      for v in ("0", "-1", "65", "4294967297", "abc", "2 devices")],
    ("NPUB_SIM_MEMORY", "64Q", "unknown unit in '64Q' (expected K, M, G or T)"),
    ("NPUB_SIM_MEMORY", "-5M", "expected a size such as 16G, 512M or 1048576 but found '-5M'"),
    ("NPUB_SIM_MEMORY", "0", "expected a positive size but found '0'"),
    ("NPUB_SIM_MEMORY", "99999999999T", "expected a size below 2^64 bytes but found '99999999999T'"),
    *[("NPUB_SIM_THREADS", v, f"expected a compute thread count from 1 to 1024 but found '{v}'")
      for v in ("0", "-1", "4294967297")],
    ("NPUB_LAUNCH_BLOCKING", "2", "expected 0 or 1 (or false/true, off/on, no/yes) but found '2'"),
    ("NPUB_DTYPE_CONVERSION", "maybe", "expected 0 or 1 (or false/true, off/on, no/yes) but found 'maybe'"),
    *[("NPUB_OPT_LEVEL", v, f"expected an optimisation level from 0 to 3 but found '{v}'")
      for v in ("9", "-1", "4294967298", "max")],
    ("NPUB_FALLBACK", "maybe", "expected 'allow' or 'error' but found 'maybe'"),
    ("NPUB_VALIDATE", "yes please", "expected 0 or 1 (or false/true, off/on, no/yes) but found 'yes please'"),
    ("NPUB_OP_MAP", "/nonexistent", "expected an op-mapping table file but found '/nonexistent' (no such file)"),
    ("NPUB_OP_MAP", "/tmp", "expected an op-mapping table file but found '/tmp' (not a regular file)"),
    ("NPUB_LOG_LEVEL", "loud", "expected one of trace, debug, info, warn, error, off but found 'loud'"),
    ("NPUB_PLUGIN_PATH", "/nonexistent",
     "expected ':'-separated directories or plugin files (.so) but found '/nonexistent' (no such file)"),
    ("NPUB_PLUGIN_PATH", _NOT_A_PLUGIN,
     f"expected ':'-separated directories or plugin files (.so) but found '{_NOT_A_PLUGIN}' "
     "(not a directory or a .so file)"),
    ("NPUB_PLUGIN_PATH", "/dev/null",
     "expected ':'-separated directories or plugin files (.so) but found '/dev/null' (not a directory or a .so file)"),
]


# Round k: the k-th bad value of every variable that has one.
_ROUNDS = []
for _name, _value, _ in _CASES:
    _k = sum(_name in values for values in _ROUNDS)
    if _k == len(_ROUNDS):
        _ROUNDS.append({})
    _ROUNDS[_k][_name] = _value


class _Zygotes(dict):
    """The zygotes, each started at its first use: a round's index, or
    None for the one with the settings as they are."""

    def __missing__(self, key):
        self[key] = Zygote(_IMPORT, **(_ROUNDS[key] if key is not None else {}))
        return self[key]


@pytest.fixture(scope="module")
def zygotes():
    started = _Zygotes()
    yield started
    for zygote in started.values():
        zygote.close()


@pytest.mark.parametrize("k", range(len(_ROUNDS)), ids=[f"round{k}" for k in range(len(_ROUNDS))])
def test_import_torch_says_nothing_with_bad_settings(zygotes, k):
    r = zygotes[k].prelude
    assert r.returncode == 0, f"{_ROUNDS[k]}:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("name, value, expected", _CASES, ids=[f"{n}={v}" for n, v, _ in _CASES])
def test_a_bad_setting_fails_the_first_npu_use_but_never_import_torch(zygotes, name, value, expected):
    # In a child of the zygote that imported torch with this value (and its
    # round's other ones, put back as they are here).
    k = next(k for k, values in enumerate(_ROUNDS) if values.get(name) == value)
    env = {other: os.environ.get(other) for other in _ROUNDS[k]}
    r = zygotes[k].run(_CHILD, **dict(env, **{name: value}))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2, r.stdout + r.stderr
    for line in lines:
        assert line.startswith(_DISABLED + f"{name}: {expected}"), line


def test_a_bad_setting_of_plugins_rejects_those_plugins_only(zygotes):
    code = ("import torch, npubridge; print([p['name'] for p in npubridge.plugins()]); "
            "print(npubridge.load_failures()); print(float((torch.ones(2, device='npu') * 3).sum()))")
    r = zygotes[None].run(code, NPUB_PLUGINS_MAX_ISA="sse9", NPUB_LOG_LEVEL="error")
    assert r.returncode == 0, r.stdout + r.stderr
    names, failures, total = r.stdout.strip().splitlines()
    # The in-tree plugins' one ISA cap: each of them refuses it, the runtime starts.
    assert all(name not in names for name in ("cann_like", "mindspeed_like", "vllm_like")), names
    assert failures.count("NPUB_PLUGINS_MAX_ISA: expected one of baseline, avx2, avx512 (or unset) but found 'sse9'") == 3
    assert total == "6.0"  # the CPU fallback serves what cann_like would have


def test_the_isa_cap_reaches_each_in_tree_plugin(zygotes):
    # What the *_baseline_isa tests rely on: every in-tree plugin's loops run
    # at the level NPUB_PLUGINS_MAX_ISA names (each logs it when it starts).
    code = "import torch, npubridge; print([p['name'] for p in npubridge.plugins()])"
    r = zygotes[None].run(code, NPUB_PLUGINS_MAX_ISA="baseline", NPUB_LOG_LEVEL="info")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("cann_like", "mindspeed_like", "vllm_like"):
        assert name in r.stdout
        assert f"{name}: ISA level baseline for its own loops (the CPU's: " in r.stderr, r.stderr
        assert "NPUB_PLUGINS_MAX_ISA: baseline)" in r.stderr, r.stderr


def test_good_values_with_surrounding_white_space_are_read(zygotes):
    code = "import torch, npubridge; print(torch.npu.device_count(), npubridge._C.optim_level())"
    r = zygotes[None].run(code, NPUB_SIM_DEVICES=" 3 ", NPUB_SIM_MEMORY="64M ", NPUB_OPT_LEVEL="\t1",
                          NPUB_LOG_LEVEL=" error ", NPUB_PLUGINS_MAX_ISA=" avx2", NPUB_SIM_THREADS=" 2")
    assert r.returncode == 0 and r.stdout.strip() == "3 1", r.stdout + r.stderr
    assert "did not start" not in r.stderr, r.stderr


_DIST_CASES = [
    ("NPUB_DIST_CHECK", "maybe", "expected 0 or 1 (or false/true, off/on, no/yes) but found 'maybe'"),
    ("NPUB_DIST_CHECK", "2", "expected 0 or 1 (or false/true, off/on, no/yes) but found '2'"),
    ("NPUB_DIST_CHUNK_BYTES", "0", "expected a positive size but found '0'"),
    ("NPUB_DIST_CHUNK_BYTES", "-4096", "expected a size such as 16G, 512M or 1048576 but found '-4096'"),
    ("NPUB_DIST_CHUNK_BYTES", "4Q", "unknown unit in '4Q' (expected K, M, G or T)"),
    ("NPUB_DIST_CHUNK_BYTES", "8388608T", "expected a size below 2^63 bytes but found '8388608T'"),
]


def _init_npu_group_of_one_rank(monkeypatch, **env):
    import torch.distributed as dist

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("npu", store=dist.HashStore(), rank=0, world_size=1)


@pytest.mark.parametrize("name, value, expected", _DIST_CASES, ids=[f"{n}={v}" for n, v, _ in _DIST_CASES])
def test_a_bad_distributed_setting_fails_making_the_npu_group(monkeypatch, name, value, expected):
    import torch.distributed as dist

    with pytest.raises(RuntimeError) as e:
        _init_npu_group_of_one_rank(monkeypatch, **{name: value})
    assert str(e.value).splitlines()[0] == f"{name}: {expected}"
    assert not dist.is_initialized()


def test_good_distributed_settings_with_surrounding_white_space_are_read(monkeypatch):
    import torch
    import torch.distributed as dist

    _init_npu_group_of_one_rank(monkeypatch, NPUB_DIST_CHECK=" off ", NPUB_DIST_CHUNK_BYTES="4K ")
    try:
        t = torch.arange(3000.0).npu()  # three chunks of 4 KiB
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.arange(3000.0))
    finally:
        dist.destroy_process_group()
