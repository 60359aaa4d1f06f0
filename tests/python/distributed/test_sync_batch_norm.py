"""nn.SyncBatchNorm on npu under DDP: 2 ranks, each with part of the batch,
run a small CNN whose BatchNorm2d layers convert_sync_batchnorm made
SyncBatchNorm (batch_norm_stats, gather_stats_with_counts, elemt,
backward_reduce/elemt: python_ext/csrc/aten/sync_batch_norm.cpp), and get
what one process gets with plain BatchNorm2d on the full batch: SyncBatchNorm
over the ranks computes the full batch's statistics, and its backward the
full batch's sums. Checked on every rank, for its rows: the forward output,
the input gradient, the parameter gradients (after DDP's averaging), the
running statistics (momentum 0.1 on one layer, the cumulative average on the
other), and the eval() output that uses them; over three steps: halves
(4 + 4), unequal parts (3 + 5: the counts weigh the ranks' statistics) and
an empty rank (0 + 8: its zero statistics are dropped, its backward still
joins the all_reduce).

The reference runs in each rank's process on its device: the same formulas,
so the only differences are the order of fp32 summation and a few roundings
of elementwise ops. Two orders of an n-term sum differ by at most
2 gamma_n S (S = sum |terms|, gamma_n ~ n u, u = 2**-24; Higham 4.2). The
longest sums have n = 8 * 8 * 8 = 512 terms (a BatchNorm statistic per
channel over N*H*W, the sum_dy / sum_dy_xmu of its backward, and the conv
weight gradients over the same positions), gamma_512 = 3.1e-5.
- Running statistics: one such sum per step. The mean's terms are the
  layer's inputs a, S / n = mean |a|; the variance's terms are (a - mean)^2,
  all positive, S / n = the biased variance itself. Each step adds momentum
  times the batch statistic, so the bound is sum over steps of momentum * 2
  gamma_n * (mean |a| or var) (measured from the reference's layer inputs),
  plus 8 float32 ulps of the value for the elementwise updates. Using n
  instead of n - 1 for the unbiased variance would be off by 1/512 of it,
  60 times this bound.
- Outputs and gradients: the statistics' relative errors (gamma_n) reach
  the normalised values multiplied by |x - mean| * invstd (below 4 for this
  data) and pass through two BatchNorm layers forward and their backward
  (sum_dy, sum_dy_xmu), each of which renormalises: at most 8 such sums of n
  terms with that factor 4 on the path to any value, 8 * 4 * 2 gamma_n =
  2e-3 of the tensor's largest magnitude (worst case; measured ~1e-6,
  printed). A rank that used its own statistics instead of the global ones
  would be off by O(1).
- The convs' biases feed BatchNorm, which removes the mean: their gradients
  are 0 in exact arithmetic and computed as the residue of a cancelling sum
  of n terms (the conv output's gradient, per channel), whose error is
  relative to S = sum |terms| (measured from the reference), not to the
  result: the same 8 * 4 * 2 gamma_n, times S.
"""
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

N, C_IN, H = 8, 3, 8
SPLITS = [(4, 4), (3, 5), (0, 8)]  # rank 0's and rank 1's rows, per step
U = 2.0 ** -24
GAMMA = N * H * H * U  # gamma_n for the longest sums, n = N*H*W = 512


def _make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(C_IN, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.BatchNorm2d(4, momentum=None))


