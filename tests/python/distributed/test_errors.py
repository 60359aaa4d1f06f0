"""Errors of the npu backend as users meet them: bad arguments (wrong device,
two devices, a dtype gloo cannot carry, a reduce op gloo refuses), ranks that
disagree on a collective (shape, dtype, collective), a peer that hangs (the
group's timeout) and a peer that dies during an allreduce: a clear error on
the surviving rank, never a hang, and the group refuses further work with
the first error."""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

NPU = "npu"


def _raises(exc, fn, *fragments):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"expected {f!r} in the error:\n{msg}"
    return msg


def _bad_arguments_and_mismatches(rank, world):
    dist.init_process_group("npu", timeout=datetime.timedelta(seconds=30))
    x = torch.ones(4, device=NPU)
    # A CPU tensor where the npu backend got the call (the output decides).
    _raises(ValueError, lambda: dist.all_gather_into_tensor(torch.empty(8, device=NPU), torch.ones(4)),
            "npu backend: all_gather_into_tensor: input_tensor must be an npu tensor, found a tensor on cpu")
    # Two npu devices in one collective.
    _raises(ValueError, lambda: dist.all_gather_into_tensor(torch.empty(8, device="npu:0"), torch.ones(4, device="npu:1")),
            "all_gather_into_tensor", "one npu device", "npu:0", "npu:1")
    # A dtype gloo cannot carry, and averages of integers.
    _raises(TypeError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16, device=NPU)),
            "npu backend: allreduce: tensor has dtype torch.int16", "cannot carry")
    _raises(ValueError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64, device=NPU), op=dist.ReduceOp.AVG),
            "allreduce: ReduceOp.AVG needs a floating-point tensor, found torch.int64")
    _raises(ValueError, lambda: dist.all_reduce(x, op=dist.ReduceOp.BAND), "ReduceOp.BAND needs an integer or bool tensor")
    # Output sizes.
    _raises(ValueError, lambda: dist.all_gather_into_tensor(torch.empty(7, device=NPU), x),
            "output_tensor must have 8 elements")
    _raises(ValueError, lambda: dist.all_to_all_single(torch.empty(4, device=NPU), x, [1, 1], [2, 2]),
            "all_to_all_single: output split sizes sum to 2, but its dim 0 is 4")
    # A dtype that differs from another output's (the message names it).
    def mixed_coalesced():
        with dist._coalescing_manager():
            dist.reduce_scatter_tensor(torch.empty(2, device=NPU), torch.ones(4, device=NPU))
            dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.float64, device=NPU),
                                       torch.ones(4, dtype=torch.float64, device=NPU))
    _raises(TypeError, mixed_coalesced, "reduce_scatter_tensor_coalesced: outputs[1] must have dtype torch.float32 like outputs[0], found torch.float64")
    # Nothing above reached the transport: the group still works.
    dist.all_reduce(x)
    assert x.cpu().tolist() == [2.0] * 4

    # Ranks that disagree: each gets the error naming both signatures, and
    # the group stays usable (no data moved on either rank).
    shape = (4,) if rank == 0 else (5,)
    msg = _raises(RuntimeError, lambda: dist.all_reduce(torch.ones(shape, device=NPU)),
                  "npu backend: allreduce #2: the ranks disagree", "rank 0", "rank 1", "[4]", "[5]")
    dtype = torch.float32 if rank == 0 else torch.int64
    _raises(RuntimeError, lambda: dist.broadcast(torch.ones(3, dtype=dtype, device=NPU), 0),
            "broadcast #3", "torch.float32", "torch.int64")
    # Different collectives at the same point.
    if rank == 0:
        fn = lambda: dist.all_reduce(torch.ones(2, device=NPU))  # noqa: E731
    else:
        fn = lambda: dist.broadcast(torch.ones(2, device=NPU), 0)  # noqa: E731
    _raises(RuntimeError, fn, "#4", "allreduce #4(", "broadcast #4(")
    # alltoall split sizes that do not pair up across ranks.
    splits = [2, 2] if rank == 0 else [1, 3]
    _raises(RuntimeError, lambda: dist.all_to_all_single(torch.empty(4, device=NPU), torch.ones(4, device=NPU), splits, [2, 2]),
            "all_to_all_single #5", "send counts", "recv counts")
    # Mismatches never break the group.
    y = torch.full((2,), float(rank), device=NPU)
    dist.all_reduce(y)
    assert y.cpu().tolist() == [1.0, 1.0]
    # A coalesced group whose member fails: its Work's future carries the
    # member's error too, not only wait().
    a = torch.ones(4 if rank == 0 else 5, device=NPU)
    with dist._coalescing_manager(device=torch.device(NPU, 0), async_ops=True) as cm:
        dist.all_gather_into_tensor(torch.empty(2 * a.numel(), device=NPU), a)
    _raises(RuntimeError, lambda: cm.works[0].get_future().wait(), "allgather_into_tensor_coalesced", "the ranks disagree")
    _raises(RuntimeError, cm.wait, "allgather_into_tensor_coalesced", "the ranks disagree")
    # Ranks with different NPUB_DIST_CHUNK_BYTES would cut different gloo
    # calls: the chunk size is part of the signature (in bytes, whatever
    # unit the setting was written in).
    os.environ["NPUB_DIST_CHUNK_BYTES"] = "4096" if rank == 0 else "8K"
    group = dist.new_group(backend="npu")
    del os.environ["NPUB_DIST_CHUNK_BYTES"]
    _raises(RuntimeError, lambda: dist.all_reduce(torch.ones(4096, device=NPU), group=group),
            "allreduce #1: the ranks disagree", "chunks of 4096 bytes", "chunks of 8192 bytes")
    _raises(RuntimeError, lambda: dist.broadcast(torch.ones(4096, device=NPU), 0, group=group),
            "broadcast #2: the ranks disagree", "chunks of 4096 bytes", "chunks of 8192 bytes")
    dist.destroy_process_group(group)
    # A process forked after the group was made: a collective there is a
    # clear error, and dropping the group (as its exit does) neither crashes
    # nor hangs on the parent's threads.
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            dist.all_reduce(torch.ones(2, device=NPU))
            code = 10
        except RuntimeError as e:
            if "forked subprocess" not in str(e):
                code = 11
        dist.destroy_process_group()
        import gc
        gc.collect()
        os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and done[1] == 0, f"forked child: wait status {done[1] if done[0] else 'still running after 30 s'}"
    return msg


