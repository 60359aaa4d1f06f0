"""Tied parameters (one Parameter object used by two modules, as a language
model's input and output embeddings) through every way a model reaches the
npu: each path must tie (or, where PyTorch itself unties, untie) exactly as
it does on the CPU, and a tied weight must get one gradient."""
import copy
import io

import pytest
import torch

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_matches


def tied_model():
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embedding.weight
    return torch.nn.ModuleList([embedding, head])


def tied(m):
    return m[0].weight is m[1].weight


def shares_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


# Each path takes the target device ("cpu" or "npu") and returns the module.
def to(d):
    return tied_model().to(d)


def to_empty(d):
    return tied_model().to_empty(device=d)


def load_module(d):
    return torch.load(saved(tied_model()), map_location=d, weights_only=False)


def load_state_dict_into_a_tied_model(d):
    m = tied_model().to(d)
    m.load_state_dict(torch.load(saved(tied_model().state_dict()), map_location=d))
    return m


def assign_a_loaded_state_dict(d):
    # assign=True puts one new Parameter per key: PyTorch unties here on
    # every device (the two still share their storage).
    m = tied_model()
    m.load_state_dict(torch.load(saved(tied_model().state_dict()), map_location=d), assign=True)
    return m


def assign_the_state_dict_of_a_moved_model(d):
    m = tied_model()
    m.load_state_dict(tied_model().to(d).state_dict(), assign=True)
    return m


def to_empty_from_meta(d):
    # meta tensors are not shallow-copy compatible with CPU or CUDA ones
    # either: PyTorch makes one Parameter per module here.
    with torch.device("meta"):
        m = tied_model()
    return m.to_empty(device=d)


PATHS = [to, to_empty, load_module, load_state_dict_into_a_tied_model, assign_a_loaded_state_dict,
         assign_the_state_dict_of_a_moved_model, to_empty_from_meta]
KEEPS_THE_TIE = {to, to_empty, load_module, load_state_dict_into_a_tied_model}


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.__name__)
def test_a_path_ties_as_on_the_cpu(path):
    cpu, npu = path("cpu"), path("npu")
    assert npu[0].weight.device.type == "npu" and npu[1].weight.device.type == "npu"
    assert tied(npu) == tied(cpu), f"{path.__name__}: tied on the cpu: {tied(cpu)}, on npu: {tied(npu)}"
    assert shares_storage(npu[0].weight, npu[1].weight) == shares_storage(cpu[0].weight, cpu[1].weight)
    if path in KEEPS_THE_TIE:
        assert tied(npu), path.__name__
    if path is not to_empty and path is not to_empty_from_meta:  # to_empty leaves the values undefined
        assert torch.equal(npu[0].weight.detach().cpu(), cpu[0].weight.detach())


def test_the_generated_npu_method_keeps_the_tie():
    m = tied_model().npu()
    assert m[0].weight.device == torch.device("npu:0")
    assert tied(m)


def test_a_tied_weight_gets_one_gradient_from_both_uses():
    # Small integers throughout: every product and sum is exact in float32,
    # so both devices must give the float64 gradient exactly.
    cpu = tied_model()
    with torch.no_grad():
        cpu[0].weight.copy_(torch.randint(-3, 4, (8, 4), generator=torch.Generator().manual_seed(2)))
    npu = copy.deepcopy(cpu).to("npu")
    wide = copy.deepcopy(cpu).double()
    ids = torch.tensor([[1, 2, 3, 7], [0, 5, 5, 6]])
    weights = torch.randint(-2, 3, (2, 4, 8), generator=torch.Generator().manual_seed(3)).float()
    grads = []
    for m, i, w in ((cpu, ids, weights), (npu, ids.npu(), weights.npu()), (wide, ids, weights.double())):
        (m[1](m[0](i)) * w).sum().backward()
        grads.append(m[0].weight.grad.cpu().double())
    assert npu[1].weight.grad is npu[0].weight.grad  # one Parameter, one gradient
    assert torch.equal(grads[2], grads[0])  # the CPU's is exact
    assert torch.equal(grads[1], grads[2])


def test_an_optimizer_step_moves_both_uses():
    m = tied_model().to("npu")
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    assert len(opt.param_groups[0]["params"]) == 1  # parameters() lists a tied weight once
    ids = torch.tensor([1, 2, 3], device="npu")
    torch.nn.functional.cross_entropy(m[1](m[0](ids)), ids).backward()
    before = m[1].weight.detach().clone()
    opt.step()
    assert not torch.equal(m[1].weight.detach().cpu(), before.cpu())
    assert torch.equal(m[0].weight.detach().cpu(), m[1].weight.detach().cpu())


def test_tied_weights_stay_tied_through_to_and_back():
    # Module._apply keeps Parameter objects only for shallow-copy compatible
    # tensor types (Note [npu tensors are shallow-copy compatible with CPU
    # ones]); a tied embedding must stay one tensor and get one gradient.
    torch.manual_seed(0)
    e = torch.nn.Embedding(8, 4)
    lin = torch.nn.Linear(4, 8, bias=False)
    lin.weight = e.weight
    m = torch.nn.ModuleList([e, lin])
    w0 = e.weight.detach().clone()
    m = m.to("npu")
    assert m[0].weight is m[1].weight and m[0].weight.device.type == "npu"
    assert isinstance(m[0].weight, torch.nn.Parameter)
    ids = torch.tensor([1, 5, 1, 7])
    m[1](m[0](ids.npu())).square().sum().backward()

    def tied_grad(w):  # the gradient of the tied weight through both uses, on the CPU
        w = w.clone().requires_grad_(True)
        torch.nn.functional.linear(torch.nn.functional.embedding(ids, w), w).square().sum().backward()
        return w.grad

    assert_matches(m[0].weight.grad, tied_grad, w0)
    back = m.to("cpu")
    assert back[0].weight is back[1].weight and back[0].weight.device.type == "cpu"
