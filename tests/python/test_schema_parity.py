"""npubridge's schema parser against PyTorch's (Note [Defaults PyTorch takes],
registry/src/schema.cpp): every schema npubridge refuses for a default or an
argument order (the cases of Schema.RefusesWhatPyTorchRefusesWithThePosition
in tests/unit/test_schema.cpp, and a few more) is refused by PyTorch 2.13
too, through torch._C.parse_schema and torch.library's define; and edge
cases both must take are taken by both."""
import itertools

import pytest
import torch

import npubridge

REFUSED = [
    "Tensor x=5", "Tensor x=contiguous_format", "Tensor x='a'", "Tensor[] x=[]", "Tensor[] x=None",
    "Tensor?[] x=None", "Tensor? x=[]", "Device d=None", "Device d=cpu", "float x=1e999", "float x=-1e999",
    "float x=1e-999", "float x=1e-310", "Scalar x=1e999", "float[] x=[1e999]", "int x=9223372036854775808",
    "Scalar x=9223372036854775808", "float x=inf", "float x=nan", "Scalar x=-inf", "int x=+3", "float x=+1.5",
    "int x=Sum", "int x=foo", "str x=mean", "Scalar[] x=[1]", "str[] x=['a']", "int[]? x=[1]", "int[] x=1",
    "float[] x=1", "bool[] x=True", "int[] x=[1, True]", "int[] x=[True]", "int[2] x=[1.5, 2]", "int[2] x=True",
    "bool[2] x=[1, 0]", "bool[2] x=1", "float[] x=[1, True]", "Tensor a, int x=1, Tensor y", "int x=1, int? y",
]

ACCEPTED = [
    "Tensor a, int x=1, *, Tensor y, int z=2, Tensor w", "Tensor a, int x=1, Tensor? y=None", "Tensor x=None",
    "Tensor(a!) x=None", "Tensor? x=5", "Tensor? x=long", "int[2] x=1", "float[2] x=1", "bool[2] x=True",
    "int[]? x=1", "int[]? x=None", "float[] x=[1, 2]", "bool[3] x=[True, False, True]", "int[] x=[]",
    "SymInt[] x=[1, 2]", "int x=Mean", "int x=long", "ScalarType x=long", "Layout x=strided",
    "MemoryFormat x=contiguous_format", "Device d='cpu'", "Device? d=None", "float x=-1.5E3", "float x=.5",
    "float x=9223372036854775808", "int x=-9223372036854775808", "bool b=2", "str s=1", "int x='a'",
]

_names = (f"f{i}" for i in itertools.count())
_lib = torch.library.Library("npub_parity", "DEF")


def _torch_refuses(args):
    name = next(_names)
    refusals = 0
    for check in (lambda: torch._C.parse_schema(f"npub_parity::{name}({args}) -> Tensor"),
                  lambda: _lib.define(f"{name}({args}) -> Tensor")):
        try:
            check()
        except Exception:  # PyTorch raises RuntimeError, IndexError (stod, stoll), ...
            refusals += 1
    assert refusals in (0, 2), f"torch.library and parse_schema disagree on {args!r}"
    return refusals == 2


@pytest.mark.parametrize("args", REFUSED)
def test_what_npubridge_refuses_pytorch_refuses(args):
    with pytest.raises(ValueError, match="invalid schema at character"):
        npubridge._C.parse_schema(f"ns::f({args}) -> Tensor")
    assert _torch_refuses(args)


@pytest.mark.parametrize("args", ACCEPTED)
def test_edge_cases_both_take(args):
    npubridge._C.parse_schema(f"ns::f({args}) -> Tensor")
    assert not _torch_refuses(args)
