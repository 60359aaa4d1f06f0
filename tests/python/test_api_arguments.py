"""The npubridge package's functions check their arguments: a wrong type is a
TypeError and a malformed op name or an unknown plugin a ValueError, each
naming the argument, what was expected and what was found, before anything
reaches the op-mapping table or the dispatcher."""
import pytest
import torch

import npubridge

_OP_FORM = "an op name 'namespace::name' or 'namespace::name.overload' (such as 'aten::tan' or 'aten::sin.out')"


@pytest.mark.parametrize("args, error, message", [
    ((1, "aten::sin.out"), TypeError, "register_op(): expected framework_op to be an op name (str) but found int 1"),
    (("aten::tan", None), TypeError, "register_op(): expected target_op to be an op name (str) but found NoneType None"),
    (("aten::tan", "aten::sin.out", 3), TypeError,
     "register_op(): expected plugin to be a plugin name (str, \"\" for any) but found int 3"),
    (("", "aten::sin.out"), ValueError, f"register_op(): expected framework_op to be {_OP_FORM} but found an empty string"),
    (("aten::tan", ""), ValueError, f"register_op(): expected target_op to be {_OP_FORM} but found an empty string"),
    (("tan", "aten::sin.out"), ValueError, f"register_op(): expected framework_op to be {_OP_FORM} but found 'tan'"),
    (("aten::", "aten::sin.out"), ValueError, f"register_op(): expected framework_op to be {_OP_FORM} but found 'aten::'"),
    (("aten::tan.", "aten::sin.out"), ValueError,
     f"register_op(): expected framework_op to be {_OP_FORM} but found 'aten::tan.'"),
    ((" aten::tan", "aten::sin.out"), ValueError,
     f"register_op(): expected framework_op to be {_OP_FORM} but found ' aten::tan'"),
    (("aten::tan", "aten::sin out"), ValueError,
     f"register_op(): expected target_op to be {_OP_FORM} but found 'aten::sin out'"),
    (("aten::tan", "aten::sin.out", "nope"), ValueError,
     "register_op(): expected plugin to be a loaded plugin (cann_like, mindspeed_like, vllm_like) or \"\" but found 'nope'"),
])
def test_register_op_checks_its_arguments(args, error, message):
    with pytest.raises(error) as e:
        npubridge.register_op(*args)
    assert str(e.value) == message
    assert "aten::tan" not in [m[0] for m in npubridge.op_map()]


def test_register_op_takes_a_loaded_plugin():
    npubridge.register_op("aten::tan", "aten::sin.out", "cann_like")
    try:
        assert ("aten::tan", "aten::sin.out", "cann_like") in npubridge.op_map()
        x = torch.arange(3.0)
        assert torch.allclose(torch.tan(x.to("npu")).cpu(), torch.sin(x))
    finally:
        npubridge.unregister_op("aten::tan")


@pytest.mark.parametrize("args, kwargs, message", [
    (("yes",), {}, "precision_check(): expected enabled to be a bool but found str 'yes'"),
    ((1,), {}, "precision_check(): expected enabled to be a bool but found int 1"),
    ((None,), {}, "precision_check(): expected enabled to be a bool but found NoneType None"),
    ((True, "x"), {}, "precision_check(): expected raise_on_mismatch to be a bool but found str 'x'"),
    ((False,), {"raise_on_mismatch": 0}, "precision_check(): expected raise_on_mismatch to be a bool but found int 0"),
])
def test_precision_check_takes_bools_only(args, kwargs, message):
    with pytest.raises(TypeError) as e:
        npubridge.precision_check(*args, **kwargs)
    assert str(e.value) == message
