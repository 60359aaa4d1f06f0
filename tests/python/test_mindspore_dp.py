"""Data parallel training over 2 processes with MindSpore's own launcher and
communication (msrun, mccl on the CPU), every operator of the tiny Llama on
the plugins (tests/python/mindspore_dp_worker.py is one rank)."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

K = 128
GAMMA_K = K * 2.0 ** -24 / (1 - K * 2.0 ** -24)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_train_as_one_process_on_the_whole_batch(tmp_path):
    msrun = shutil.which("msrun") or str(Path(sys.executable).parent / "msrun")
    worker = Path(__file__).with_name("mindspore_dp_worker.py")
    env = dict(os.environ, NPUB_DP_OUT=str(tmp_path))
    cmd = [msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={_free_port()}",
           f"--log_dir={tmp_path / 'logs'}", "--join=True", str(worker)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[-6000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    # The reducer gave both ranks the same mean gradient: identical weights.
    assert ranks[0]["weights_digest"] == ranks[1]["weights_digest"]
    for r in ranks:
        assert r["size"] == 2
        for op in ("aten::mm.out", "mindspeed_like::npu_fusion_attention_grad", "mindspeed_like::npu_apply_adam_w"):
            assert op in r["kernels"], r["kernels"]
    # The mean of the ranks' losses on their halves is the loss on the whole
    # batch (equal halves, a mean loss): within step t's (t + 1) gamma_K of
    # the one-process run (test_mindspore_llama.py derives the bound).
    losses, full = np.array(ranks[0]["losses"]), np.array(ranks[0]["full_batch_losses"])
    bound = (np.arange(len(full)) + 1) * GAMMA_K * np.abs(full)
    assert (np.abs(losses - full) <= bound).all(), (losses, full, bound)
