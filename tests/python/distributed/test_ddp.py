"""DistributedDataParallel on npu: 2 ranks, each with half of the batch,
train the demo model (python_ext/examples/train_demo.py) 20 SGD steps to
the weights one process reaches on the full batch; no_sync() accumulates
the full-batch gradient; gradients are equal across ranks after each
step; several gradient buckets. Once with a device per rank (npu:0,
npu:1), once with both ranks sharing npu:0 (NPUB_SIM_DEVICES=1); each
rank picks its device from LOCAL_RANK with torch.npu.set_device.

The reference runs in rank 0's process, on rank 0's device, so that the
kernels are the same and the only difference is the order of summation of
the gradient mean: the full batch sums its N = 64 rows at once (in the
weight-gradient products and the loss mean); DDP sums each half's 32 rows,
then the backend adds the two halves (each pre-divided by the world size,
exact for a power of two). Two orders of a sum of n terms differ by at most
2 gamma_n S, S = sum|terms| (gamma_n ~ n u, u = 2**-24; Higham 4.2): 7.6e-6 S
for n = 64, typically sqrt(n) u S ~ 5e-7 S. For this model and data S is at
most 0.42 for every gradient element (per-sample gradients in float64, at
the initial weights). SGD with lr = 0.05 moves a weight by lr times the
gradient difference per step; over 20 steps of a smooth loss (the step map
is close to the identity) the weights stay within 20 * 0.05 * 7.6e-6 * S ~
3e-6 < 1e-5, the issue's figure, which is the bound (measured: ~1e-7,
printed). no_sync's single accumulated gradient is held to one sum's bound,
2 gamma_64 * 4 (4 > S with a margin for the 20 steps of training before
it)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

STEPS, BATCH, LR = 20, 64, 0.05


def _make_model():  # train_demo.py's model
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def _flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _equal_across_ranks(t, world_size):
    import torch.distributed as dist
    gathered = [torch.empty_like(t) for _ in range(world_size)]
    dist.all_gather(gathered, t)
    return all(torch.equal(gathered[0].cpu(), g.cpu()) for g in gathered)


def _body(rank, world_size, check_no_sync, backend):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.npu.set_device(int(os.environ["LOCAL_RANK"]) % torch.npu.device_count())
    dev = torch.device("npu", torch.npu.current_device())
    dist.init_process_group(backend)
    torch.manual_seed(0)  # the same data and initial weights on every rank
    x, y = torch.randn(BATCH, 16), torch.randint(0, 4, (BATCH,))
    init = _make_model().state_dict()
    half = BATCH // world_size
    xs, ys = x[rank * half:(rank + 1) * half].to(dev), y[rank * half:(rank + 1) * half].to(dev)

    model = _make_model().to(dev)
    model.load_state_dict(init)
    # 0.0005 MiB (524 B) buckets: DDP closes a bucket once it reaches the
    # cap, so the model's 5.9 KB of gradients go in 3 (1040, 768, 4096 B).
    ddp = DDP(model, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    grads_equal = []
    for _ in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(ddp(xs), ys).backward()
        grads_equal.append(_equal_across_ranks(_flat_grad(model), world_size))
        opt.step()
    assert all(grads_equal), grads_equal
    # The buckets DDP rebuilt after the first step (in backward order).
    log = ddp._get_ddp_logging_data()
    result = {"device": str(dev), "backend": dist.get_backend(),
              "buckets": [int(b) for b in log["rebuilt_bucket_sizes"].split(",")],
              "buckets_reduced": log.get("num_buckets_reduced"),
              # Device times (ns) from npubridge's c10d Timer for npu modules.
              "times": {k: log.get(k, 0) for k in ("avg_forward_compute_time", "avg_backward_compute_time",
                                                   "avg_backward_comm_time")}}

    no_sync_grad = None
    if check_no_sync:
        # Two micro-batches of a quarter of the batch each per rank, the
        # first under no_sync (no communication: the ranks' gradients still
        # differ), the second synchronising the accumulated sum; the losses
        # are halved so that the sum is the mean over the rank's half.
        ddp.zero_grad()
        q = half // 2
        with ddp.no_sync():
            (F.cross_entropy(ddp(xs[:q]), ys[:q]) / 2).backward()
        result["no_sync_communicated"] = _equal_across_ranks(_flat_grad(model), world_size)
        (F.cross_entropy(ddp(xs[q:]), ys[q:]) / 2).backward()
        no_sync_grad = _flat_grad(model).cpu()
        result["accumulated_equal"] = _equal_across_ranks(_flat_grad(model), world_size)

    if rank == 0:
        ref = _make_model().to(dev)
        ref.load_state_dict(init)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
        xd, yd = x.to(dev), y.to(dev)
        for _ in range(STEPS):
            ref_opt.zero_grad()
            F.cross_entropy(ref(xd), yd).backward()
            ref_opt.step()
        result["weight_error"] = max((p.detach().cpu() - r.detach().cpu()).abs().max().item()
                                     for p, r in zip(model.parameters(), ref.parameters()))
        if check_no_sync:
            ref.zero_grad()
            F.cross_entropy(ref(xd), yd).backward()
            result["no_sync_grad_error"] = (no_sync_grad - _flat_grad(ref).cpu()).abs().max().item()
    return result


TIME_STATS_WARNING = "Time stats are currently only collected for CPU and CUDA devices"


def _check(results, world_size, check_no_sync, stderr):
    r0 = results[0]
    # DDP found a Timer for npu (npubridge/_C_dist's): no warning, and times
    # (no timing assertion beyond "measured": each is a positive duration).
    assert TIME_STATS_WARNING not in stderr
    assert all(t > 0 for r in results for t in r["times"].values()), [r["times"] for r in results]
    assert len(r0["buckets"]) >= 3, r0["buckets"]
    assert r0["weight_error"] <= 1e-5, r0
    if check_no_sync:
        assert all(not r["no_sync_communicated"] and r["accumulated_equal"] for r in results), results
        assert r0["no_sync_grad_error"] <= 2 * (64 * 2.0 ** -24) * 4, r0  # see the module's docstring
    print(results)


# capfd: the ranks write c10's warnings to the stderr they inherit.
def test_ddp_with_a_device_per_rank_trains_to_the_full_batch_weights(capfd):
    results = run_ranks(_body, world_size=2, timeout=120, env={"NPUB_SIM_DEVICES": "2"}, args=(True, "npu"))
    assert [r["device"] for r in results] == ["npu:0", "npu:1"] and results[0]["backend"] == "npu"
    _check(results, 2, True, capfd.readouterr().err)


def test_ddp_with_two_ranks_on_one_shared_device(capfd):
    # (and the other spelling of the backend, CPU tensors over gloo beside it)
    results = run_ranks(_body, world_size=2, timeout=120, env={"NPUB_SIM_DEVICES": "1"},
                        args=(False, "cpu:gloo,npu:npu"))
    assert [r["device"] for r in results] == ["npu:0", "npu:0"]
    assert results[0]["backend"] == "cpu:gloo,npu:npu"
    _check(results, 2, False, capfd.readouterr().err)
