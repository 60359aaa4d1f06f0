"""npubridge.testing samples and references of vllm_like's ops
(plugins/vllm_like), for `python3 -m npubridge conformance --plugin
libnpub_vllm_like.so --tests this file` (CTest conformance.torch.vllm_like)."""
import torch
import torch.nn.functional as F

from npubridge import testing


@testing.reference("vllm_like::silu_and_mul")
def silu_and_mul(out, x):
    # Returns nothing and writes out: the reference gives out's expected value.
    if x.shape[-1] % 2 != 0:
        raise ValueError("input's last dimension must be even")
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@testing.samples("vllm_like::silu_and_mul")
def silu_and_mul_samples(dtype):
    for shape in ((4, 32), (2, 3, 64), (1, 2), (0, 8), (128, 512)):
        out = torch.empty(*shape[:-1], shape[-1] // 2, dtype=dtype)
        yield testing.Sample(out, torch.randn(*shape, dtype=dtype), name=str(list(shape)))
    yield testing.Sample(torch.empty(4, 2, dtype=dtype), torch.randn(4, 5, dtype=dtype), name="odd last dim (error)")


# --- vllm_like's layer ops other than silu_and_mul (activation.cpp, layernorm.cpp, rotary_embedding.cpp) ---

_ACT_SHAPES = ((4, 32), (2, 3, 64), (1, 2), (0, 8), (128, 512))


def _act_and_mul(act):
    def reference(out, x):
        if x.shape[-1] % 2 != 0:
            raise ValueError("input's last dimension must be even")
        d = x.shape[-1] // 2
        return act(x[..., :d]) * x[..., d:]
    return reference


def _act_and_mul_samples(dtype):
    for shape in _ACT_SHAPES:
        out = torch.empty(*shape[:-1], shape[-1] // 2, dtype=dtype)
        yield testing.Sample(out, torch.randn(*shape, dtype=dtype), name=str(list(shape)))
    # the tails: large negative gates (where 1 + erf(x) would cancel) and large positive ones
    gate = torch.tensor([-12.0, -6.0, -3.5, -1e-3, 0.0, 1e-3, 3.5, 12.0], dtype=dtype)
    yield testing.Sample(torch.empty(8, dtype=dtype), torch.cat([gate, torch.randn(8, dtype=dtype)]), name="tails")
    yield testing.Sample(torch.empty(4, 2, dtype=dtype), torch.randn(4, 5, dtype=dtype), name="odd last dim (error)")


# x Phi(x) through erfc, not F.gelu's 0.5 x (1 + erf(x / sqrt 2)), which cancels to 0 below x = -8.3 even in
# the float64 run
testing.reference("vllm_like::gelu_and_mul")(_act_and_mul(lambda x: 0.5 * x * torch.special.erfc(-x * 0.5 ** 0.5)))
testing.samples("vllm_like::gelu_and_mul")(_act_and_mul_samples)
# 0.5 x (1 + tanh(u)) as x sigmoid(2u), the same function without the cancellation for negative x
testing.reference("vllm_like::gelu_tanh_and_mul")(
    _act_and_mul(lambda x: x * torch.sigmoid(1.5957691216057308 * (x + 0.044715 * x ** 3))))
testing.samples("vllm_like::gelu_tanh_and_mul")(_act_and_mul_samples)

_NORM_SHAPES = ((4, 16), (2, 3, 64), (5, 7), (0, 8), (64, 2048))


def _rms(h, weight, epsilon):
    # HF's LlamaRMSNorm, which vLLM follows: the variance in float32 (float64 in the float64 run), h * rstd
    # rounded to the dtype, then times the weight.
    if h.dim() < 1 or weight.shape != h.shape[-1:] or weight.dtype != h.dtype:
        raise ValueError("weight: expected [hidden] in the dtype of input")
    wide = torch.float64 if h.dtype == torch.float64 else torch.float32
    hw = h.to(wide)
    rstd = torch.rsqrt(hw.pow(2).mean(-1, keepdim=True) + epsilon)
    return (hw * rstd).to(h.dtype) * weight


@testing.reference("vllm_like::rms_norm")
def rms_norm(out, x, weight, epsilon):
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError("out: expected the shape and dtype of input")
    return _rms(x, weight, epsilon)


@testing.samples("vllm_like::rms_norm")
def rms_norm_samples(dtype):
    for i, shape in enumerate(_NORM_SHAPES):
        yield testing.Sample(torch.empty(*shape, dtype=dtype), 3 * torch.randn(*shape, dtype=dtype),
                             torch.randn(shape[-1], dtype=dtype), 1e-6 if i % 2 else 1e-5, name=str(list(shape)))
    yield testing.Sample(torch.empty(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype), torch.randn(4, dtype=dtype),
                         1e-6, name="weight of another size (error)")
    yield testing.Sample(torch.empty(4, 7, dtype=dtype), torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype),
                         1e-6, name="out of another shape (error)")


@testing.reference("vllm_like::fused_add_rms_norm")
def fused_add_rms_norm(x, residual, weight, epsilon):
    # The written arguments' expected values, in schema order: input, then residual.
    if residual.shape != x.shape:
        raise ValueError("residual: expected the shape of input")
    s = x + residual  # rounded to the dtype, as vLLM's kernel keeps it
    return _rms(s, weight, epsilon), s


@testing.samples("vllm_like::fused_add_rms_norm")
def fused_add_rms_norm_samples(dtype):
    for i, shape in enumerate(_NORM_SHAPES):
        yield testing.Sample(torch.randn(*shape, dtype=dtype), 2 * torch.randn(*shape, dtype=dtype),
                             torch.randn(shape[-1], dtype=dtype), 1e-6 if i % 2 else 1e-5, name=str(list(shape)))
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(4, 8, dtype=dtype), torch.randn(7, dtype=dtype),
                         1e-6, name="weight of another size (error)")
    yield testing.Sample(torch.randn(4, 8, dtype=dtype), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype),
                         1e-6, name="residual of another shape (error)")


