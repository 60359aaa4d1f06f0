"""python3 -m npubridge profile-compare (npubridge.profile_compare): the same
step profiled on both devices and matched op by op. Checked: the rows (calls
per step on each side, npubridge's kernel slices folded into the ATen op that
dispatched them), the fallbacks per op, the CLI's table and JSON, and its
errors for a script it cannot use. No timing is asserted."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import npubridge
from npubridge import profile_compare

_SCRIPT = textwrap.dedent("""
    import torch

    def make_step(device, width="64"):
        torch.manual_seed(0)
        w = int(width)
        model = torch.nn.Sequential(torch.nn.Linear(w, 2 * w), torch.nn.GELU(), torch.nn.Linear(2 * w, w)).to(device)
        x = torch.randn(32, w, device=device)

        def step():
            model(x).square().mean().backward()
        return step
""")


def _make_step(device, width="64"):
    namespace = {}
    exec(_SCRIPT, namespace)
    return namespace["make_step"](device, width)


def test_rows_match_the_ops_of_both_devices_per_step():
    cmp = profile_compare.compare(_make_step, ("32",), steps=2, warmup=1)
    rows = {r.key: r for r in cmp.rows}
    # Two Linear layers with bias: two addmm per step, on both devices.
    assert rows["aten::addmm"].cpu_calls == 2 and rows["aten::addmm"].npu_calls == 2
    assert rows["aten::gelu"].cpu_calls == 1 and rows["aten::gelu"].npu_calls == 1
    # npubridge's kernel slices ("cann_like: aten::addmm.out") are not rows
    # of their own: their time is the dispatching op's.
    plugins = tuple(f"{p['name']}: " for p in npubridge.plugins())
    assert plugins and not [k for k in rows if k.startswith(plugins)]
    assert rows["aten::addmm"].npu_us > 0 and rows["aten::addmm"].cpu_us > 0
    assert "(outside ops)" in rows
    lost = [r.lost_us for r in cmp.rows]
    assert lost == sorted(lost, reverse=True)
    assert cmp.cpu_step_ms > 0 and cmp.npu_step_ms > 0 and not any(r.fallbacks for r in cmp.rows)


def test_fallbacks_are_counted_per_op_and_step():
    level = npubridge._C.optim_level()
    npubridge.set_optim_level(0)  # no plugin kernels: every npu op falls back to the CPU
    try:
        cmp = profile_compare.compare(_make_step, (), steps=2, warmup=1)
    finally:
        npubridge.set_optim_level(level)
    rows = {r.key: r for r in cmp.rows}
    assert rows["aten::addmm"].fallbacks == 2
    assert "fallbacks/step" in profile_compare.format_table(cmp)


def _cli(*args, cwd):
    env = dict(os.environ, NPUB_LOG_LEVEL="error")
    return subprocess.run([sys.executable, "-m", "npubridge", "profile-compare", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_the_table_and_writes_json(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(_SCRIPT)
    r = _cli(str(script), "48", "--steps", "2", "--warmup", "1", "--top", "5", "--json", "out.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "npu/cpu" in r.stdout and "lost µs" in r.stdout
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["steps"] == 2 and data["threads"] == torch.get_num_threads()
    assert len(data["ops"]) >= 5 and {"key", "cpu_calls", "npu_calls", "lost_us", "fallbacks"} <= set(data["ops"][0])


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("x = 1\n", "defines no make_step(device, *args)"),
])
def test_cli_names_a_script_it_cannot_use(tmp_path, content, message):
    script = tmp_path / "bad.py"
    if content is not None:
        script.write_text(content)
    r = _cli(str(script), cwd=tmp_path)
    assert r.returncode != 0
    assert str(script) in r.stderr and message in r.stderr
