"""BatchNorm on npu: the running statistics it updates in training, and the
eval() output that uses them, against the same module on the CPU in float32
(calibration) and float64 (reference), judged by the error model
(conftest.assert_judged). Note [native_batch_norm writes what its schema
hides] (python_ext/csrc/aten/fallback.cpp): the statistics used to stay at
their initial values on npu."""
import pytest
import torch

from conftest import assert_judged


def _train_then_eval(module, batches, device, dtype):
    m = module.to(device=device, dtype=dtype).train()
    for x in batches:
        m(x.to(device=device, dtype=dtype))
    m.eval()
    return m, m(batches[0].to(device=device, dtype=dtype))


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.BatchNorm1d(6), (16, 6)),
    (lambda: torch.nn.BatchNorm1d(6, momentum=None), (16, 6, 5)),  # cumulative average
    (lambda: torch.nn.BatchNorm2d(8), (4, 8, 5, 5)),
    (lambda: torch.nn.BatchNorm3d(3, affine=False), (2, 3, 4, 4, 4)),
])
def test_running_stats_and_eval(make, shape):
    torch.manual_seed(0)
    batches = [torch.randn(shape) * 3 + 1 for _ in range(3)]
    state = make().state_dict()
    outs = {}
    for device, dtype in (("npu", torch.float32), ("cpu", torch.float32), ("cpu", torch.float64)):
        m = make()
        m.load_state_dict(state)
        outs[device, dtype] = _train_then_eval(m, batches, device, dtype)
    (npu, y_npu), (host, y_host), (wide, y_wide) = outs["npu", torch.float32], outs["cpu", torch.float32], \
        outs["cpu", torch.float64]
    assert int(npu.num_batches_tracked.cpu()) == len(batches)
    for name in ("running_mean", "running_var"):
        got = getattr(npu, name)
        assert got.device.type == "npu"
        assert not torch.equal(got.cpu(), make().state_dict()[name]), f"{name} never moved"
        assert_judged(got, getattr(host, name), getattr(wide, name), name)
    assert_judged(y_npu, y_host, y_wide, "eval output")


def test_untracked_and_eval_only_leave_no_stats():
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    m = torch.nn.BatchNorm1d(4, track_running_stats=False).to("npu")
    y = m(x.to("npu"))
    assert m.running_mean is None
    ref = torch.nn.BatchNorm1d(4, track_running_stats=False)(x)
    wide = torch.nn.BatchNorm1d(4, track_running_stats=False).double()(x.double())
    assert_judged(y, ref, wide, "batch statistics")
    e = torch.nn.BatchNorm1d(4).to("npu").eval()
    e(x.to("npu"))
    assert torch.equal(e.running_mean.cpu(), torch.zeros(4)) and torch.equal(e.running_var.cpu(), torch.ones(4))
