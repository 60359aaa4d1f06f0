"""Per-node overhead of graph mode's C++ loop against eager npu dispatch, on
a chain of small elementwise ops (16 floats: the kernels cost almost
nothing, so the time per node is the dispatch). Also the arena taken from
the caching allocator per call against one kept across calls.

    PYTHONPATH=build/release/python python3 bench/bench_graph_loop.py [nodes] [reps]
"""
import sys
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import npubridge  # noqa: F401
from npubridge._compile.lowering import lower


def chain(n):
    def f(x, y):
        for i in range(n):
            x = x * y if i % 2 else x + y
        return (x,)
    return f


def best(fn, reps, inner):
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        t.append((time.perf_counter() - t0) / inner)
    return min(t)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    x = torch.randn(16, device="npu")
    y = torch.randn(16, device="npu")
    f = chain(n)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    per_call = lower(gm, [x, y])
    kept = lower(gm, [x, y], keep_arena=True)
    assert torch.equal(per_call(x, y)[0].cpu(), f(x, y)[0].cpu())
    with torch.no_grad():
        eager = best(lambda: f(x, y), reps, 5)
        fx = best(lambda: gm(x, y), reps, 5)
        loop = best(lambda: per_call(x, y), reps, 20)
        loop_kept = best(lambda: kept(x, y), reps, 20)
    us = lambda s: s / n * 1e6  # noqa: E731
    print(f"{n} nodes: eager npu {us(eager):.2f} us/node, FX interpreted {us(fx):.2f} us/node, "
          f"C++ loop {us(loop):.2f} us/node (arena per call), {us(loop_kept):.2f} us/node (arena kept); "
          f"eager/loop {eager / loop:.1f}x; arena {per_call.summary()['planned_bytes']} bytes")


if __name__ == "__main__":
    main()
