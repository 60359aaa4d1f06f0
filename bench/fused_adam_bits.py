"""The measurement behind Note [The fused Adam's arithmetic follows ATen's
fused CPU kernel] (plugins/mindspeed_like/src/fused_adam.cpp): npu's
aten::_fused_adam_/_fused_adamw_ against torch's own CPU kernel, bit for bit,
over 10 steps, every flag, both lerp branches, tails of every length mod 16.

Not a test: equality with ATen's float32 output depends on the CPU kernel
ATen picks (its AVX-512 build here) and is no correctness criterion; the
tests (tests/python/test_fused_adam.py) judge results against float64.
Run it after changing fused_adam.cpp:
    PYTHONPATH=build/release/python python3 bench/fused_adam_bits.py
"""
import itertools
import sys

import torch

import npubridge  # noqa: F401

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
OPS = ("aten::_fused_adamw_", "aten::_fused_adam_")


def compare(op, dtype):
    """The measurement Note [The fused Adam's arithmetic follows ATen's fused
    CPU kernel] reports: equal to torch's own CPU kernel bit for bit over 10
    steps, every flag, both lerp branches, tails of every length mod 16. Not
    a correctness criterion (the other tests are): it checks that the
    arithmetic written in fused_adam.cpp is ATen's."""
    fn = getattr(torch, op.split("::")[1])
    shapes = [(n, ) for n in range(1, 18)] + [(64, 33)]
    differing = 0
    for amsgrad, maximize, wd, scaled, beta1 in itertools.product((False, True), (False, True), (0.0, 0.1),
                                                                 (False, True), (0.9, 0.3)):
        results = []
        for dev in ("cpu", "npu"):
            g = torch.Generator().manual_seed(1)
            ps = [torch.randn(s, generator=g).to(dev, dtype) for s in shapes]
            ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
            mx = [torch.zeros_like(p) for p in ps] if amsgrad else []
            steps = [torch.tensor(0.0, device=dev) for _ in ps]
            grads_seen = []
            for _ in range(10):
                gs = [(3 * torch.randn(s, generator=g)).to(dev, dtype) for s in shapes]
                torch._foreach_add_(steps, 1)
                extra = dict(grad_scale=torch.tensor(3.0, device=dev),
                             found_inf=torch.tensor(0.0, device=dev)) if scaled else {}
                fn(ps, gs, ms, vs, mx, steps, lr=1e-2, beta1=beta1, beta2=0.999, weight_decay=wd, eps=1e-8,
                   amsgrad=amsgrad, maximize=maximize, **extra)
                grads_seen += gs
            results.append([t.cpu() for t in ps + ms + vs + mx + grads_seen])
        for i, (c, n) in enumerate(zip(*results)):
            if not torch.equal(c, n):
                differing += 1
                print(f"{op} {dtype}: amsgrad={amsgrad} maximize={maximize} wd={wd} scaled={scaled} beta1={beta1}: "
                      f"tensor {i} differs in {(c != n).sum().item()} elements")
    return differing


def main():
    print(f"ATen's CPU kernel: {torch.backends.cpu.get_cpu_capability()}")
    differing = sum(compare(op, dtype) for op in OPS for dtype in DTYPES)
    print("bit for bit equal" if not differing else f"{differing} tensors differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
