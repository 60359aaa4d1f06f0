"""Complex tensors, and tensors with the lazy conjugate or negative bit
(x.conj(), x.conj().imag), on npu against the CPU (Note [Copies resolve the
conjugate and negative bits], minimal.cpp): plugins see bytes, so such
calls run on the CPU, and the copies there and back resolve the bits.
Conjugation, negation and copies are exact; the FFTs are judged by the
error model against complex128."""
import pytest
import torch

import npubridge  # noqa: F401  (registers the npu device)
from conftest import assert_judged


def cplx(d, *shape, dtype=torch.complex64):
    g = torch.Generator().manual_seed(sum(shape) + 3)
    return torch.randn(shape, dtype=dtype, generator=g).to(d)


def real(d, *shape):
    g = torch.Generator().manual_seed(sum(shape) + 5)
    return torch.randint(-4, 5, shape, generator=g).float().to(d)


BIT_OPS = {
    "conj": lambda d: cplx(d, 3).conj(),
    "conj().resolve_conj()": lambda d: cplx(d, 3).conj().resolve_conj(),
    "conj_physical": lambda d: torch.conj_physical(cplx(d, 2, 3)),
    "conj of a transposed view, resolved": lambda d: cplx(d, 2, 3).t().conj().resolve_conj(),
    "conj().imag (negative bit)": lambda d: cplx(d, 4).conj().imag,
    "conj().imag.resolve_neg()": lambda d: cplx(d, 4).conj().imag.resolve_neg(),
    "_neg_view().resolve_neg()": lambda d: torch._neg_view(real(d, 4)).resolve_neg(),
    "conj().clone()": lambda d: cplx(d, 3).conj().clone(),
    "conj() * 2": lambda d: cplx(d, 3).conj() * 2,
    "conj() + x": lambda d: (lambda x: x.conj() + x)(cplx(d, 3)),
    "copy_ of conj() into a plain tensor": lambda d: torch.empty(3, dtype=torch.complex64, device=d).copy_(cplx(d, 3).conj()),
    "copy_ into a conj() view": lambda d: (lambda z: (z.conj().copy_(cplx(d, 3)), z)[1])(torch.zeros(3, dtype=torch.complex64, device=d)),
    "conj() to complex128": lambda d: cplx(d, 3).conj().to(torch.complex128),
    "complex64 to complex128": lambda d: cplx(d, 3).to(torch.complex128),
    "float to complex": lambda d: real(d, 3).to(torch.complex64),
    "mm with a negative-bit operand": lambda d: torch.mm(real(d, 2, 3), cplx(d, 3, 2).conj().imag.round()),
    "neg-bit operand of add": lambda d: real(d, 4) + torch._neg_view(real(d, 4)),
    "conj_physical_ in place": lambda d: (lambda z: (z.conj_physical_(), z)[1])(cplx(d, 3)),
    "resolve_conj of a plain tensor": lambda d: cplx(d, 3).resolve_conj(),
}


@pytest.mark.parametrize("name", list(BIT_OPS))
def test_conjugate_and_negative_bits_as_on_the_cpu(name):
    got = BIT_OPS[name]("npu")
    want = BIT_OPS[name]("cpu")
    assert got.device.type == "npu"
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.is_conj() == want.is_conj() and got.is_neg() == want.is_neg(), name
    assert torch.equal(got.cpu().resolve_conj().resolve_neg(), want.resolve_conj().resolve_neg()), name


FFTS = {
    "fft.fft": lambda x: torch.fft.fft(x),
    "fft.ifft": lambda x: torch.fft.ifft(x),
    "fft.rfft": lambda x: torch.fft.rfft(x.real),
    "fft.irfft": lambda x: torch.fft.irfft(x),
    "fft.fftn": lambda x: torch.fft.fftn(x),
    "fft.ifftn": lambda x: torch.fft.ifftn(x),
    "fft.fft of conj()": lambda x: torch.fft.fft(x.conj()),
    "fft.ifft of conj()": lambda x: torch.fft.ifft(x.conj()),
}


def as_real(t):
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


@pytest.mark.parametrize("name", list(FFTS))
def test_fft_as_on_the_cpu(name):
    x = cplx("cpu", 4, 6)
    got = FFTS[name](x.npu())
    host = FFTS[name](x)
    wide = FFTS[name](x.to(torch.complex128))
    assert got.device.type == "npu" and got.dtype == host.dtype
    assert_judged(as_real(got.cpu()), as_real(host), as_real(wide), name)


def test_printing_a_conjugated_tensor():
    x = cplx("cpu", 3)
    assert repr(x.npu().conj().cpu()) == repr(x.conj())
    assert "npu:0" in repr(x.npu().conj())


def test_a_gradient_through_conj():
    x = cplx("cpu", 3)
    grads = []
    for t in (x.npu(), x, x.to(torch.complex128)):
        t.requires_grad_()
        (t.conj() * t * t.conj().imag).real.sum().backward()
        grads.append(as_real(t.grad.cpu()))
    assert_judged(*grads, "grad")
