"""Runs a test body on several processes, as torchrun would, on loopback.

    from harness import run_ranks
    results = run_ranks(_body, world_size=2, timeout=120)

`_body(rank, world_size, *args)` must be a module-level function (each rank
is a fresh interpreter started with the "spawn" method, which imports the
test module by name). Before calling it the rank has RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR/MASTER_PORT and GLOO_SOCKET_IFNAME=lo set, one
compute thread, and `npubridge` imported; the body calls
`dist.init_process_group(...)` itself (`init_env://` reads those
variables), so that a test can choose the backend and the timeout.

run_ranks returns the bodies' return values by rank. If any rank raises,
exits or outlives `timeout`, every rank still alive is killed and
RankFailure is raised with each rank's outcome (traceback, exit code or
"timed out"), so that a broken collective fails the test instead of hanging
the suite. `expect_exit={rank: code}` marks ranks that are meant to die
(fault tests): such a rank's exit is its result.
"""
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import socket
import sys
import time
import traceback


class RankFailure(AssertionError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world_size, port, env, args, queue):
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
    })
    os.environ.update(env)
    try:
        import torch
        torch.set_num_threads(1)
        import npubridge  # noqa: F401
        value = fn(rank, world_size, *args)
        # Plain pickle copies tensors' data: the queue's own pickler would
        # send them through shared memory, which dies with this process.
        queue.put((rank, "ok", pickle.dumps(value)))
    except BaseException:  # noqa: BLE001  (reported to the parent)
        queue.put((rank, "raised", traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def run_ranks(fn, world_size=2, timeout=120.0, env=None, args=(), expect_exit=None):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    expect_exit = expect_exit or {}
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, dict(env or {}), tuple(args), queue),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    outcome = {}
    deadline = time.monotonic() + timeout
    while len(outcome) < world_size and time.monotonic() < deadline:
        try:
            rank, kind, value = queue.get(timeout=0.2)
            outcome[rank] = (kind, pickle.loads(value) if kind == "ok" else value)
        except queue_module.Empty:
            pass
        for r, p in enumerate(procs):
            if r not in outcome and p.exitcode is not None and queue.empty():
                if r in expect_exit and p.exitcode == expect_exit[r]:
                    outcome[r] = ("ok", ("exited", p.exitcode))
                elif r not in expect_exit:
                    # A rank that exited without reporting (killed, os._exit).
                    time.sleep(0.2)
                    if queue.empty() and r not in outcome:
                        outcome[r] = ("exited", p.exitcode)
    for r, p in enumerate(procs):
        if r not in outcome:
            outcome[r] = ("timed out", f"still running after {timeout:.0f} s")
        p.join(timeout=5 if outcome[r][0] != "timed out" else 0.1)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    failed = {r: o for r, o in outcome.items() if o[0] != "ok"}
    if failed:
        lines = [f"{len(failed)} of {world_size} ranks failed:"]
        for r in sorted(failed):
            kind, value = failed[r]
            lines.append(f"--- rank {r}: {kind}\n{value}")
        raise RankFailure("\n".join(lines))
    return [outcome[r][1] for r in range(world_size)]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("harness.py is imported by the distributed tests")
