"""A process that ran an npu backward exits cleanly: PyTorch's autograd
engine runs npu backward passes on a device thread, which npubridge lets
finish before the interpreter shuts down (python_ext/npubridge/__init__.py;
the exit aborted now and then before). Five runs, each a fresh process."""
from conftest import run_python


def test_process_exits_cleanly_after_an_npu_backward():
    code = (
        "import torch, npubridge\n"
        "x = torch.randn(4, 5, device='npu', requires_grad=True)\n"
        "parts = torch.split(x, [1, 3])\n"
        "torch.autograd.grad(sum(p.sum() for p in parts), [x])\n"
    )
    for _ in range(5):
        r = run_python(code)
        assert r.returncode == 0, r.stderr[-500:]
