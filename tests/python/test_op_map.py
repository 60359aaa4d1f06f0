"""The op-mapping table under PyTorch: npubridge.register_op / unregister_op,
NPUB_OP_MAP, and the mappings shipped in registry/data/op_map.txt."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import npubridge
from conftest import assert_matches


def native_calls():
    return {op: s["native"] for op, s in npubridge.stats().items() if s["native"]}


def test_register_op_routes_an_aten_op_npubridge_does_not_bridge_and_unregister_restores_the_fallback(npu):
    # No plugin serves tan: its calls fall back to the CPU. Mapped to relu's
    # kernel (a wrong result on purpose), the next call runs relu.
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0])
    npubridge.reset_stats()
    torch.testing.assert_close(torch.tan(x.to(npu)).cpu(), torch.tan(x))
    assert npubridge.stats()["aten::tan.out"]["fallbacks"] == 1
    npubridge.register_op("aten::tan", "aten::relu", "cann_like")
    try:
        assert ("aten::tan", "aten::relu", "cann_like") in npubridge.op_map()
        assert "aten::tan -> aten::relu" in npubridge.routed_ops()["mapped"]
        npubridge.reset_stats()
        assert torch.equal(torch.tan(x.to(npu)).cpu(), torch.relu(x))
        assert native_calls() == {"aten::relu": {"cann_like": 1}}
        assert "aten::tan.out" not in npubridge.stats()
    finally:
        npubridge.unregister_op("aten::tan")
    assert "aten::tan" not in [m[0] for m in npubridge.op_map()]
    assert "aten::tan -> aten::relu" not in npubridge.routed_ops()["mapped"]
    npubridge.reset_stats()
    torch.testing.assert_close(torch.tan(x.to(npu)).cpu(), torch.tan(x))
    assert npubridge.stats()["aten::tan.out"]["fallbacks"] == 1
    assert native_calls() == {}


def test_unregister_op_restores_the_ops_own_kernel(npu):
    # exp is served through cann_like's exp.out; a mapping takes its place
    # and removing it gives exp its own kernel back.
    x = torch.tensor([-1.0, 0.0, 2.0])
    npubridge.register_op("aten::exp", "aten::relu")
    try:
        npubridge.reset_stats()
        assert torch.equal(torch.exp(x.to(npu)).cpu(), torch.relu(x))
        assert native_calls() == {"aten::relu": {"cann_like": 1}}
    finally:
        npubridge.unregister_op("aten::exp")
    npubridge.reset_stats()
    assert_matches(torch.exp(x.to(npu)), torch.exp, x)
    assert native_calls() == {"aten::exp.out": {"cann_like": 1}}


def test_a_mapping_replaced_at_run_time_changes_the_kernel_of_the_next_call(npu):
    # A functional op served through an .out op's out= tensor, then through
    # another op as it is.
    a = torch.tensor([1.0, 5.0, -3.0])
    npubridge.register_op("aten::tan", "aten::sin.out")
    try:
        npubridge.reset_stats()
        assert_matches(torch.tan(a.to(npu)), torch.sin, a)
        assert native_calls() == {"aten::sin.out": {"cann_like": 1}}
        npubridge.register_op("aten::tan", "aten::relu")
        npubridge.reset_stats()
        assert torch.equal(torch.tan(a.to(npu)).cpu(), torch.relu(a))
        assert native_calls() == {"aten::relu": {"cann_like": 1}}
    finally:
        npubridge.unregister_op("aten::tan")


@pytest.mark.parametrize("framework_op,target_op,message", [
    ("aten::tan", "aten::no_such_op", "unknown op 'aten::no_such_op': no plugin defines it"),
    ("aten::no_such_op", "aten::relu", "unknown op 'aten::no_such_op': PyTorch has no op of that name"),
    # The plugins' fused RMSNorm returns the inverse RMS too: not ATen's rms_norm.
    ("aten::rms_norm", "mindspeed_like::npu_rms_norm",
     "the schemas differ: aten::rms_norm passes 4 argument(s) and mindspeed_like::npu_rms_norm takes 3"),
    ("aten::tan", "aten::add.out",
     "the schemas differ: aten::tan passes 1 argument(s) and aten::add.out takes 3 before its out= tensor(s)"),
    ("aten::tan", "aten::embedding",
     "argument 1 ('Tensor indices') of aten::embedding has no default and aten::tan does not pass it"),
    ("aten::pow.Tensor_Scalar", "aten::embedding",
     "argument 1 is 'Scalar exponent' in aten::pow.Tensor_Scalar but 'Tensor indices' in aten::embedding"),
    ("aten::tan", "aten::relu_", "argument 0 ('self') is written by aten::relu_ but not by aten::tan"),
])
def test_a_mapping_that_does_not_fit_raises_naming_both_ops_and_changes_nothing(npu, framework_op, target_op, message):
    before = npubridge.op_map()
    with pytest.raises(ValueError, match=re.escape(f"cannot map '{framework_op}' to '{target_op}': ") + ".*" + re.escape(message)):
        npubridge.register_op(framework_op, target_op)
    assert npubridge.op_map() == before
    x = torch.tensor([0.5])
    torch.testing.assert_close(torch.tan(x.to(npu)).cpu(), torch.tan(x))


def test_a_mapping_to_a_plugin_without_a_kernel_of_the_target_and_unregistering_an_unmapped_op_raise():
    with pytest.raises(ValueError, match="cannot map 'aten::tan' to 'aten::relu': plugin 'vllm_like' has no kernel for 'aten::relu'"):
        npubridge.register_op("aten::tan", "aten::relu", "vllm_like")
    with pytest.raises(ValueError, match="cannot unmap 'aten::tan': the op-mapping table does not map it"):
        npubridge.unregister_op("aten::tan")


def test_npub_op_map_routes_its_aten_ops_at_import_and_drops_a_mapping_that_does_not_fit(tmp_path):
    table = tmp_path / "op_map.txt"
    table.write_text("aten::tan  aten::relu  cann_like\naten::cos  aten::embedding\n")
    script = textwrap.dedent("""
        import torch, npubridge
        print(npubridge.op_map())
        print(torch.tan(torch.tensor([-1.0, 2.0], device="npu")).cpu().tolist())
    """)
    env = dict(os.environ, NPUB_OP_MAP=str(table))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    table_now, tan = r.stdout.strip().splitlines()
    assert ("npubridge: op-mapping table: cannot map 'aten::cos' to 'aten::embedding': the schemas differ: argument 1 "
            "('Tensor indices') of aten::embedding has no default and aten::cos does not pass it") in r.stderr
    assert "the mapping is dropped" in r.stderr
    assert table_now == "[('aten::tan', 'aten::relu', 'cann_like')]"
    assert tan == "[0.0, 2.0]"


# The shipped table (registry/data/op_map.txt), each mapping against ATen's
# CPU kernel of the framework op.
def _sgn(npu):
    for x in (torch.tensor([-2.5, -0.0, 0.0, 3.0, float("nan"), float("-inf")]), torch.tensor([-3, 0, 7])):
        npubridge.reset_stats()
        torch.testing.assert_close(torch.sgn(x.to(npu)).cpu(), torch.sgn(x), equal_nan=True, rtol=0, atol=0)
        assert native_calls() == {"aten::sign.out": {"cann_like": 1}}


def _sgn_out(npu):
    x = torch.tensor([-2.5, 0.0, 3.0])
    out = torch.empty(3, device=npu)
    npubridge.reset_stats()
    torch.sgn(x.to(npu), out=out)
    assert torch.equal(out.cpu(), torch.sgn(x))
    assert native_calls() == {"aten::sign.out": {"cann_like": 1}}


def _hardtanh(npu):
    x = torch.tensor([-7.0, -1.0, -0.5, 0.0, 0.5, 2.0, 6.5, float("nan")])
    npubridge.reset_stats()
    assert_matches(torch.nn.functional.hardtanh(x.to(npu)), torch.nn.functional.hardtanh, x)
    assert_matches(torch.nn.functional.relu6(x.to(npu)), torch.nn.functional.relu6, x)
    assert_matches(torch.nn.Hardtanh(-2.0, 3.0)(x.to(npu)), torch.nn.Hardtanh(-2.0, 3.0), x)
    assert native_calls() == {"aten::clamp.out": {"cann_like": 3}}
    xi = torch.tensor([-9, 0, 4])
    assert torch.equal(torch.nn.functional.hardtanh(xi.to(npu), -2, 3).cpu(), torch.nn.functional.hardtanh(xi, -2, 3))
    with pytest.raises(RuntimeError, match="Bool inputs not supported for hardtanh"):
        torch.nn.functional.hardtanh(torch.tensor([True]).to(npu))
    # Its derivative is ATen's (hardtanh_backward), on the mapped forward.
    g = x[:-1].clone().requires_grad_()
    gn = x[:-1].to(npu).requires_grad_()
    torch.nn.functional.hardtanh(g).sum().backward()
    torch.nn.functional.hardtanh(gn).sum().backward()
    assert torch.equal(gn.grad.cpu(), g.grad)


def _hardtanh_out(npu):
    x = torch.tensor([-7.0, 0.25, 6.5])
    out = torch.empty(0, device=npu)
    npubridge.reset_stats()
    torch._C._nn.hardtanh(x.to(npu), -1.0, 1.0, out=out)
    assert torch.equal(out.cpu(), torch.nn.functional.hardtanh(x))
    assert native_calls() == {"aten::clamp.out": {"cann_like": 1}}


SHIPPED = {
    "aten::relu": None,  # relu by itself, cann_like's kernel first: tested in test_eager_ops.py
    "aten::sgn": _sgn,
    "aten::sgn.out": _sgn_out,
    "aten::hardtanh": _hardtanh,
    "aten::hardtanh.out": _hardtanh_out,
}


def test_every_shipped_mapping_is_routed_and_tested():
    assert {m[0] for m in npubridge.op_map()} == set(SHIPPED)
    mapped = {r.split(" -> ")[0] for r in npubridge.routed_ops()["mapped"]}
    assert mapped == set(SHIPPED)


@pytest.mark.parametrize("framework_op", [op for op, check in SHIPPED.items() if check is not None])
def test_a_shipped_mapping_computes_what_the_cpu_computes(npu, framework_op):
    SHIPPED[framework_op](npu)