def _hang_then_death(rank, world):
    """Rank 1 first does not join an allreduce (rank 0 must fail within the
    group's 5 s timeout), then dies with os._exit during one on a second
    group."""
    timeout = datetime.timedelta(seconds=5)
    dist.init_process_group("npu", timeout=timeout)
    second = dist.new_group(backend="npu", timeout=timeout)
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(3, device=NPU)
    dist.all_reduce(t, group=second)  # both groups work
    if rank == 1:
        store.wait(["hang_seen"], datetime.timedelta(seconds=60))
        store.wait(["in_allreduce"], datetime.timedelta(seconds=60))
        time.sleep(0.5)  # rank 0 is inside the allreduce by now
        os._exit(3)
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError) as info:
        dist.all_reduce(t)
    hung = time.monotonic() - start
    msg_hang = str(info.value)
    for f in ["npu backend: allreduce #1", "rank 0 of 2", "peer rank 1"]:
        assert f in msg_hang, msg_hang
    store.set("hang_seen", "1")
    store.set("in_allreduce", "1")
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError) as info:
        dist.all_reduce(t, group=second)
    died = time.monotonic() - start
    msg_death = str(info.value)
    for f in ["npu backend: allreduce #2", "rank 0 of 2", "peer rank 1"]:
        assert f in msg_death, msg_death
    # The broken group fails at once, naming the first failure.
    msg_after = _raises(dist.DistBackendError, lambda: dist.all_reduce(t, group=second),
                        "allreduce #3", "unusable after an earlier failure", "allreduce #2")
    return {"hang": msg_hang, "hang_s": hung, "death": msg_death, "death_s": died, "after": msg_after}


def test_bad_arguments_and_mismatched_ranks():
    msgs = run_ranks(_bad_arguments_and_mismatches, world_size=2, timeout=90)
    assert "rank 1 called allreduce #2(torch.float32 [5], op SUM)" in msgs[0], msgs[0]


def test_hung_and_dead_peer_give_errors_within_the_timeout():
    # The harness bounds the whole run: a hang fails the test instead of
    # stopping the suite.
    results = run_ranks(_hang_then_death, world_size=2, timeout=90, expect_exit={1: 3})
    assert results[1] == ("exited", 3)
    r0 = results[0]
    print(f"hung peer: error after {r0['hang_s']:.1f} s: {r0['hang']}")
    print(f"dead peer: error after {r0['death_s']:.1f} s: {r0['death']}")
