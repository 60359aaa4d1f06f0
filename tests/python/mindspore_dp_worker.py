"""One rank of test_mindspore_dp.py, launched by MindSpore's msrun: data
parallel training of the tiny Llama on the plugins (npubridge.mindspore),
gradients averaged by MindSpore's own communication (mccl on CPU) through
nn.DistributedGradReducer. Writes {"rank", "losses", "full_batch_losses",
"weights_digest", "kernels"} as JSON to $NPUB_DP_OUT/rank<r>.json."""
import hashlib
import json
import os

import numpy as np

import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

import npubridge.mindspore as ms_adapter
from npubridge.mindspore import testing

STEPS = 3

ms.set_device("CPU")
# enable() before init(): it takes MindSpore's one NumPy-2 import error
# (README, "MindSpore") before init() installs msrun's exit-on-exception
# hook, which would take that error's report for a failed rank.
ms_adapter.enable()
init()
rank, size = get_rank(), get_group_size()
cfg = testing.Config(layers=1)
ids = testing.batch(cfg, batch_size=2 * size, seed=3)


def make_net():
    ms.set_seed(0)
    return testing.TinyLlama(cfg, ms.float32, fused=True)


def train(net, ids, reducer=None):
    opt = ms_adapter.AdamW(net.trainable_params(), lr=1e-2)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    losses = []
    for _ in range(STEPS):
        loss, grads = grad_fn(ids)
        if reducer is not None:
            grads = reducer(grads)
        opt(grads)
        losses.append(loss)
    return losses


# One process on the whole batch, then this rank on its half.
full = [float(x.asnumpy()) for x in train(make_net(), ids)]
net = make_net()
shard = ids[rank * 2:(rank + 1) * 2]
local = train(net, shard, nn.DistributedGradReducer(net.trainable_params(), mean=True, degree=size))
allreduce = ops.AllReduce()
mean_losses = [float(allreduce(x).asnumpy()) / size for x in local]
digest = hashlib.sha256(b"".join(p.asnumpy().tobytes() for p in net.trainable_params())).hexdigest()
with open(os.path.join(os.environ["NPUB_DP_OUT"], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "losses": mean_losses, "full_batch_losses": full,
               "weights_digest": digest, "kernels": sorted(ms_adapter.stats()["kernels"])}, f)
print(f"rank {rank}: done", flush=True)
