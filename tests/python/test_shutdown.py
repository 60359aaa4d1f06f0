"""A process that ran an npu backward exits cleanly: PyTorch's autograd
engine runs npu backward passes on a device thread, which npubridge lets
finish before the interpreter shuts down (python_ext/npubridge/__init__.py;
the exit aborted now and then before). Six runs, each a process of its own
that exits as the interpreter does, finalisation included: five children
forked from a zygote (tests/python/conftest.py) that imported torch, then
the zygote itself, a fresh interpreter. The backward imports torch._dynamo
(a Python decomposition, seconds): the zygote imported it already."""
from conftest import Zygote

_CODE = (
    "import torch, npubridge\n"
    "x = torch.randn(4, 5, device='npu', requires_grad=True)\n"
    "parts = torch.split(x, [1, 3])\n"
    "torch.autograd.grad(sum(p.sum() for p in parts), [x])\n"
)


def test_process_exits_cleanly_after_an_npu_backward():
    with Zygote("import torch, npubridge, torch._dynamo") as zygote:
        for run in range(5):
            r = zygote.run(_CODE, finalize=True)
            assert r.returncode == 0, f"run {run}: {r.stderr[-500:]}"
        r = zygote.run_last(_CODE)
        assert r.returncode == 0, f"the zygote: {r.stderr[-500:]}"
