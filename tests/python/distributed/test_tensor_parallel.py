"""Tensor parallel through DTensor on npu: a 2-layer MLP with its first
Linear column-parallel and its second row-parallel (parallelize_module on
init_device_mesh("npu", (2,))) over 2 ranks, forward and backward against
the same MLP unsharded in the rank's own process, on the same device.

What differs from the unsharded model, and the bound it gives (fp32, unit
roundoff u = 2**-24): the column-parallel layer computes each rank's half
of the hidden units with the same terms as the full layer; the row-parallel
layer sums its K = 32 hidden units as two partial sums of 16, one per rank,
added by the backend's allreduce. A sum of n terms in any order is within
gamma_n * sum|terms| of the exact sum (gamma_n = n u / (1 - n u), Higham,
"Accuracy and Stability", 4.2), so two orders are within 2 gamma_n of each
other: |y_tp - y| <= 2 gamma_32 (|h| @ |W2|^T) elementwise (the bias adds
one rounding of a value within that, covered by the same bound plus u |y|).
The input gradient is the same kind of split sum (over the 32 hidden units
of dh @ W1, partial per rank, then allreduced); the weight gradients sum
over the batch, whose terms and order are the same as unsharded, but are
held to the same form of bound in case a kernel blocks by shape. The
bounds are computed from the reference's own |terms| in float64."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import run_ranks  # noqa: E402

U = 2.0 ** -24


def _gamma(n):
    return n * U / (1 - n * U)


def _check(name, got, want, bound):
    err = (got.detach().cpu().double() - want.detach().cpu().double()).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"{name}: exceeds its bound by {worst:.3g} (max error {err.max().item():.3g})"
    return err.max().item()


def _body(rank, world_size):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.npu.set_device(int(os.environ["LOCAL_RANK"]) % torch.npu.device_count())
    dist.init_process_group("npu")
    mesh = init_device_mesh("npu", (world_size,))
    dev = torch.device("npu", torch.npu.current_device())

    torch.manual_seed(0)  # the same weights and data on every rank
    d_in, hidden, d_out, batch = 16, 32, 8, 12
    ref = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)).to(dev)
    tp = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)).to(dev)
    tp.load_state_dict(ref.state_dict())
    tp = parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert isinstance(tp[0].weight, DTensor) and tp[0].weight.to_local().shape == (hidden // world_size, d_in)
    assert tp[2].weight.to_local().shape == (d_out, hidden // world_size)

    x = torch.randn(batch, d_in).to(dev)
    g = torch.randn(batch, d_out).to(dev)  # dL/dy: loss = (y * g).sum()
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    h = ref[1](ref[0](x_ref))
    y_ref = ref[2](h)
    (y_ref * g).sum().backward()
    y_tp = tp(x_tp)
    assert not isinstance(y_tp, DTensor) and y_tp.device == dev  # RowwiseParallel hands back a local tensor
    (y_tp * g).sum().backward()

    # The bounds, from the reference's terms.
    hc, w1, w2 = h.detach().cpu().double(), ref[0].weight.detach().cpu().double(), ref[2].weight.detach().cpu().double()
    xc, gc = x.cpu().double(), g.cpu().double()
    dh = (gc @ w2) * (hc > 0)  # dL/dh before ReLU (its mask is the forward's)
    errors = {
        "y": _check("y", y_tp, y_ref, 2 * _gamma(hidden) * (hc.abs() @ w2.abs().T) + U * y_ref.detach().cpu().abs()),
        "x.grad": _check("x.grad", x_tp.grad, x_ref.grad, 2 * _gamma(hidden) * (dh.abs() @ w1.abs())),
        "W1.grad": _check("W1.grad", tp[0].weight.grad.full_tensor(), ref[0].weight.grad,
                          2 * _gamma(batch) * (dh.abs().T @ xc.abs())),
        "b1.grad": _check("b1.grad", tp[0].bias.grad.full_tensor(), ref[0].bias.grad,
                          2 * _gamma(batch) * dh.abs().sum(0)),
        "W2.grad": _check("W2.grad", tp[2].weight.grad.full_tensor(), ref[2].weight.grad,
                          2 * _gamma(batch) * (gc.abs().T @ hc.abs())),
        "b2.grad": _check("b2.grad", tp[2].bias.grad.full_tensor(), ref[2].bias.grad,
                          2 * _gamma(batch) * gc.abs().sum(0)),
    }
    # DTensor's redistributions are torch.ops._c10d_functional collectives
    # on the group of the mesh; on npu int64 tensors they are exact: a sum
    # of 0..n-1 plus the rank, each rank's block, each rank's sum of blocks.
    import torch.distributed._functional_collectives as funcol
    t = torch.arange(6, dtype=torch.int64, device=dev) + rank
    s = funcol.all_reduce(t, "sum", mesh)
    gathered = funcol.all_gather_tensor(t, 0, mesh)
    scattered = funcol.reduce_scatter_tensor(torch.arange(4, dtype=torch.int64, device=dev) * (rank + 1), "sum", 0, mesh)
    base = torch.arange(6, dtype=torch.int64)
    assert torch.equal(s.cpu(), 2 * base + 1) and s.device == dev
    assert torch.equal(gathered.cpu(), torch.cat([base, base + 1]))
    assert torch.equal(scattered.cpu(), 3 * torch.arange(4, dtype=torch.int64)[2 * rank:2 * rank + 2])

    # Every rank ends with the same replicated output and input gradient.
    for t in (y_tp.detach(), x_tp.grad):
        gathered = [torch.empty_like(t) for _ in range(world_size)]
        dist.all_gather(gathered, t.contiguous())
        assert all(torch.equal(gathered[0].cpu(), o.cpu()) for o in gathered)
    return errors


def test_colwise_rowwise_mlp_equals_the_unsharded_forward_and_backward():
    errors = run_ranks(_body, world_size=2, timeout=120)
    print("max abs errors by rank:", errors)
