"""The npubridge package's functions check their arguments: a wrong type is a
TypeError and a malformed op name or an unknown plugin a ValueError, each
naming the argument, what was expected and what was found, before anything
reaches the op-mapping table or the dispatcher."""
import os
import subprocess
import sys

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


def test_precision_check_on_and_off():
    """With the sloppy test plugin (its float32 aten::neg.out is off by 1e-3):
    off (the default), its calls are not judged; on without raising, each
    call returns the kernel's result and its mismatch is listed and counted;
    precision_check() starts a new list; off again, nothing is judged."""
    code = """
import warnings
import torch, npubridge
warnings.simplefilter("ignore")
x = torch.randn(64)
def counted():
    return npubridge.stats()["aten::neg.out"].get("precision_mismatches", 0)
def listed():
    return [(m["op"], m["plugin"], m["output"]) for m in npubridge.precision_mismatches()]
sloppy = (-x.npu()).cpu()
assert (sloppy + x - 1e-3).abs().max() < 1e-5, "the sloppy plugin's neg did not serve the call"
assert listed() == [] and counted() == 0, (listed(), counted())
npubridge.precision_check(True, raise_on_mismatch=False)
assert torch.equal((-x.npu()).cpu(), sloppy)  # judged, not raised, not replaced
assert listed() == [("aten::neg", "sloppy", "return 0")] and counted() == 1, (listed(), counted())
(-x.npu()).cpu()
assert len(listed()) == 2 and counted() == 2, (listed(), counted())
npubridge.precision_check(False)
assert listed() == [], listed()
assert torch.equal((-x.npu()).cpu(), sloppy)
assert listed() == [] and counted() == 2, (listed(), counted())
npubridge.precision_check(True)
(-x.npu()).cpu()
assert listed() == [("aten::neg", "sloppy", "return 0")] and counted() == 3, (listed(), counted())
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, NPUB_PLUGIN_PATH=os.environ["NPUB_TEST_SLOPPY_PLUGIN_DIR"]))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
