"""Quantized tensors on npu (Note [Quantized tensors stay on the CPU],
python_ext/csrc/aten/fallback.cpp): refused with a clear error naming the op
and the argument, before anything runs; the CPU's quantized ops are
unaffected."""
import pytest
import torch

import npubridge  # noqa: F401

PREFIX = "npubridge: quantized tensors are not supported on npu: op "
ADVICE = "; quantize on the CPU instead (move the tensor with .cpu())"


def test_quantize_per_tensor_of_an_npu_tensor_names_the_op_and_the_dtype():
    x = torch.randn(4, device="npu")
    with pytest.raises(NotImplementedError) as e:
        torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
    assert str(e.value).splitlines()[0] == (
        PREFIX + "'aten::quantize_per_tensor' was called with argument 'dtype' = QUInt8" + ADVICE)


@pytest.mark.parametrize("call, what", [
    (lambda x: torch.quantize_per_tensor(x, 0.5, 3, torch.qint8),
     "'aten::quantize_per_tensor' was called with argument 'dtype' = QInt8"),
    (lambda x: torch.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(0), torch.qint32),
     "'aten::quantize_per_tensor.tensor_qparams' was called with argument 'dtype' = QInt32"),
    (lambda x: torch.quantize_per_channel(x.reshape(2, 2), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0,
                                          torch.quint8),
     "'aten::quantize_per_channel' was called with argument 'dtype' = QUInt8"),
    (lambda x: torch.quantize_per_tensor_dynamic(x, torch.quint8, False),
     "'aten::quantize_per_tensor_dynamic' was called with argument 'dtype' = QUInt8"),
    # Straight to the QuantizedPrivateUse1 key: no CPU fallback is involved.
    (lambda x: torch._empty_affine_quantized([2], scale=0.1, zero_point=0, dtype=torch.quint8, device=x.device),
     "'aten::_empty_affine_quantized' would make a quantized tensor on npu"),
    (lambda x: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8).to(x.device),
     "'aten::empty_quantized' would make a quantized tensor on npu"),
])
def test_other_quantizing_ops_and_moving_a_quantized_tensor_are_refused_naming_the_op(call, what):
    x = torch.randn(4, device="npu")
    with pytest.raises(NotImplementedError) as e:
        call(x)
    assert str(e.value).splitlines()[0] == PREFIX + what + ADVICE


def test_the_cpus_quantized_ops_are_unaffected():
    x = torch.tensor([0.0, 0.1, 0.26, -0.3])
    q = torch.quantize_per_tensor(x, 0.1, 10, torch.quint8)
    assert q.is_quantized
    assert q.int_repr().tolist() == [10, 11, 13, 7]
    # And npu work on the dequantized values is ordinary npu work.
    assert torch.equal((q.dequantize().to("npu") * 10).cpu(), q.dequantize() * 10)
