"""Eager PyTorch on npu against PyTorch on the CPU, the first things a user
runs: tensors made on and moved to the devices, and printed; elementwise
ops and reductions in float32, bfloat16 and int64; views that share their
base's storage, and strided inputs; in-place and out= variants; a few
training steps of a small model. Results are judged by npubridge's error
model against float64 (conftest.assert_judged), exact where nothing is
computed."""
import copy

import pytest
import torch
import torch.nn.functional as F

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_judged, assert_matches


def test_acceptance_snippet():
    x = torch.ones(3).to("npu")
    assert torch.equal((x + x).cpu(), torch.tensor([2.0, 2.0, 2.0]))
    assert torch.npu.device_count() == 2
    assert (x + x).device == torch.device("npu:0")


def test_factories_devices_and_printing():
    y = torch.randn(2, 3, device="npu:1")
    assert y.device == torch.device("npu:1")
    assert "device='npu:1'" in repr(y)
    z = torch.zeros(4, 5, device="npu")
    assert torch.equal(z.cpu(), torch.zeros(4, 5))
    assert z.is_npu
    assert torch.full((2,), 7.0).npu().cpu().tolist() == [7.0, 7.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_elementwise_and_reductions_match_cpu(dtype):
    torch.manual_seed(0)
    a = (torch.randn(6, 7) * 3).to(dtype)
    b = (torch.randn(7) * 3).to(dtype)
    na, nb = a.npu(), b.npu()
    for fn in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - 2 * y, torch.maximum, lambda x, y: x > y):
        assert_matches(fn(na, nb), fn, a, b)
    assert_matches(na.sum(dim=1), lambda x: x.sum(dim=1), a)
    assert_matches(na.amax(dim=0), lambda x: x.amax(dim=0), a)
    if dtype != torch.int64:
        assert_matches(na.mean(dim=1), lambda x: x.mean(dim=1), a)
        assert_matches(torch.softmax(na, dim=1), lambda x: torch.softmax(x, dim=1), a)


def test_views_are_native_and_strided_inputs_work():
    a = torch.randn(4, 6)
    na = a.npu()
    t = na.t()
    assert t.data_ptr() == na.data_ptr()  # a view, not a copy
    assert_matches(t @ na, lambda x: x.t() @ x, a)
    assert torch.equal(na[1:3, ::2].cpu(), a[1:3, ::2])  # a view and a relu compute nothing: exact
    assert torch.equal(na.view(3, 8).relu().cpu(), a.view(3, 8).relu())


def test_inplace_and_out_variants():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    na, nb = a.npu(), b.npu()
    na.add_(nb, alpha=2)
    assert_matches(na, lambda x, y: x + 2 * y, a, b)
    out = torch.empty(3, 4, device="npu")
    torch.mul(na, nb, out=out)
    assert_matches(out, lambda x, y: (x + 2 * y) * y, a, b)
    before = na.cpu()
    na.relu_()
    assert torch.equal(na.cpu(), before.relu())  # exact


def test_nn_ops_and_a_few_training_steps_match_cpu():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(*[m for m in model])  # same parameters object graph
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    cpu_model.load_state_dict(model.state_dict())
    npu_model = model.npu()
    wide_model = copy.deepcopy(cpu_model).double()  # the reference: float64 on the CPU
    opt_n = torch.optim.SGD(npu_model.parameters(), lr=0.1)
    opt_c = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    opt_w = torch.optim.SGD(wide_model.parameters(), lr=0.1)
    for step in range(3):
        ln = F.cross_entropy(npu_model(x.npu()), y.npu())
        lc = F.cross_entropy(cpu_model(x), y)
        lw = F.cross_entropy(wide_model(x.double()), y)
        assert_judged(ln, lc, lw, f"loss of step {step}")
        for o in (opt_n, opt_c, opt_w):
            o.zero_grad()
        for loss in (ln, lc, lw):
            loss.backward()
        for o in (opt_n, opt_c, opt_w):
            o.step()
    for i, (pn, pc, pw) in enumerate(zip(npu_model.parameters(), cpu_model.parameters(), wide_model.parameters())):
        assert_judged(pn, pc, pw, f"parameter {i} after 3 steps")
    del ref