def _bn_layers(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def _err(got, ref):
    return (got.detach().cpu().double() - ref.detach().cpu().double()).abs()


def _body(rank, world_size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.npu.set_device(int(os.environ["LOCAL_RANK"]) % torch.npu.device_count())
    dev = torch.device("npu", torch.npu.current_device())
    dist.init_process_group("npu")
    torch.manual_seed(0)  # the same data and initial weights on every rank
    base = _make_model()
    with torch.no_grad():  # BatchNorm's affine parameters away from (1, 0)
        for bn in _bn_layers(base):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    ref = copy.deepcopy(base).to(dev)
    ddp = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base)).to(dev))
    sync_bns = _bn_layers(ddp.module)
    assert [type(m).__name__ for m in sync_bns] == ["SyncBatchNorm"] * 2

    # The reference layers' inputs, for the running statistics' bounds.
    seen = []
    hooks = [bn.register_forward_hook(lambda m, a, out, i=i: seen.append((i, a[0].detach().cpu().double())))
             for i, bn in enumerate(_bn_layers(ref))]
    conv_outs = {}  # the reference convs' outputs, for their biases' S

    def keep_conv_out(name):
        def hook(m, a, out):  # returns None: the output stays
            out.retain_grad()
            conv_outs[name] = out
        return hook

    for name, mod in ref.named_children():
        if isinstance(mod, torch.nn.Conv2d):
            hooks.append(mod.register_forward_hook(keep_conv_out(name)))
    stat_bound = [[torch.zeros(m.num_features, dtype=torch.float64)] * 2 for m in _bn_layers(ref)]

    checks = []  # (what, max error, bound)

    def check(what, got, want, bound):
        e = _err(got, want)
        excess = (e - bound).max().item()
        checks.append((what, e.max().item(), float(bound.min()) if torch.is_tensor(bound) else bound, excess))

    for step, split in enumerate(SPLITS):
        x = torch.randn(N, C_IN, H, H) * 2 + 0.5
        g = torch.randn(N, 4, H, H)  # the loss's weights: loss = sum(out * g) / N
        lo = sum(split[:rank])
        rows = slice(lo, lo + split[rank])

        xr = x.to(dev).requires_grad_()
        ref.zero_grad()
        out_ref = ref(xr)
        (out_ref * g.to(dev)).sum().div(N).backward()

        # DDP averages the ranks' gradients: each rank's loss is weighed
        # world_size / N so that the average is the full batch's gradient.
        xs = x[rows].to(dev).requires_grad_()
        ddp.zero_grad()
        out = ddp(xs)
        (out * g[rows].to(dev)).sum().mul(world_size / N).backward()

        scale = lambda t: 8 * 4 * 2 * GAMMA * t.detach().abs().max().item()  # noqa: E731
        if split[rank]:
            check(f"step {step} output", out, out_ref[rows], scale(out_ref))
            # The input gradient of the whole loss (SyncBatchNorm's backward
            # sums over the ranks), weighed world_size / N here, 1 / N there.
            check(f"step {step} input grad", xs.grad / world_size, xr.grad[rows], scale(xr.grad))
        for (name, p), r in zip(ddp.module.named_parameters(), ref.parameters()):
            conv, kind = name.split(".")
            if kind == "bias" and conv in conv_outs:
                bound = scale(conv_outs[conv].grad.abs().sum((0, 2, 3)))
            else:
                bound = scale(r.grad)
            check(f"step {step} grad {name}", p.grad, r.grad, bound)

        for i, a in seen:
            bn = _bn_layers(ref)[i]
            n = a.numel() // a.shape[1]
            dims = [0, 2, 3]
            m = bn.momentum if bn.momentum is not None else 1.0 / int(bn.num_batches_tracked)
            stat_bound[i][0] = stat_bound[i][0] * (1 - m) + m * 2 * GAMMA * a.abs().mean(dims)
            stat_bound[i][1] = stat_bound[i][1] * (1 - m) + m * 2 * GAMMA * a.var(dims, unbiased=False) * n / (n - 1)
        seen.clear()
        for i, (s, r) in enumerate(zip(sync_bns, _bn_layers(ref))):
            assert int(s.num_batches_tracked.cpu()) == int(r.num_batches_tracked.cpu()) == step + 1
            for k, stat in enumerate(("running_mean", "running_var")):
                want = getattr(r, stat)
                ulps = 8 * U * want.detach().cpu().double().abs()
                check(f"step {step} bn{i} {stat}", getattr(s, stat), want, stat_bound[i][k] + ulps)
    for h in hooks:
        h.remove()

    moved = [not torch.equal(s.running_mean.cpu(), torch.zeros(s.num_features)) and
             not torch.equal(s.running_var.cpu(), torch.ones(s.num_features)) for s in sync_bns]
    # eval(): plain BatchNorm on the running statistics, no communication.
    ddp.eval()
    ref.eval()
    x = torch.randn(N, C_IN, H, H) * 2 + 0.5
    with torch.no_grad():
        out_ref = ref(x.to(dev))
        check("eval output", ddp(x[:3].to(dev)), out_ref[:3], 8 * 4 * 2 * GAMMA * out_ref.abs().max().item())
    return {"device": str(dev), "backend": dist.get_backend(), "moved": moved, "checks": checks}


def test_sync_batch_norm_under_ddp_matches_one_process_on_the_full_batch():
    results = run_ranks(_body, world_size=2, timeout=120, env={"NPUB_SIM_DEVICES": "2"})
    assert [r["device"] for r in results] == ["npu:0", "npu:1"] and results[0]["backend"] == "npu"
    for rank, r in enumerate(results):
        assert all(r["moved"]), f"rank {rank}: running statistics never moved: {r['moved']}"
        bad = [c for c in r["checks"] if not c[3] <= 0]
        assert not bad, f"rank {rank}: (what, max error, min bound, worst excess): {bad}"
    worst = {}
    for r in results:
        for what, e, b, _ in r["checks"]:
            kind = what.split(" ", 2)[-1]
            worst[kind] = max(worst.get(kind, 0.0), e)
    print({k: f"{v:.2e}" for k, v in worst.items()})