def _rotate(x, head_size, cos, sin, is_neox, rot_dim, lead):
    # x [*lead, heads * head_size] (or [*lead, heads, head_size]); cos/sin [*lead, rot_dim / 2]
    if x.numel() % max(1, lead.numel() * head_size) != 0 or x.shape[:lead.dim()] != lead.shape:
        raise ValueError("expected the leading shape of positions and heads * head_size values per token")
    h = x.reshape(*lead.shape, -1, head_size)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # over the heads
    half = rot_dim // 2
    if is_neox:
        a, b = h[..., :half], h[..., half:rot_dim]
    else:
        a, b = h[..., 0:rot_dim:2], h[..., 1:rot_dim:2]
    ra, rb = a * c - b * s, b * c + a * s
    if is_neox:
        rot = torch.cat([ra, rb], -1)
    else:
        rot = torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([rot, h[..., rot_dim:]], -1).to(x.dtype).reshape(x.shape)


@testing.reference("vllm_like::rotary_embedding")
def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    # From the formula: per token at position p, pairs (x, y) of the first rot_dim dims of each head,
    # x' = x cos - y sin, y' = y cos + x sin, with cos/sin from row p of cat(cos, sin).
    if positions.dim() not in (1, 2) or cos_sin_cache.dim() != 2:
        raise ValueError("positions: [num_tokens] or [batch, seq]; cos_sin_cache: [max_position, rot_dim]")
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim < 2 or rot_dim % 2 or rot_dim > head_size:
        raise ValueError("rot_dim: expected even, in [2, head_size]")
    if cos_sin_cache.dtype not in (query.dtype, torch.float32, torch.float64):
        raise ValueError("cos_sin_cache: expected the dtype of query or float32")
    if key is not None and key.dtype != query.dtype:
        raise ValueError("key: expected the dtype of query")
    if positions.numel() and (positions.min() < 0 or positions.max() >= cos_sin_cache.shape[0]):
        raise IndexError("positions: out of the cache's range")
    row = cos_sin_cache[positions.long()]
    cos, sin = row[..., :rot_dim // 2], row[..., rot_dim // 2:]
    out = [_rotate(query, head_size, cos, sin, is_neox, rot_dim, positions)]
    if key is not None:
        out.append(_rotate(key, head_size, cos, sin, is_neox, rot_dim, positions))
    return out


def _cos_sin_cache(max_position, rot_dim, dtype, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], -1).to(dtype)


