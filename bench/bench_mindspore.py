"""npubridge.mindspore against MindSpore on its own, in one process and run:
each figure is a ratio of two measurements taken here, side by side (these
machines are noisy; absolute times say little).

One training step (forward, backward, AdamW) of the tiny Llama of
npubridge.mindspore.testing, in PyNative and in GRAPH_MODE:
- adapter: the network written with MindSpore's fused operators, served by
  the plugins (npubridge.mindspore.enable());
- MindSpore: the same computation in MindSpore's basic operators, which its
  CPU build runs (it has no kernel for the fused ones), the same AdamW update
  in MindSpore's operators.

Usage: python3 bench/bench_mindspore.py results.json [--quick]
(./scripts/bench.sh mindspore).
"""
import argparse
import json
import sys
import warnings

import mindspore as ms

import npubridge.mindspore as ms_adapter
from npubridge.mindspore import testing
from timing import timed

warnings.filterwarnings("ignore")


def step_fn(net, graph, ids):
    opt = ms_adapter.AdamW(net.trainable_params(), lr=1e-3)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)

    def step(ids):
        loss, grads = grad_fn(ids)
        opt(grads)
        return loss

    step = ms.jit(step) if graph else step
    return lambda: step(ids).asnumpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = testing.Config() if args.quick else testing.Config(hidden=128, heads=4, layers=2, intermediate=256, seq=64)
    ids = testing.batch(cfg, batch_size=4)
    reps = 3 if args.quick else 10
    results = {"config": vars(cfg), "steps": {}}
    for mode in ("pynative", "graph"):
        graph = mode == "graph"
        ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
        ms.set_seed(0)
        native = testing.TinyLlama(cfg, ms.float32, fused=False)
        fused = testing.TinyLlama(cfg, ms.float32, fused=True)
        testing.copy_weights(native, fused)
        ms_adapter.enable()
        t_adapter = timed(step_fn(fused, graph, ids), reps)
        ms_adapter.disable()
        t_native = timed(step_fn(native, graph, ids), reps)
        results["steps"][mode] = {"mindspore_ms": t_native * 1e3, "adapter_ms": t_adapter * 1e3,
                                  "adapter_over_mindspore": t_adapter / t_native}
        print(f"{mode:9s} one training step: MindSpore {t_native * 1e3:8.1f} ms, adapter {t_adapter * 1e3:8.1f} ms, "
              f"ratio {t_adapter / t_native:.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
