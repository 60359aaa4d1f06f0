"""vllm_like's layer ops (plugins/vllm_like/src: activation.cpp, layernorm.cpp,
rotary_embedding.cpp) on npu tensors: values against float64 references with
error bounds derived from each kernel's arithmetic (float32 compute, one
rounding to the dtype per stored value), in-place semantics, and the error
messages. The conformance samples are in
plugins/vllm_like/conformance/vllm_like_conformance.py."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import npubridge  # noqa: F401  (registers the npu backend)

ops = torch.ops.vllm_like
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
U32 = 2.0 ** -24  # float32's unit roundoff
PREFIX = "op 'vllm_like::{op}' failed in the kernel of plugin 'vllm_like': vllm_like::{op}: "


def u(dtype):
    return torch.finfo(dtype).eps / 2


def tiny(dtype):
    return torch.finfo(dtype).tiny  # absolute slack for results that underflow


def kernel_error(op, message, cls=RuntimeError):
    return pytest.raises(cls, match="^" + re.escape(PREFIX.format(op=op) + message) + "$")


def assert_within(got, exact, bound, what):
    err = (got.detach().cpu().double() - exact).abs()
    excess = (err - bound).flatten()
    worst = int(excess.argmax())
    assert excess[worst] <= 0, (f"{what}: {int((excess > 0).sum())} elements beyond the bound, the worst error "
                                f"{float(err.flatten()[worst]):.3g} (bound {float(bound.flatten()[worst]):.3g}) "
                                f"at flat index {worst}")


# --- silu_and_mul, gelu_and_mul, gelu_tanh_and_mul ---
# out = round(act(a) * b), act in float32: a few roundings (8 u32) plus the
# activation's condition number |x act'(x) / act(x)| times its argument's
# rounding, then one rounding to the dtype.

def _silu_cond(x):
    return x.abs()  # x sigmoid(x): 1 + |x| (1 - sigmoid(x)) at most


def _gelu_cond(x):
    # erfc(z) at z = -x / sqrt 2: |z erfc'(z) / erfc(z)| = 2 z^2 + 1 = x^2 + 1 times z's relative error (2 u:
    # 1 / sqrt 2 rounded, the product rounded), z^2 for the rounding of e^(-z^2)'s argument, and 8 for the
    # fitted e^(z^2) erfc(z) and the exp
    return 2.5 * x * x + 10


def _gelu_tanh_cond(x):
    return 4 * 1.5957691216057308 * (x.abs() + 0.044715 * x.abs() ** 3)  # sigmoid(2u), 2u's own roundings


def _gelu(x):
    # x Phi(x) through erfc: ATen's 0.5 x (1 + erf(x / sqrt 2)) cancels to 0 below x = -8.3 even in float64
    return 0.5 * x * torch.special.erfc(-x / math.sqrt(2))


def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) as x sigmoid(2u), the same function (1 + tanh(u) = 2 sigmoid(2u)) without the
    # cancellation for negative x that makes F.gelu(approximate="tanh") 0 there even in float64
    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))


ACTIVATIONS = {
    "silu_and_mul": (F.silu, _silu_cond),
    "gelu_and_mul": (_gelu, _gelu_cond),
    "gelu_tanh_and_mul": (_gelu_tanh, _gelu_tanh_cond),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_and_mul_values(op, dtype):
    act, cond = ACTIVATIONS[op]
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(3, 5, 2 * 96, generator=g)).to(dtype)
    x[0, 0, :8] = torch.tensor([-12.0, -6.0, -3.0, -1e-3, 0.0, 1e-3, 6.0, 12.0])  # tails, signed zeros
    x[1, :, :96] = torch.linspace(-13, 13, 5 * 96).reshape(5, 96)  # gates over the whole range
    out = torch.full((3, 5, 96), float("nan"), dtype=dtype, device="npu")
    ptr = out.data_ptr()
    getattr(ops, op)(out, x.npu())
    assert out.data_ptr() == ptr
    a, b = x[..., :96].double(), x[..., 96:].double()
    exact = act(a) * b
    # + the sigmoid's e^-|v| flushed to 0 below float32's smallest normal (an absolute error of that, times |a b|)
    bound = exact.abs() * (u(dtype) + (8 + cond(a)) * U32) + (a * b).abs() * tiny(torch.float32) + tiny(dtype)
    assert_within(out, exact, bound, op)


@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_activation_and_mul_errors(op):
    with kernel_error(op, "input: expected an even last dimension but found shape [4, 5]"):
        getattr(ops, op)(torch.empty(4, 2, device="npu"), torch.randn(4, 5, device="npu"))
    with kernel_error(op, "out: expected shape [4, 3] but found [4, 4]"):
        getattr(ops, op)(torch.empty(4, 4, device="npu"), torch.randn(4, 6, device="npu"))
    # the meta function rejects what the kernel rejects
    with pytest.raises(RuntimeError, match=re.escape(f"{op}' (plugin 'vllm_like'): out: expected shape [4, 3]")):
        getattr(ops, op)(torch.empty(4, 4, device="meta"), torch.empty(4, 6, device="meta"))


# --- rms_norm, fused_add_rms_norm ---
# rstd from a float32 sum of n squares (relative error at most (n - 1) u32,
# half of it through the square root, 2 more for the sqrt and the division),
# h * rstd rounded to the dtype, times the weight rounded again.

def _rms_exact(h, w, eps):
    hd = h.double()
    return hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _rms_bound(exact, n, dtype):
    gamma = (n / 2 + 3) * U32
    return exact.abs() * (gamma + 2.01 * u(dtype)) + 2 * tiny(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 128), (1, 4096)], ids=str)
def test_rms_norm_values(shape, dtype):
    g = torch.Generator().manual_seed(2)
    x = (4 * torch.randn(*shape, generator=g)).to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype)
    out = torch.empty(*shape, dtype=dtype, device="npu")
    xn = x.npu()
    ops.rms_norm(out, xn, w.npu(), 1e-5)
    exact = _rms_exact(x, w, 1e-5)
    assert_within(out, exact, _rms_bound(exact, shape[-1], dtype), "rms_norm")
    assert torch.equal(xn.cpu(), x)  # input is not written
    # out = input: the same values, in the input's memory
    ptr = xn.data_ptr()
    ops.rms_norm(xn, xn, w.npu(), 1e-5)
    assert xn.data_ptr() == ptr and torch.equal(xn.cpu(), out.cpu())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 128), (1, 4096)], ids=str)
def test_fused_add_rms_norm_values(shape, dtype):
    g = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(*shape, generator=g)).to(dtype)
    r = (2 * torch.randn(*shape, generator=g)).to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype)
    xn, rn = x.npu(), r.npu()
    pointers = xn.data_ptr(), rn.data_ptr()
    ops.fused_add_rms_norm(xn, rn, w.npu(), 1e-6)
    assert (xn.data_ptr(), rn.data_ptr()) == pointers
    s = x + r  # ATen's sum in the dtype: float32 add, one rounding, as the kernel's
    assert torch.equal(rn.cpu(), s)
    exact = _rms_exact(s, w, 1e-6)
    assert_within(xn, exact, _rms_bound(exact, shape[-1], dtype), "fused_add_rms_norm input")
    # the same as rms_norm of the new residual
    out = torch.empty_like(rn)
    ops.rms_norm(out, rn, w.npu(), 1e-6)
    assert torch.equal(out.cpu(), xn.cpu())


def test_norms_write_through_strided_views():
    # contiguous_only: the host copies a strided written tensor in and the result back out
    base = torch.randn(6, 2, 32)
    w = torch.randn(32)
    bn = base.npu()
    x, r = bn[:, 0], bn[:, 1]
    ops.fused_add_rms_norm(x, r, w.npu(), 1e-6)
    s = base[:, 0] + base[:, 1]
    assert torch.equal(bn[:, 1].cpu(), s)
    exact = _rms_exact(s, w, 1e-6)
    assert_within(bn[:, 0], exact, _rms_bound(exact, 32, torch.float32), "strided input")


def test_norm_errors():
    x, w = torch.randn(4, 8, device="npu"), torch.randn(8, device="npu")
    with kernel_error("rms_norm", "weight: expected shape [8] (the last dimension of input [4, 8]) but found [4]"):
        ops.rms_norm(torch.empty_like(x), x, w[:4], 1e-6)
    with kernel_error("rms_norm", "out: expected the shape of input [4, 8] but found [4, 7]"):
        ops.rms_norm(torch.empty(4, 7, device="npu"), x, w, 1e-6)
    with kernel_error("fused_add_rms_norm", "residual: expected the shape of input [4, 8] but found [8]"):
        ops.fused_add_rms_norm(x, w.clone(), w, 1e-6)
    with pytest.raises(RuntimeError, match=re.escape("fused_add_rms_norm' (plugin 'vllm_like'): weight: expected "
                                                     "shape [8]")):
        ops.fused_add_rms_norm(torch.empty(4, 8, device="meta"), torch.empty(4, 8, device="meta"),
                               torch.empty(3, device="meta"), 1e-6)
    # input and residual the same tensor: two written arguments sharing memory
    with pytest.raises(RuntimeError, match="fused_add_rms_norm' cannot run on the npu: tensors it writes share memory"):
        ops.fused_add_rms_norm(x, x, w, 1e-6)
    with pytest.raises(RuntimeError, match="rms_norm' cannot run on the npu: tensors it writes share memory"):
        y = torch.randn(4, 9, device="npu")
        ops.rms_norm(y[:, 1:], y[:, :8], w, 1e-6)


# --- rotary_embedding ---

def _cache(max_position, rot_dim, dtype):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    f = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    return torch.cat([f.cos(), f.sin()], -1).to(dtype)


def _rotary_exact(x, positions, head_size, cache, is_neox):
    """From the formula, in float64, head by head and pair by pair; returns
    (the expected values, and per element the |x c| + |y s| (|y c| + |x s|) that bounds the float32 products
    and difference's roundings)."""
    rot_dim = cache.shape[1]
    half = rot_dim // 2
    h = x.double().reshape(positions.numel(), -1, head_size).clone()
    scale = torch.zeros_like(h)
    for t, p in enumerate(positions.flatten().tolist()):
        c, s = cache[p, :half].double(), cache[p, half:].double()
        idx = torch.arange(half)
        xi, yi = (idx, idx + half) if is_neox else (2 * idx, 2 * idx + 1)
        a, b = h[t][:, xi].clone(), h[t][:, yi].clone()
        h[t][:, xi], h[t][:, yi] = a * c - b * s, b * c + a * s
        scale[t][:, xi] = a.abs() * c.abs() + b.abs() * s.abs()
        scale[t][:, yi] = b.abs() * c.abs() + a.abs() * s.abs()
    return h.reshape(x.shape), scale.reshape(x.shape)


def _check_rotary(got, x, positions, head_size, cache, is_neox, what):
    exact, scale = _rotary_exact(x, positions, head_size, cache, is_neox)
    bound = 2.01 * U32 * scale + u(x.dtype) * exact.abs() + tiny(x.dtype)
    assert_within(got, exact, bound, what)
    rot_dim = cache.shape[1]
    per_head = got.detach().cpu().reshape(positions.numel(), -1, head_size)
    assert torch.equal(per_head[..., rot_dim:], x.reshape(per_head.shape)[..., rot_dim:]), f"{what}: unrotated dims"


@pytest.mark.parametrize("cache_dtype", ["query's", "float32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rotary_embedding_values(is_neox, dtype, cache_dtype):
    g = torch.Generator().manual_seed(4)
    T, H, KV, D, R = 11, 4, 2, 32, 24  # GQA key, partial rotary
    cache = _cache(100, R, dtype if cache_dtype == "query's" else torch.float32)
    positions = torch.randint(0, 100, (T,), generator=g)
    q = torch.randn(T, H * D, generator=g).to(dtype)
    k = torch.randn(T, KV, D, generator=g).to(dtype)
    qn, kn = q.npu(), k.npu()
    pointers = qn.data_ptr(), kn.data_ptr()
    ops.rotary_embedding(positions.npu(), qn, kn, D, cache.npu(), is_neox)
    assert (qn.data_ptr(), kn.data_ptr()) == pointers
    _check_rotary(qn, q, positions, D, cache, is_neox, "query")
    _check_rotary(kn, k, positions, D, cache, is_neox, "key")


def test_rotary_embedding_shapes_and_views():
    g = torch.Generator().manual_seed(5)
    D, cache = 16, _cache(32, 16, torch.float32)
    # [batch, seq] positions (int32), query [B, S, H, D], key None
    positions = torch.randint(0, 32, (2, 3), generator=g, dtype=torch.int32)
    q = torch.randn(2, 3, 2, D, generator=g)
    qn = q.npu()
    ops.rotary_embedding(positions.npu(), qn, None, D, cache.npu(), True)
    _check_rotary(qn, q, positions, D, cache, True, "query [2, 3, 2, 16]")
    # query and key as column slices of one qkv projection, as vLLM splits it: written in place
    qkv = torch.randn(5, (4 + 2 + 2) * D, generator=g)
    positions = torch.randint(0, 32, (5,), generator=g)
    qkvn = qkv.npu()
    qv, kv, vv = qkvn.split([4 * D, 2 * D, 2 * D], dim=-1)
    ops.rotary_embedding(positions.npu(), qv, kv, D, cache.npu(), False)
    got = qkvn.cpu()
    _check_rotary(got[:, :4 * D], qkv[:, :4 * D], positions, D, cache, False, "query slice")
    _check_rotary(got[:, 4 * D:6 * D], qkv[:, 4 * D:6 * D], positions, D, cache, False, "key slice")
    assert torch.equal(got[:, 6 * D:], qkv[:, 6 * D:])  # value untouched
    # no tokens
    ops.rotary_embedding(torch.empty(0, dtype=torch.long, device="npu"), torch.empty(0, 2 * D, device="npu"), None,
                         D, cache.npu(), True)


def test_rotary_embedding_errors():
    D, cache = 16, _cache(8, 16, torch.float32).npu()
    q, k = torch.randn(4, 2 * D, device="npu"), torch.randn(4, D, device="npu")
    before = q.cpu(), k.cpu()
    with kernel_error("rotary_embedding", "positions: expected positions in [0, 8) (the rows of cos_sin_cache) but "
                      "found 8 at token 2", IndexError):
        ops.rotary_embedding(torch.tensor([0, 7, 8, 1], device="npu"), q, k, D, cache, True)
    with kernel_error("rotary_embedding", "positions: expected positions in [0, 8) (the rows of cos_sin_cache) but "
                      "found -1 at token 0", IndexError):
        ops.rotary_embedding(torch.tensor([-1, 0, 0, 0], dtype=torch.int32, device="npu"), q, k, D, cache, True)
    assert torch.equal(q.cpu(), before[0]) and torch.equal(k.cpu(), before[1])  # nothing written
    pos = torch.zeros(4, dtype=torch.long, device="npu")
    with kernel_error("rotary_embedding", "cos_sin_cache: expected an even rot_dim (size 1) in [2, head_size 8] but "
                      "found shape [8, 16]"):
        ops.rotary_embedding(pos, q, None, 8, cache, True)
    with kernel_error("rotary_embedding", "query: expected a multiple of head_size 16 values per token but found 24 "
                      "(shape [4, 24])"):
        ops.rotary_embedding(pos, q[:, :24], None, D, cache, True)
    with kernel_error("rotary_embedding", "key: expected the leading shape of positions [4] followed by heads * "
                      "head_size values but found [3, 16]"):
        ops.rotary_embedding(pos, q, k[:3], D, cache, True)
    with kernel_error("rotary_embedding", "key: expected the dtype of query (float32) but found bfloat16"):
        ops.rotary_embedding(pos, q, k.bfloat16(), D, cache, True)
    with kernel_error("rotary_embedding", "cos_sin_cache: expected the dtype of query (bfloat16) or float32 but "
                      "found float16"):
        ops.rotary_embedding(pos, q.bfloat16(), None, D, cache.half(), True)
    with pytest.raises(RuntimeError, match=re.escape("rotary_embedding' (plugin 'vllm_like'): key: expected the "
                                                     "leading shape")):
        ops.rotary_embedding(torch.empty(4, dtype=torch.long, device="meta"), torch.empty(4, 32, device="meta"),
                             torch.empty(3, 16, device="meta"), D, torch.empty(8, 16, device="meta"), True)


@pytest.mark.parametrize("with_key", [True, False], ids=["key", "no key"])
def test_rotary_embedding_opcheck(with_key):
    # PyTorch's checker: the schema (query and key written, key optional), fake tensors and AOT dispatch.
    args = (torch.randint(0, 8, (4,)).npu(), torch.randn(4, 32).npu(), torch.randn(4, 16).npu() if with_key else None,
            16, _cache(8, 16, torch.float32).npu(), True)
    r = torch.library.opcheck(ops.rotary_embedding.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert set(r.values()) == {"SUCCESS"}, r


def test_norm_and_activation_opcheck():
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    x, w = torch.randn(4, 8).npu(), torch.randn(8).npu()
    for op, args in ((ops.rms_norm, (torch.empty(4, 8).npu(), x, w, 1e-6)),
                     (ops.fused_add_rms_norm, (x.clone(), x.clone() + 1, w, 1e-6)),
                     (ops.gelu_and_mul, (torch.empty(4, 4).npu(), x)),
                     (ops.gelu_tanh_and_mul, (torch.empty(4, 4).npu(), x))):
        r = torch.library.opcheck(op.default, args, test_utils=utils)
        assert set(r.values()) == {"SUCCESS"}, (op, r)