@testing.samples("vllm_like::rotary_embedding")
def rotary_embedding_samples(dtype):
    # The kernel's dispatch dtype is positions' (its first tensor argument): each cell (int64, int32) runs
    # queries of all three float dtypes, a cache of the query's dtype or float32, both styles, partial rotary,
    # GQA-sized and absent keys.
    f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
    other = {torch.int64: 0, torch.int32: 1}[dtype]

    def pos(*shape, max_position=64):
        return torch.randint(0, max_position, shape, dtype=dtype)

    def case(qdt, cdt, lead, heads, kv_heads, head_size, rot_dim, is_neox, split_heads=False, max_position=64):
        per = (heads, head_size) if split_heads else (heads * head_size,)
        kper = (kv_heads, head_size) if split_heads else (kv_heads * head_size,)
        q = torch.randn(*lead, *per, dtype=qdt)
        k = torch.randn(*lead, *kper, dtype=qdt) if kv_heads else None
        return (pos(*lead, max_position=max_position), q, k, head_size,
                _cos_sin_cache(max_position, rot_dim, cdt), is_neox)

    dts = (f32, f16, bf16) if other == 0 else (bf16, f32, f16)
    yield testing.Sample(*case(dts[0], dts[0], (7,), 4, 4, 16, 16, True), name=f"{dts[0]} neox [7, 64]")
    yield testing.Sample(*case(dts[1], dts[1], (5,), 4, 2, 16, 8, False, split_heads=True),
                         name=f"{dts[1]} gpt-j partial rotary 8/16, GQA key [5, 2, 16]")
    yield testing.Sample(*case(dts[2], dts[2], (2, 3), 2, 0, 32, 32, True),
                         name=f"{dts[2]} neox positions [2, 3], key None")
    yield testing.Sample(*case(dts[0], f32, (9,), 8, 2, 64, 64, True, max_position=128),
                         name=f"{dts[0]} neox Llama-like heads 8/2 x 64, float32 cache")
    yield testing.Sample(*case(dts[1], f32, (2, 4), 2, 1, 16, 12, False, split_heads=True),
                         name=f"{dts[1]} gpt-j partial 12/16 positions [2, 4], float32 cache")
    bad = list(case(dts[2], dts[2], (4,), 2, 2, 16, 16, True, max_position=8))
    bad[0] = torch.tensor([0, 3, 8, 1], dtype=dtype) if other == 0 else torch.tensor([0, -1, 2, 1], dtype=dtype)
    yield testing.Sample(*bad, name="position out of the cache (error)")
    bad = list(case(dts[0], dts[0], (4,), 2, 2, 16, 16, True))
    if other == 0:
        bad[4] = _cos_sin_cache(64, 32, dts[0])
        yield testing.Sample(*bad, name="rot_dim above head_size (error)")
    else:
        bad[1] = torch.randn(4, 2 * 16 + 3, dtype=dts[0])
        yield testing.Sample(*bad, name="query not a multiple of head_size (error)")
    bad = list(case(f16, f16, (4,), 2, 2, 16, 16, False))
    if other == 0:
        bad[4] = _cos_sin_cache(64, 16, bf16)
        yield testing.Sample(*bad, name="float16 query, bfloat16 cache (error)")
    else:
        bad[2] = bad[2].to(bf16)
        yield testing.Sample(*bad, name="key of another dtype than query (error)")
