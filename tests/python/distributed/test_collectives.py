"""The npu backend's collectives against the same collectives with Gloo on CPU
tensors, run inside the same two spawned ranks ("cpu:gloo,npu:npu": CPU
tensors go to Gloo, npu tensors to the npu backend).

Reference and tolerance: the npu backend carries its data with gloo, so for
every collective the npu result must be bit-for-bit the CPU Gloo result on
the same values (exact equality throughout). Independently of gloo, each
result is also checked against values computed here: copies (broadcast,
gathers, scatters, alltoall) exactly; integer reductions exactly; float SUM
and AVG of two ranks against the float64 sum rounded to the dtype, which is
exact too: the sum of two float32 (or bf16/fp16) values of like magnitude is
exact in float64, so a correctly rounded a+b equals it rounded once, and
halving is exact. Few spawns (each costs ~3 s), many checks per spawn.
"""
import datetime
import os

import torch
import torch.distributed as dist

from harness import run_ranks

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]
NPU = "npu"


def _values(rank, shape, dtype, salt=0):
    """Rank-dependent inputs every rank can recompute for any rank."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def _same(got, want, what):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {tuple(got.shape)} vs {want.dtype} {tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: npu result differs from the reference\n{got}\n{want}"


def _both(what, make, call):
    """Runs `call(tensors...)` on CPU tensors (Gloo) and on npu copies (the npu
    backend); returns (npu outputs moved to the CPU, CPU outputs)."""
    cpu = make()
    npu = [t.to(NPU) for t in cpu]
    call(*cpu)
    call(*npu)
    for i, (a, b) in enumerate(zip(npu, cpu)):
        _same(a, b, f"{what} (tensor {i}, npu vs Gloo on CPU)")
    return [t.cpu() for t in npu]


def _check_allreduce(rank, world):
    ops = {dist.ReduceOp.SUM: lambda xs: sum(x.double() for x in xs),
           dist.ReduceOp.AVG: lambda xs: sum(x.double() for x in xs) / len(xs),
           dist.ReduceOp.PRODUCT: lambda xs: xs[0].double() * xs[1].double(),
           dist.ReduceOp.MIN: lambda xs: torch.minimum(xs[0], xs[1]).double(),
           dist.ReduceOp.MAX: lambda xs: torch.maximum(xs[0], xs[1]).double()}
    for dtype in DTYPES:
        for op, ref in ops.items():
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue  # gloo averages floats only (test_errors checks the error)
            for shape in [(13,), (4, 6), (0,), ()]:
                what = f"all_reduce {dtype} {op} {shape}"
                (got,) = _both(what, lambda: [_values(rank, shape, dtype, 1)], lambda t: dist.all_reduce(t, op=op))
                # PRODUCT of two floats is one rounding of an exact float64 product too.
                want = ref([_values(r, shape, dtype, 1) for r in range(world)]).to(dtype)
                _same(got, want, what + " vs float64 reference")
    # Bitwise ops and the other integer dtypes gloo carries.
    for op, fn in [(dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                   (dist.ReduceOp.BXOR, torch.bitwise_xor)]:
        (got,) = _both(f"all_reduce int64 {op}", lambda: [_values(rank, (9,), torch.int64, 2)],
                       lambda t: dist.all_reduce(t, op=op))
        _same(got, fn(_values(0, (9,), torch.int64, 2), _values(1, (9,), torch.int64, 2)), f"all_reduce {op}")
    for dtype in [torch.int32, torch.int8, torch.uint8, torch.float64, torch.bool]:
        op = dist.ReduceOp.MAX if dtype == torch.bool else dist.ReduceOp.SUM
        _both(f"all_reduce {dtype}", lambda: [_values(rank, (11,), dtype, 3)], lambda t: dist.all_reduce(t, op=op))
    # Non-contiguous in place (a transposed view): the reference is the
    # contiguous copy reduced on the CPU.
    base = _values(rank, (5, 3), torch.float32, 4).to(NPU)
    view = base.t()
    want = view.cpu().contiguous()
    dist.all_reduce(want)
    dist.all_reduce(view)
    _same(base.t(), want, "all_reduce of a transposed view")
    # Larger than one pipelined chunk (4 MiB): several gloo calls per collective.
    n = (6 << 20) // 4 + 3
    (got,) = _both("all_reduce 6 MiB", lambda: [_values(rank, (n,), torch.float32, 5)], lambda t: dist.all_reduce(t))
    _same(got, (_values(0, (n,), torch.float32, 5).double() + _values(1, (n,), torch.float32, 5).double()).float(),
          "all_reduce 6 MiB vs float64 reference")
    # all_reduce_coalesced (one Work for several tensors).
    _both("all_reduce_coalesced", lambda: [_values(rank, (5,), torch.float32, 6), _values(rank, (2, 3), torch.float32, 7)],
          lambda a, b: dist.all_reduce_coalesced([a, b]))


def _check_copies(rank, world):
    for dtype in DTYPES + [torch.bool]:
        for shape in [(7,), (3, 4), (0,)]:
            for src in range(world):
                (got,) = _both(f"broadcast {dtype} {shape} src={src}", lambda: [_values(rank, shape, dtype, 10)],
                               lambda t: dist.broadcast(t, src))
                _same(got, _values(src, shape, dtype, 10), "broadcast vs source's values")
            # all_gather (list) and all_gather_into_tensor.
            inp = _values(rank, shape, dtype, 11)
            want = [_values(r, shape, dtype, 11) for r in range(world)]
            outs = [torch.empty(shape, dtype=dtype, device=NPU) for _ in range(world)]
            dist.all_gather(outs, inp.to(NPU))
            cpu_outs = [torch.empty(shape, dtype=dtype) for _ in range(world)]
            dist.all_gather(cpu_outs, inp)
            for r in range(world):
                _same(outs[r], want[r], f"all_gather {dtype} {shape}[{r}]")
                _same(outs[r], cpu_outs[r], f"all_gather {dtype} {shape}[{r}] vs Gloo")
            flat = torch.empty((world * inp.numel(),), dtype=dtype, device=NPU)
            dist.all_gather_into_tensor(flat, inp.to(NPU))
            _same(flat, torch.cat([w.reshape(-1) for w in want]), f"all_gather_into_tensor {dtype} {shape}")
    # Non-contiguous input and outputs: a transposed input, column views as outputs.
    inp = _values(rank, (3, 2), torch.float32, 12).to(NPU).t()
    big = torch.zeros((2, 3 * world), device=NPU)
    outs = [big[:, r::world] for r in range(world)]
    dist.all_gather(outs, inp)
    for r in range(world):
        _same(big[:, r::world], _values(r, (3, 2), torch.float32, 12).t().contiguous(), f"all_gather strided [{r}]")
    # gather and scatter, every root.
    for root in range(world):
        inp = _values(rank, (5,), torch.int64, 13)
        gl = [torch.empty(5, dtype=torch.int64, device=NPU) for _ in range(world)] if rank == root else None
        dist.gather(inp.to(NPU), gl, dst=root)
        if rank == root:
            for r in range(world):
                _same(gl[r], _values(r, (5,), torch.int64, 13), f"gather root={root} [{r}]")
        out = torch.empty((2, 3), dtype=torch.bfloat16, device=NPU)
        sl = [_values(root * 10 + r, (2, 3), torch.bfloat16, 14).to(NPU) for r in range(world)] if rank == root else None
        dist.scatter(out, sl, src=root)
        _same(out, _values(root * 10 + rank, (2, 3), torch.bfloat16, 14), f"scatter root={root}")
    # reduce, every root (only the destination's tensor is defined afterwards).
    for root in range(world):
        t = _values(rank, (6,), torch.float32, 15).to(NPU)
        dist.reduce(t, dst=root)
        if rank == root:
            _same(t, (_values(0, (6,), torch.float32, 15).double() + _values(1, (6,), torch.float32, 15).double()).float(),
                  f"reduce dst={root}")


def _check_reduce_scatter(rank, world):
    for dtype in DTYPES:
        for n in [3, 0]:
            ins = [_values(rank * world + j, (n,), dtype, 20) for j in range(world)]
            want = sum(_values(r * world + rank, (n,), dtype, 20).double() for r in range(world)).to(dtype)
            out = torch.empty((n,), dtype=dtype, device=NPU)
            dist.reduce_scatter(out, [i.to(NPU) for i in ins])
            _same(out, want, f"reduce_scatter {dtype} n={n}")
            cpu_out = torch.empty((n,), dtype=dtype)
            dist.reduce_scatter(cpu_out, ins)
            _same(out, cpu_out, f"reduce_scatter {dtype} n={n} vs Gloo")
            out2 = torch.empty((n,), dtype=dtype, device=NPU)
            dist.reduce_scatter_tensor(out2, torch.cat(ins).to(NPU))
            _same(out2, want, f"reduce_scatter_tensor {dtype} n={n}")
    # MAX, and a non-contiguous input (rows of a transposed matrix).
    inp = _values(rank, (3, 2 * world), torch.float32, 21).to(NPU).t()
    out = torch.empty((2, 3), device=NPU)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX)
    whole = torch.maximum(_values(0, (3, 2 * world), torch.float32, 21), _values(1, (3, 2 * world), torch.float32, 21)).t()
    _same(out, whole[2 * rank:2 * rank + 2].contiguous(), "reduce_scatter_tensor MAX of a transposed view")


def _check_premul_sum(rank, world):
    """ReduceOp.PREMUL_SUM (NCCL's: each rank's input times the factor, then
    SUM; FSDP2 uses it for a gradient divide factor) against Gloo SUM of the
    pre-multiplied CPU tensors. Exact equality: the backend multiplies the
    staged copy by the factor rounded to the tensor's dtype, in that dtype, as
    the reference does here; one IEEE multiply, correctly rounded (for
    fp16/bf16 the float product of two such values is exact, then rounded
    once), so both sides sum the same values with the same gloo SUM."""
    def premul(x, f):
        return x * torch.tensor(f, dtype=x.dtype)  # the factor in the dtype, as NCCL's T(factor)

    def gloo_sum(x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    third = 1.0 / 3.0  # not exact in any dtype: rounding the factor to the dtype matters
    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.float64]:
        for shape in [(13,), (2, 3), (0,)]:
            x = _values(rank, shape, dtype, 50)
            t = x.to(NPU)
            dist.all_reduce(t, op=dist._make_nccl_premul_sum(third))
            _same(t, gloo_sum(premul(x, third)), f"all_reduce PREMUL_SUM {dtype} {shape}")
        # reduce_scatter_tensor (FSDP2's path, ReduceOp.PREMUL_SUM(f) spelling); the input is left as it was.
        whole = _values(rank, (2 * world,), dtype, 51)
        inp, out = whole.to(NPU), torch.empty(2, dtype=dtype, device=NPU)
        dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.PREMUL_SUM(0.1))
        _same(out, gloo_sum(premul(whole, 0.1))[2 * rank:2 * rank + 2], f"reduce_scatter_tensor PREMUL_SUM {dtype}")
        _same(inp, whole, f"reduce_scatter_tensor PREMUL_SUM {dtype}: input unchanged")
    # Factor tensors (one element, on npu or on the CPU), several chunks, the other reducing collectives.
    x = _values(rank, (6,), torch.float32, 52)
    for factor in [torch.tensor(0.3, device=NPU), torch.tensor([0.7])]:
        t = x.to(NPU)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        _same(t, gloo_sum(premul(x, factor.item())), f"all_reduce PREMUL_SUM factor tensor on {factor.device}")
    n = (6 << 20) // 4 + 3  # more than one pipelined chunk
    x = _values(rank, (n,), torch.float32, 53)
    t = x.to(NPU)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(third))
    _same(t, gloo_sum(premul(x, third)), "all_reduce PREMUL_SUM 6 MiB")
    xs = [_values(rank * world + j, (3,), torch.bfloat16, 54) for j in range(world)]
    out = torch.empty(3, dtype=torch.bfloat16, device=NPU)
    dist.reduce_scatter(out, [v.to(NPU) for v in xs], op=dist._make_nccl_premul_sum(third))
    _same(out, gloo_sum(premul(torch.cat(xs), third))[3 * rank:3 * rank + 3], "reduce_scatter PREMUL_SUM")
    ia, ib = _values(rank, (4,), torch.float32, 55), _values(rank, (6,), torch.float32, 56)
    ra, rb = torch.empty(2, device=NPU), torch.empty(3, device=NPU)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(ra, ia.to(NPU), op=dist._make_nccl_premul_sum(0.25))
        dist.reduce_scatter_tensor(rb, ib.to(NPU), op=dist._make_nccl_premul_sum(0.25))
    cm.wait()
    _same(ra, gloo_sum(premul(ia, 0.25))[2 * rank:2 * rank + 2], "coalesced reduce_scatter_tensor PREMUL_SUM")
    _same(rb, gloo_sum(premul(ib, 0.25))[3 * rank:3 * rank + 3], "coalesced reduce_scatter_tensor PREMUL_SUM (2)")
    a, b = _values(rank, (5,), torch.float16, 57), _values(rank, (2, 2), torch.float16, 58)
    ta, tb = a.to(NPU), b.to(NPU)
    dist.all_reduce_coalesced([ta, tb], op=dist._make_nccl_premul_sum(third))
    _same(ta, gloo_sum(premul(a, third)), "all_reduce_coalesced PREMUL_SUM")
    _same(tb, gloo_sum(premul(b, third)), "all_reduce_coalesced PREMUL_SUM (2)")
    for root in range(world):
        x = _values(rank, (7,), torch.float32, 59)
        t = x.to(NPU)
        dist.reduce(t, dst=root, op=dist._make_nccl_premul_sum(third))
        want = gloo_sum(premul(x, third))  # on every rank (a collective)
        _same(t, want if rank == root else x, f"reduce PREMUL_SUM dst={root}")
    # Integer tensors: a named error on the caller's thread (NCCL's premul sum is for floats here too).
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int64, device=NPU), op=dist._make_nccl_premul_sum(2.0))
        raise AssertionError("all_reduce PREMUL_SUM on int64 did not raise")
    except ValueError as e:
        assert "allreduce" in str(e) and "PREMUL_SUM needs a floating-point tensor" in str(e) and "torch.int64" in str(e), e


def _check_alltoall(rank, world):
    # Even split, then uneven: 7 elements over 2 ranks with different splits.
    for dtype in [torch.float32, torch.int64, torch.bfloat16]:
        inp = _values(rank, (4, 3), dtype, 30)
        out = torch.empty((4, 3), dtype=dtype, device=NPU)
        dist.all_to_all_single(out, inp.to(NPU))
        want = torch.cat([_values(r, (4, 3), dtype, 30)[2 * rank:2 * rank + 2] for r in range(world)])
        _same(out, want, f"all_to_all_single even {dtype}")
    in_splits = {0: [3, 4], 1: [5, 2]}  # what rank i sends to rank j
    out_splits = [in_splits[r][rank] for r in range(world)]
    inp = _values(rank, (7,), torch.int64, 31)
    out = torch.empty((sum(out_splits),), dtype=torch.int64, device=NPU)
    dist.all_to_all_single(out, inp.to(NPU), out_splits, in_splits[rank])
    pieces = []
    for r in range(world):
        start = sum(in_splits[r][:rank])
        pieces.append(_values(r, (7,), torch.int64, 31)[start:start + in_splits[r][rank]])
    _same(out, torch.cat(pieces), "all_to_all_single uneven")
    cpu_out = torch.empty((sum(out_splits),), dtype=torch.int64)
    dist.all_to_all_single(cpu_out, inp, out_splits, in_splits[rank])
    _same(out, cpu_out, "all_to_all_single uneven vs Gloo")
    # all_to_all (lists) with tensors of different sizes per peer.
    sizes = {0: [2, 3], 1: [1, 0]}
    ins = [_values(rank * 10 + j, (sizes[rank][j],), torch.float32, 32).to(NPU) for j in range(world)]
    outs = [torch.empty((sizes[r][rank],), device=NPU) for r in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        _same(outs[r], _values(r * 10 + rank, (sizes[r][rank],), torch.float32, 32), f"all_to_all from {r}")


def _check_p2p_and_async(rank, world):
    peer = 1 - rank
    # send/recv both ways, then batch_isend_irecv (coalesced by the backend).
    for sender in range(world):
        if rank == sender:
            dist.send(_values(sender, (6,), torch.float16, 40).to(NPU), dst=peer)
        else:
            t = torch.empty(6, dtype=torch.float16, device=NPU)
            dist.recv(t, src=sender)
            _same(t, _values(sender, (6,), torch.float16, 40), f"recv from {sender}")
    send = _values(rank, (4,), torch.int64, 41).to(NPU)
    recv = torch.empty(4, dtype=torch.int64, device=NPU)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
    for r in reqs:
        r.wait()
    _same(recv, _values(peer, (4,), torch.int64, 41), "batch_isend_irecv")
    # A double buffer: receive into one half of a tensor while sending the
    # other half, the receive listed first (disjoint views do not order).
    buf = torch.zeros(8, device=NPU)
    buf[:4] = rank + 1
    for r in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf[4:], peer), dist.P2POp(dist.isend, buf[:4], peer)]):
        r.wait()
    _same(buf, torch.tensor([rank + 1.0] * 4 + [peer + 1.0] * 4), "batch_isend_irecv on halves of one buffer")
    # recv from any source.
    if rank == 0:
        t = torch.empty(3, device=NPU)
        src = dist.recv(t)
        assert src == 1, src
        _same(t, _values(1, (3,), torch.float32, 42), "recv from any source")
    else:
        dist.send(_values(1, (3,), torch.float32, 42).to(NPU), dst=0)

    # async_op=True returns before the collective completed: rank 1 joins only
    # after rank 0 saw the Work incomplete (the store orders it, no timing).
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((5,), float(rank + 1), device=NPU)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        assert not work.is_completed(), "all_reduce(async_op=True) completed before the peer joined"
        # synchronize() before completion (rank 1 has not joined yet): work
        # queued after it on the caller's stream sees the result.
        work.synchronize()
        store.set("async_go", "1")
        seen = t * 1
    else:
        store.wait(["async_go"])
        work = dist.all_reduce(t, async_op=True)
        seen = t * 0 + 3
    fut = work.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    work.wait()
    assert work.is_completed() and work.is_success()
    _same(t, torch.full((5,), 3.0), "async all_reduce")
    _same(seen, torch.full((5,), 3.0), "stream work queued after Work.synchronize()")
    _same(doubled.wait(), torch.full((5,), 6.0), "future.then of an all_reduce")
    _same(fut.wait()[0], torch.full((5,), 3.0), "future value")
    # Two async collectives on one tensor keep issue order (the second reads
    # the first's result), and the caller's queued work is seen by the first.
    t = torch.ones(4, device=NPU)
    t.mul_(3)  # queued on the caller's stream before the collective
    w1 = dist.all_reduce(t, async_op=True)
    w2 = dist.all_reduce(t, async_op=True)
    w2.wait()
    w1.wait()
    _same(t, torch.full((4,), 12.0), "two async all_reduce on one tensor")
    # Overlapping views of one buffer are ordered too; disjoint ones need not be.
    buf = torch.ones(8, device=NPU)
    ws = [dist.all_reduce(buf[0:4], async_op=True), dist.all_reduce(buf[2:6], async_op=True),
          dist.all_reduce(buf[6:8], async_op=True)]
    for w in ws:
        w.wait()
    _same(buf, torch.tensor([2.0, 2, 4, 4, 2, 2, 2, 2]), "async all_reduce on overlapping views")
    # Coalesced fast paths (_coalescing_manager): all_gather_into_tensor and
    # reduce_scatter_tensor on lists.
    a, b = _values(rank, (3,), torch.float32, 43).to(NPU), _values(rank, (2,), torch.float32, 44).to(NPU)
    oa, ob = torch.empty(6, device=NPU), torch.empty(4, device=NPU)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(oa, a)
        dist.all_gather_into_tensor(ob, b)
    cm.wait()
    _same(oa, torch.cat([_values(r, (3,), torch.float32, 43) for r in range(world)]), "coalesced all_gather_into_tensor")
    _same(ob, torch.cat([_values(r, (2,), torch.float32, 44) for r in range(world)]), "coalesced all_gather_into_tensor (2)")
    ra, rb = torch.empty(2, device=NPU), torch.empty(3, device=NPU)
    ia, ib = torch.arange(4.0, device=NPU) + rank, torch.arange(6.0, device=NPU) * (rank + 1)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(ra, ia)
        dist.reduce_scatter_tensor(rb, ib)
    cm.wait()
    _same(ra, (torch.arange(4.0) * 2 + 1)[2 * rank:2 * rank + 2], "coalesced reduce_scatter_tensor")
    _same(rb, (torch.arange(6.0) * 3)[3 * rank:3 * rank + 3], "coalesced reduce_scatter_tensor (2)")
    # all_gather_coalesced (lists of outputs per input; one dtype, as torch requires).
    outs = [[torch.empty(2, 2, device=NPU) for _ in range(world)], [torch.empty(3, device=NPU) for _ in range(world)]]
    dist.all_gather_coalesced(outs, [_values(rank, (2, 2), torch.float32, 45).to(NPU), _values(rank, (3,), torch.float32, 46).to(NPU)])
    for r in range(world):
        _same(outs[0][r], _values(r, (2, 2), torch.float32, 45), f"all_gather_coalesced [0][{r}]")
        _same(outs[1][r], _values(r, (3,), torch.float32, 46), f"all_gather_coalesced [1][{r}]")
    dist.barrier()


def _check_chunks_whatever_the_layout(rank, world):
    """allreduce and broadcast above one chunk, rank 0 passing a contiguous
    tensor and rank 1 a transposed view of the same shape: the chunks are
    element ranges of the flattened data on every rank, so the gloo calls
    pair up (exact: sums of small integers, copies)."""
    os.environ["NPUB_DIST_CHUNK_BYTES"] = "4096"  # read when the group is made
    group = dist.new_group(backend="npu")
    del os.environ["NPUB_DIST_CHUNK_BYTES"]
    n = 64  # 64 x 64 float32: 4 chunks of 4096 bytes
    want = [torch.arange(n * n, dtype=torch.float32).reshape(n, n) + 1000 * r for r in range(world)]

    def layout(x):
        return x.to(NPU) if rank == 0 else x.t().contiguous().to(NPU).t()

    t = layout(want[rank])
    assert t.is_contiguous() == (rank == 0)
    dist.all_reduce(t, group=group)
    _same(t, sum(want), "all_reduce above one chunk, contiguous on rank 0, transposed view on rank 1")
    for src in range(world):
        t = layout(want[rank] if rank == src else torch.zeros(n, n))
        dist.broadcast(t, src, group=group)
        _same(t, want[src], f"broadcast above one chunk, mixed layouts, src={src}")
    dist.destroy_process_group(group)


def _check_callbacks_may_wait_for_collectives(rank, world):
    """then() callbacks that wait for another collective of the group (a
    synchronous all_reduce; an async one's future, as PowerSGD does) and DDP
    with the PowerSGD hook, against the same DDP on CPU tensors (gloo)."""
    a, b, c = (torch.full((4,), float(rank + 1), device=NPU) for _ in range(3))
    fut = dist.all_reduce(a, async_op=True).get_future()
    got = fut.then(lambda f: (dist.all_reduce(b), b)[1]).wait()
    _same(got, torch.full((4,), 3.0), "sync all_reduce inside then()")
    fut = dist.all_reduce(a, async_op=True).get_future()
    got = fut.then(lambda f: dist.all_reduce(c, async_op=True).get_future().wait()[0]).wait()
    _same(got, torch.full((4,), 3.0), "async all_reduce waited inside then()")
    _same(a, torch.full((4,), 6.0), "all_reduce before the then()")

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP
    weights = {}
    for dev in ["cpu", NPU]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(dev)
        ddp = DDP(model)
        ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=0,
                                             use_error_feedback=False, warm_start=False), powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x, y = torch.randn(6, 8, generator=g), torch.randn(6, 2, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
            opt.step()
        weights[dev] = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    # Ranks agree exactly (compared over gloo on CPU tensors, not the backend
    # under test).
    gathered = [torch.empty_like(weights[NPU]) for _ in range(world)]
    dist.all_gather(gathered, weights[NPU])
    assert all(torch.equal(gathered[0], w) for w in gathered), "PowerSGD DDP: ranks' weights differ"
    # npu vs CPU: the same float32 computation with other kernels (matmuls
    # of <= 8 terms, PowerSGD's Gram-Schmidt on 8-vectors): a few ulps per
    # op, ~1e-6 relative after 3 steps of lr 0.1 on weights of size ~0.3;
    # 1e-4 leaves room and still catches a missing or stale gradient (~1e-2).
    diff = (weights[NPU] - weights["cpu"]).abs().max().item()
    assert diff < 1e-4, f"PowerSGD DDP on npu vs on CPU (gloo): max weight difference {diff}"


def _body(rank, world):
    torch.npu.set_device(0)
    dist.init_process_group("cpu:gloo,npu:npu", timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "cpu:gloo,npu:npu"
    be = dist.distributed_c10d._get_default_group()._get_backend(torch.device(NPU))
    assert type(be).__name__ == "ProcessGroupNPU", type(be)
    assert isinstance(be, torch._C._distributed_c10d.Backend)
    _check_allreduce(rank, world)
    _check_copies(rank, world)
    _check_reduce_scatter(rank, world)
    _check_premul_sum(rank, world)
    _check_alltoall(rank, world)
    _check_p2p_and_async(rank, world)
    _check_chunks_whatever_the_layout(rank, world)
    _check_callbacks_may_wait_for_collectives(rank, world)
    return "ok"


def _body_npu_only(rank, world):
    # Each rank on its own device (npu:0, npu:1), the group "npu" alone,
    # chosen by torch from the device_id (the README's alternative to naming
    # the backend; a bare init_process_group() leaves DDP without a default
    # backend in torch 2.13).
    torch.npu.set_device(rank)
    dist.init_process_group(device_id=torch.device(NPU, rank), timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "npu"
    t = torch.full((3,), float(rank), device=f"npu:{rank}")
    dist.all_reduce(t)
    _same(t, torch.full((3,), 1.0), "all_reduce on npu:<rank>")
    # DDP finds the group's default backend (its constructor asks for it).
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).to(t.device))
    ddp(torch.full((1, 2), float(rank), device=t.device)).sum().backward()
    # d(w.x + b)/dw = x, averaged over the ranks' x = (0, 0) and (1, 1): exact.
    _same(ddp.module.weight.grad, torch.full((1, 2), 0.5), "DDP gradient on a device_id group")
    dist.barrier()
    return t.device.index


def _body_group_goes_while_a_callback_needs_the_gil(rank, world):
    """The group's last reference dropped holding the GIL while a callback
    thread of its engine still needs the GIL: the end of a DDP script, whose
    Reducer holds the group and goes with the function's frame while the
    thread releases the last collective's Work (its result tensors have
    Python objects). Here a then() callback waits (without the GIL) until
    the main thread is about to drop the Reducer, then sleeps briefly and
    must take the GIL back to return: the Reducer goes meanwhile, unless the
    main thread is descheduled for the whole sleep. The group's destructor
    joins that thread; holding the GIL there, it hung (Note [The engine's
    threads are joined without the GIL])."""
    import gc
    import threading
    import time
    dist.init_process_group("npu", timeout=datetime.timedelta(seconds=60))
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).to(NPU))
    reducer = ddp.reducer  # holds the group in C++; its Python binding does not release the GIL
    del ddp
    gc.collect()
    entered, dropping = threading.Event(), threading.Event()

    def callback(fut):
        entered.set()
        dropping.wait(30)
        time.sleep(0.2)  # the group goes meanwhile
        return fut.value()[0] * 2

    work = dist.all_reduce(torch.ones(4, device=NPU), async_op=True)
    chained = work.get_future().then(callback)
    work.wait()
    assert entered.wait(30), "the then() callback did not start"
    dist.destroy_process_group()  # the Reducer now holds the group's last reference
    dropping.set()
    del reducer
    return chained.wait().cpu().tolist()


def test_collectives_match_gloo_on_cpu():
    assert run_ranks(_body, world_size=2, timeout=150) == ["ok", "ok"]


def test_npu_only_group_one_device_per_rank():
    assert run_ranks(_body_npu_only, world_size=2, timeout=60) == [0, 1]


def test_group_goes_while_a_callback_needs_the_gil():
    assert run_ranks(_body_group_goes_while_a_callback_needs_the_gil, world_size=2, timeout=60) == [[4.0] * 4] * 2