def _same_bits(a, b):
    """Equal element for element, bit for bit (-0.0 is not 0.0)."""
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_fill_and_zero_on_contiguous_and_strided_views(dtype):
    # fill_ converts its value once and writes its bytes (Note [A fill
    # converts its value once]): every dtype, the sign of -0.0, views with
    # gaps and with a transposed layout (which must keep the elements
    # outside them), and a 0-d tensor.
    values = [True, False] if dtype == torch.bool else [1, -3, 0] if not dtype.is_floating_point else [2.5, -0.0, 1e-3]
    for value in values:
        for make in (lambda t: t, lambda t: t[:, ::2], lambda t: t.t(), lambda t: t[1:, 3:].t(), lambda t: t[2, 5]):
            base_c = torch.ones(6, 8, dtype=dtype)
            base_n = base_c.npu()
            make(base_c).fill_(value)
            make(base_n).fill_(value)
            assert _same_bits(base_n.cpu(), base_c), (dtype, value)
            make(base_c).zero_()
            make(base_n).zero_()
            assert _same_bits(base_n.cpu(), base_c), (dtype, value)
    big = torch.empty(300, 1000, dtype=dtype, device="npu").fill_(values[0])
    assert torch.equal(big.cpu(), torch.full((300, 1000), values[0], dtype=dtype))
    assert not big.zero_().cpu().any()


def test_writes_to_an_expanded_self_see_each_other():
    # An output with a stride of 0 (an expanded self, which ATen lets fill_
    # and masked_fill_ write) is walked in order on one thread (Note [Rows
    # follow the operands' layout]): masked_fill_ leaves the value wherever
    # any mask element of the location is set, as ATen's serial loop does,
    # with the mask in either layout.
    import warnings
    torch.manual_seed(0)
    for mask in ((torch.rand(1000, 64) > 0.97), (torch.rand(64, 1000) > 0.97).t()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ATen: masked_fill_ on expanded tensors is deprecated
            c = torch.zeros(1000, 1).expand(1000, 64).masked_fill_(mask, 1.0)
            n = torch.zeros(1000, 1, device="npu").expand(1000, 64).masked_fill_(mask.npu(), 1.0)
        assert torch.equal(n.cpu(), c)
        assert torch.equal(c[:, 0], mask.any(dim=1).float())
    e = torch.zeros(1, 64, device="npu").expand(1000, 64).fill_(2.0)
    assert torch.equal(e.cpu(), torch.full((1000, 64), 2.0))


def test_elementwise_results_take_a_transposed_operands_layout():
    # Note [Rows follow the operands' layout]: the walk follows the strides,
    # the values and ATen's result strides stay.
    torch.manual_seed(0)
    h = torch.randn(4, 128, 4, 64).transpose(1, 2)  # BNSD view of BSND
    cases = [lambda t: t.transpose(-1, -2) * 0.125, lambda t: t.transpose(-1, -2) + t.transpose(-1, -2).exp(),
             lambda t: torch.where(t > 0, t, -t).transpose(0, 3).contiguous(),
             lambda t: t.permute(3, 1, 0, 2) - torch.ones(64, 4, 1, 128)[..., :1].to(t.device)]
    for f in cases:
        n = f(h.npu())
        assert n.stride() == f(h).stride()
        assert_matches(n, f, h)


@pytest.mark.parametrize("shape,dims", [((4096, 256), (-1,)), ((37, 300), (-1,)), ((512, 2, 256), (1,)),
                                        ((3, 5, 2000), (1,)), ((1024, 256), (0,))])
def test_float32_sums_and_means_over_rows_and_middle_dims(shape, dims):
    # The row-block and typed-store paths of the float32 sums (reduce.cpp),
    # against float64 sums: each output within a few ulp of its sum of |x|.
    torch.manual_seed(0)
    x = torch.randn(shape)
    for keepdim in (False, True):
        n_sum, n_mean = x.npu().sum(dims, keepdim=keepdim).cpu(), x.npu().mean(dims, keepdim=keepdim).cpu()
        ref = x.double().sum(dims, keepdim=keepdim)
        bound = 4 * 2.0 ** -24 * x.double().abs().sum(dims, keepdim=keepdim) + 1e-30
        count = x.numel() // ref.numel()
        assert n_sum.dtype == torch.float32 and n_sum.shape == ref.shape
        assert ((n_sum.double() - ref).abs() <= bound).all()
        assert ((n_mean.double() - ref / count).abs() <= bound / count).all()
