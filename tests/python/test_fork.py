"""A child forked while the parent runs npu ops (Note [A forked child cannot
use the npu], device_sim/src/fork_guard.cpp): its npu use raises PyTorch's
CUDA-style error instead of hanging on a lock or a device thread the fork
left behind, its CPU work is unaffected, and the parent keeps working."""
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import npubridge  # noqa: F401

BAD_FORK = (
    "Cannot re-initialize npu in forked subprocess. To use npu with multiprocessing, "
    "you must use the 'spawn' start method"
)
CHILD_TIMEOUT_S = 20
FORKS = 50


class BusyParent:
    """A thread that keeps npu:0 busy (allocations, products on the compute
    threads, stream work, synchronisations) while the test forks."""

    def __init__(self):
        self.x = torch.randn(64, 64).to("npu")
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            y = self.x @ self.x
            if self.rounds % 8 == 0:
                y.cpu()
            self.rounds += 1

    def __enter__(self):
        self.thread.start()
        while self.rounds < 4:  # the device is really busy before the first fork
            pass
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def _child(x, conn):
    """What a DataLoader-like worker does: CPU work (with torch.manual_seed,
    which seeds custom devices unless they are in a bad fork), then npu use,
    each reported as the error's message or "ok"."""
    report = {}

    def attempt(name, fn):
        try:
            fn()
            report[name] = "ok"
        except RuntimeError as e:
            report[name] = str(e)

    try:
        import npubridge  # noqa: F401, F811  (importing it in the child is fine)

        torch.manual_seed(0)
        a = torch.arange(6.0).reshape(2, 3)
        report["cpu"] = float((a @ a.T).sum())
        report["bad_fork"] = torch.npu._is_in_bad_fork()
        report["is_initialized"] = torch.npu.is_initialized()
        report["device_count"] = torch.npu.device_count()
        attempt("op_on_inherited_tensor", lambda: x @ x)
        attempt("to_cpu", lambda: x.cpu())
        attempt("factory", lambda: torch.ones(3, device="npu"))
        attempt("synchronize", torch.npu.synchronize)
        attempt("lazy_init", torch.npu._lazy_init)
    finally:
        conn.send(report)
        conn.close()


def test_a_child_forked_while_the_parent_runs_npu_ops_gets_an_error_never_a_hang():
    ctx = multiprocessing.get_context("fork")
    with BusyParent() as busy:
        for i in range(FORKS):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(busy.x, writer))
            p.start()
            writer.close()
            p.join(CHILD_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
                pytest.fail(f"fork {i}: the child hung on npu use ({CHILD_TIMEOUT_S} s)")
            assert p.exitcode == 0, f"fork {i}: the child died with exit code {p.exitcode}"
            report = reader.recv()
            reader.close()
            a = torch.arange(6.0).reshape(2, 3)
            assert report["cpu"] == float((a @ a.T).sum())
            assert report["bad_fork"] is True and report["is_initialized"] is False
            assert report["device_count"] == torch.npu.device_count()  # as torch.cuda reports it
            for use in ("op_on_inherited_tensor", "to_cpu", "factory", "synchronize", "lazy_init"):
                assert report[use].startswith(BAD_FORK), f"fork {i}, {use}: {report[use]}"
        assert busy.rounds > FORKS


def test_the_parent_keeps_working_after_forking():
    ctx = multiprocessing.get_context("fork")
    with BusyParent():
        p = ctx.Process(target=torch.npu._is_in_bad_fork)
        p.start()
        p.join(CHILD_TIMEOUT_S)
        assert p.exitcode == 0
    assert not torch.npu._is_in_bad_fork() and torch.npu.is_initialized()
    a = torch.randn(64, 64)
    got = a.to("npu") @ a.to("npu")
    torch.npu.synchronize()
    assert torch.allclose(got.cpu(), a @ a, rtol=1e-5, atol=1e-4)
    assert torch.npu.memory_allocated() > 0


def test_a_forked_child_that_exits_normally_neither_hangs_nor_fails_at_exit():
    # os.fork() and sys.exit (not multiprocessing's os._exit): the child runs
    # atexit handlers and finalisation, which free the npu tensors it
    # inherited (left to the parent's allocator, never freed in the child).
    # The parent forks with the device busy, then lets the busy thread wait
    # until the child is done: the child has what the fork copied, and a
    # finalisation that shares the CPU with it took seconds more per child.
    script = textwrap.dedent(
        f"""
        import gc, os, sys, threading, time
        import torch, npubridge
        x = torch.randn(64, 64).to("npu")
        stop, going, rounds = threading.Event(), threading.Event(), [0]
        def busy():
            while going.wait() and not stop.is_set():
                (x @ x).cpu()
                rounds[0] += 1
        threading.Thread(target=busy, daemon=True).start()
        for i in range(5):
            busy_from = rounds[0]
            going.set()
            while rounds[0] < busy_from + 4:  # the device is really busy before the fork
                time.sleep(0.001)
            pid = os.fork()
            if pid == 0:
                try:
                    x @ x
                    sys.exit(5)
                except RuntimeError as e:
                    code = 0 if str(e).startswith({BAD_FORK!r}) else 6
                kept = [torch.empty(1).to("cpu"), x]
                del kept
                gc.collect()
                sys.exit(code)
            going.clear()
            deadline = time.monotonic() + {CHILD_TIMEOUT_S}
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    print("child", i, "hung"); sys.exit(1)
                time.sleep(0.01)
            if os.waitstatus_to_exitcode(status) != 0:
                print("child", i, "exit code", os.waitstatus_to_exitcode(status)); sys.exit(1)
        stop.set()
        going.set()
        print("ok")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
