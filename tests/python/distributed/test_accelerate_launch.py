"""`accelerate launch` of an ordinary Accelerate training script on two npu
ranks (npu:0 and npu:1, the "hccl" process group accelerate asks for on an
NPU) trains as one process does on the whole batch: each step's loss and
the trained weights equal the single-process run, judged by npubridge's
error model against the same steps on the CPU in float32 and float64 (never
a fixed tolerance against the CPU's float32)."""
import os
import subprocess
import sys

import torch

from harness import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: conftest's helpers

from conftest import TORCH_NPU_COMPAT_DIR, assert_judged, import_torch_npu_compat  # noqa: E402

import_torch_npu_compat()
sys.path.insert(0, HERE)
import accelerate_train as script  # noqa: E402


def _single_process(dtype):
    """The script's training, one process on the CPU, both ranks' rows per step."""
    net = script.model().to(dtype)
    opt = torch.optim.AdamW(net.parameters(), lr=script.LR)
    losses = []
    for ids in script.tokens().split(2 * script.PER_RANK):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().double())
    return torch.stack(losses), {k: v.detach() for k, v in net.state_dict().items()}


def test_two_rank_accelerate_launch_equals_one_process(tmp_path):
    env = dict(os.environ)
    # accelerate's launcher and each rank import torch_npu: npubridge's
    # compatibility package, from the source tree unless it is installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.path.normpath(TORCH_NPU_COMPAT_DIR)) if p)
    env.update(HF_HOME=str(tmp_path / "hf"),  # no user's accelerate config
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = tmp_path / "run.pt"
    cmd = [sys.executable, "-W", "ignore", "-m", "accelerate.commands.launch", "--num_processes", "2",
           "--main_process_port", str(free_port()), "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", os.path.join(HERE, "accelerate_train.py"), str(out)]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"accelerate launch failed ({done.returncode}):\n{done.stdout[-4000:]}\n" \
                                 f"{done.stderr[-8000:]}"
    run = torch.load(out, weights_only=False)
    assert run["num_processes"] == 2
    for rank, seen in enumerate(run["ranks"]):
        assert seen == {"device": f"npu:{rank}", "distributed_type": "DistributedType.MULTI_NPU", "backend": "hccl",
                        "param_device": f"npu:{rank}", "batch_device": f"npu:{rank}"}, seen
    host_losses, host_weights = _single_process(torch.float32)
    wide_losses, wide_weights = _single_process(torch.float64)
    assert len(run["losses"]) == len(wide_losses) == script.ROWS // (2 * script.PER_RANK)
    assert_judged(run["losses"].float(), host_losses.float(), wide_losses, "loss per step, 2 ranks")
    start = script.model().state_dict()
    for name, got in run["weights"].items():
        assert not torch.equal(got, start[name]), f"{name} did not train"
        assert_judged(got, host_weights[name], wide_weights[name], f"{name} after training on 2 ranks")
