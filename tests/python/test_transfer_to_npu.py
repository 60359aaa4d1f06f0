"""torch_npu.contrib.transfer_to_npu: a training script written for CUDA
(python_ext/examples/cuda_train_script.py: .cuda(), device="cuda",
torch.cuda.amp's GradScaler and autocast, torch.cuda.synchronize, streams,
RNG state, memory statistics) runs unchanged on the npu. The switch is
process-wide, so the script runs in a child process."""
import json
import os
import subprocess
import sys

import pytest

from conftest import TORCH_NPU_COMPAT_DIR

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python_ext", "examples",
                      "cuda_train_script.py")


def _run(prelude):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""),
                                                     os.path.normpath(TORCH_NPU_COMPAT_DIR)) if p)
    code = f"{prelude}\nimport runpy\nrunpy.run_path({SCRIPT!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_script_is_written_for_cuda_alone():
    import ast

    with open(SCRIPT) as f:
        text = f.read()
    docstring = ast.parse(text).body[0]
    text = "\n".join(text.splitlines()[docstring.end_lineno:])  # the code, not how to run it
    assert "npu" not in text and ".cuda()" in text and 'device="cuda"' in text


@pytest.fixture(scope="module")
def result():
    run = _run("import torch_npu.contrib.transfer_to_npu")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_runs_on_the_npu(result):
    assert result["param_device"] == "npu:0" and result["x_device"] == "npu:0" and result["z_device"] == "npu:0"
    assert result["is_cuda"] is True  # Tensor.is_cuda is is_npu under the switch
    assert result["allocated"] > 0 and result["peak"] >= result["allocated"]
    assert result["device_name"]


def test_amp_went_to_the_npu(result):
    # torch.cuda.amp.autocast() computed Linear in float16 and
    # torch.autocast("cuda", bfloat16) in bfloat16, on the npu.
    assert result["autocast_dtypes"] == ["torch.bfloat16", "torch.float16"]
    assert result["scale"] <= 2.0**8  # no growth in 5 steps (interval 2000)
    losses = result["losses"]
    assert len(losses) == 5 and losses[-1] < losses[0]


def test_rng_state_round_trip(result):
    assert result["rng_repeats"] is True
