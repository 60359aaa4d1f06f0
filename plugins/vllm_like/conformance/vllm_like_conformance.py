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

# ---------------------------------------------------------------------------
# paged_attention_v1 / v2 (plugins/vllm_like/src/paged_attention*.cpp) and the cache ops
# (plugins/vllm_like/src/cache_ops.cpp). References: the paged cache gathered
# into contiguous K/V through the block table, attention computed in float64
# for the float64 run (the value judged against) and in float32 for the
# sample's dtype (the op accumulates in float32 for every dtype: that run's
# error is the allowance); what the op stores in a narrower dtype (v2's
# tmp_out) rounded there, as the op does. The float64 run sees float64
# caches, so the layout's x = 16 / element_size is checked in the sample's
# own dtype only.

_PARTITION = 512


def _x_of(dtype):
    return 16 // torch.empty((), dtype=dtype).element_size()


def _check_kv_dtype(kv_cache_dtype, k_scale, v_scale):
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype: only 'auto' is supported, found {kv_cache_dtype!r}")
    if k_scale != 1.0 or v_scale != 1.0:
        raise ValueError("k_scale, v_scale: expected 1.0")


def _check_legacy_layout(key_cache, value_cache):
    if key_cache.dim() != 5 or value_cache.dim() != 4:
        raise ValueError("expected a 5-d key_cache and a 4-d value_cache")
    nb, kvh, dx, bs, x = key_cache.shape
    if key_cache.dtype != torch.float64 and x != _x_of(key_cache.dtype):
        raise ValueError(f"key_cache: x = {x}, expected 16 / element_size")
    if tuple(value_cache.shape) != (nb, kvh, dx * x, bs, ):
        raise ValueError("value_cache: shape does not match key_cache's")
    return nb, kvh, dx * x, bs, x


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _gather(key_cache, value_cache, table_row, seq_len):
    # The sequence's K and V, [seq_len, kv_heads, head_size] each, in the accumulating dtype.
    bs = key_cache.shape[3]
    blocks = table_row[:(seq_len + bs - 1) // bs].long()
    k = key_cache[blocks].to(_acc(key_cache)).permute(0, 3, 1, 2, 4)  # [nb, bs, kvh, D/x, x]
    k = k.reshape(k.shape[0] * bs, k.shape[2], -1)[:seq_len]
    v = value_cache[blocks].to(_acc(key_cache)).permute(0, 3, 1, 2)  # [nb, bs, kvh, D]
    v = v.reshape(v.shape[0] * bs, v.shape[2], -1)[:seq_len]
    return k, v


def _paged_check(query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size, max_seq_len,
                 alibi_slopes, kv_cache_dtype, k_scale, v_scale, vert_stride):
    _check_kv_dtype(kv_cache_dtype, k_scale, v_scale)
    if vert_stride > 1:
        raise ValueError("blocksparse_vert_stride > 1 is not supported")
    nb, kvh, d, bs, _ = _check_legacy_layout(key_cache, value_cache)
    s, h, hd = query.shape
    if kvh != num_kv_heads or h % kvh or d != hd or bs != block_size:
        raise ValueError("num_kv_heads, head_size or block_size do not match the caches")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32 or block_tables.shape[0] != s:
        raise ValueError("block_tables, seq_lens: expected int32, one row per sequence")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) != (h, ):
        raise ValueError("alibi_slopes: expected [num_heads]")
    limit = min(block_tables.shape[1] * bs, max_seq_len)
    for i, n in enumerate(seq_lens.tolist()):
        if n < 0 or n > limit:
            raise ValueError(f"seq_lens[{i}] = {n} out of range")
        used = block_tables[i, :(n + bs - 1) // bs]
        if ((used < 0) | (used >= nb)).any():
            raise ValueError(f"block_tables[{i}]: block id out of range")


def _attend(q, k, v, scale, slopes, t0, t1, seq_len):
    # One sequence's heads over tokens [t0, t1): (max, sum of exp, sum of exp * v), in k's dtype.
    h, kvh = q.shape[0], k.shape[1]
    kk = k[t0:t1].repeat_interleave(h // kvh, dim=1)  # [n, h, D]
    vv = v[t0:t1].repeat_interleave(h // kvh, dim=1)
    s = scale * torch.einsum("hd,thd->ht", q.to(k.dtype), kk)
    if slopes is not None:
        s = s + slopes.to(k.dtype)[:, None] * (torch.arange(t0, t1, dtype=k.dtype) - (seq_len - 1))
    m = s.amax(dim=1)
    p = torch.exp(s - m[:, None])
    return m, p.sum(dim=1), torch.einsum("ht,thd->hd", p, vv)


@testing.reference("vllm_like::paged_attention_v1")
def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size,
                       max_seq_len, alibi_slopes, kv_cache_dtype, k_scale=1.0, v_scale=1.0, tp_rank=0,
                       blocksparse_local_blocks=0, blocksparse_vert_stride=0, blocksparse_block_size=64,
                       blocksparse_head_sliding_step=0):
    _paged_check(query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size, max_seq_len,
                 alibi_slopes, kv_cache_dtype, k_scale, v_scale, blocksparse_vert_stride)
    res = torch.zeros(out.shape, dtype=_acc(key_cache))
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        k, v = _gather(key_cache, value_cache, block_tables[i], n)
        _, l, acc = _attend(query[i], k, v, scale, alibi_slopes, 0, n, n)
        res[i] = acc / (l[:, None] + 1e-6)  # vLLM's denominator
    return res.to(out.dtype)


@testing.reference("vllm_like::paged_attention_v2")
def paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
                       block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale=1.0,
                       v_scale=1.0, tp_rank=0, blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0):
    _paged_check(query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size, max_seq_len,
                 alibi_slopes, kv_cache_dtype, k_scale, v_scale, blocksparse_vert_stride)
    s, h, d = query.shape
    parts = exp_sums.shape[2]
    if (tuple(exp_sums.shape) != (s, h, parts) or parts < (max_seq_len + _PARTITION - 1) // _PARTITION
            or tuple(max_logits.shape) != (s, h, parts) or tuple(tmp_out.shape) != (s, h, parts, d)):
        raise ValueError("exp_sums, max_logits, tmp_out: wrong shapes")
    # Partitions a sequence does not reach keep their contents, as in vLLM.
    acc_dtype = _acc(key_cache)
    res, es, ml, tmp = torch.zeros(out.shape, dtype=acc_dtype), exp_sums.clone(), max_logits.clone(), tmp_out.clone()
    for i, n in enumerate(seq_lens.tolist()):
        if n == 0:
            continue
        k, v = _gather(key_cache, value_cache, block_tables[i], n)
        count = (n + _PARTITION - 1) // _PARTITION
        for p in range(count):
            m, l, acc = _attend(query[i], k, v, scale, alibi_slopes, p * _PARTITION, min(n, (p + 1) * _PARTITION), n)
            ml[i, :, p], es[i, :, p] = m.to(ml.dtype), l.to(es.dtype)
            tmp[i, :, p] = (acc / (l[:, None] + 1e-6)).to(tmp.dtype)  # stored in out's dtype
        if count == 1:
            res[i] = tmp[i, :, 0].to(acc_dtype)
            continue
        m, l = ml[i, :, :count].to(acc_dtype), es[i, :, :count].to(acc_dtype)
        r = l * torch.exp(m - m.amax(dim=1, keepdim=True))
        res[i] = (tmp[i, :, :count].to(acc_dtype) * r[:, :, None]).sum(dim=1) / (r.sum(dim=1)[:, None] + 1e-6)
    return [res.to(out.dtype), es, ml, tmp]


def _paged_cache(dtype, seq_lens, num_heads, num_kv_heads, head_size, block_size, spare_blocks=3, table_pad=1):
    # The sequences' blocks shuffled through a cache with spare blocks; free
    # slots (past each sequence's end, spare blocks) hold NaN, which the op
    # must never read as a value; table entries past a sequence's blocks are
    # out of range, which the op must never use.
    x = _x_of(dtype)
    counts = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(counts) + spare_blocks
    ids = torch.randperm(num_blocks)
    max_blocks = max(counts, default=0) + table_pad
    tables = torch.full((len(seq_lens), max_blocks), num_blocks + 5, dtype=torch.int32)
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), float("nan"), dtype=dtype)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), float("nan"), dtype=dtype)
    at = 0
    for i, (n, c) in enumerate(zip(seq_lens, counts)):
        tables[i, :c] = ids[at:at + c].int()
        at += c
        for t in range(n):
            b, off = int(tables[i, t // block_size]), t % block_size
            key_cache[b, :, :, off, :] = torch.randn(num_kv_heads, head_size // x, x, dtype=dtype)
            value_cache[b, :, :, off] = torch.randn(num_kv_heads, head_size, dtype=dtype)
    query = torch.randn(len(seq_lens), num_heads, head_size, dtype=dtype)
    return query, key_cache, value_cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


def _paged_cases():
    # (name, seq_lens, num_heads, num_kv_heads, head_size, block_size, alibi)
    yield "MHA block 16", [1, 17, 100, 33], 4, 4, 64, 16, False
    yield "GQA 8/2 block 8", [5, 64, 200], 8, 2, 128, 8, False
    yield "MQA alibi block 32", [1, 31, 32, 33, 300], 4, 1, 64, 32, True
    yield "GQA 6/3 head 80, a seq_len 0", [0, 7, 48], 6, 3, 80, 16, False
    yield "block 4 (no compile-time loop)", [3, 45], 2, 2, 32, 4, False


def _paged_errors(dtype):
    q, kc, vc, bt, sl = _paged_cache(dtype, [20, 9], 4, 2, 64, 16)
    base = dict(q=q, kc=kc, vc=vc, bt=bt, sl=sl, kvh=2, bs=16, msl=20, kv="auto", vs=0)
    bad_bt = bt.clone()
    bad_bt[0, 1] = kc.shape[0]
    yield "block id out of range (error)", dict(base, bt=bad_bt)
    yield "negative block id (error)", dict(base, bt=torch.where(bt == bt[1, 0], -1, bt))
    yield "seq_len beyond the block table (error)", dict(base, sl=torch.tensor([20, 2 * 16 + 1], dtype=torch.int32),
                                                          msl=64)
    yield "seq_len beyond max_seq_len (error)", dict(base, msl=19)
    yield "negative seq_len (error)", dict(base, sl=torch.tensor([20, -1], dtype=torch.int32))
    x = _x_of(dtype)
    yield "key_cache x = 2x (error)", dict(base, kc=kc.reshape(kc.shape[0], 2, 64 // (2 * x), 16, 2 * x).contiguous())
    yield "kv_cache_dtype fp8 (error)", dict(base, kv="fp8")
    yield "kv_cache_dtype fp8_e5m2 (error)", dict(base, kv="fp8_e5m2")
    yield "num_kv_heads 4 != 2 (error)", dict(base, kvh=4)
    yield "blocksparse_vert_stride 2 (error)", dict(base, vs=2)


@testing.samples("vllm_like::paged_attention_v1")
def paged_attention_v1_samples(dtype):
    for name, lens, h, kvh, d, bs, alibi in _paged_cases():
        q, kc, vc, bt, sl = _paged_cache(dtype, lens, h, kvh, d, bs)
        slopes = torch.rand(h) * 0.5 if alibi else None
        yield testing.Sample(torch.empty_like(q), 2.0 * q, kc, vc, kvh, d ** -0.5, bt, sl, bs, max(lens), slopes,
                             "auto", name=name)
    q, kc, vc, bt, sl = _paged_cache(dtype, [], 4, 4, 64, 16)
    yield testing.Sample(torch.empty_like(q), q, kc, vc, 4, 0.125, bt, sl, 16, 0, None, "auto", name="no sequences")
    for name, a in _paged_errors(dtype):
        yield testing.Sample(torch.empty_like(a["q"]), a["q"], a["kc"], a["vc"], a["kvh"], 0.125, a["bt"], a["sl"],
                             a["bs"], a["msl"], None, a["kv"], 1.0, 1.0, 0, 0, a["vs"], name=name)


def _v2_buffers(q, max_seq_len, extra=0):
    s, h, d = q.shape
    parts = (max_seq_len + _PARTITION - 1) // _PARTITION + extra
    return (torch.empty_like(q), torch.randn(s, h, parts), torch.randn(s, h, parts),
            torch.randn(s, h, parts, d, dtype=q.dtype))


@testing.samples("vllm_like::paged_attention_v2")
def paged_attention_v2_samples(dtype):
    cases = (("4 partitions, GQA 4/2, block 16", [1, 600, 1800, 512, 513], 4, 2, 64, 16, False, 0),
             ("alibi, MHA, block 32, one spare partition", [1100, 3], 2, 2, 64, 32, True, 1),
             ("one partition, block 8, a seq_len 0", [0, 300, 17], 4, 1, 128, 8, False, 0))
    for name, lens, h, kvh, d, bs, alibi, extra in cases:
        q, kc, vc, bt, sl = _paged_cache(dtype, lens, h, kvh, d, bs)
        slopes = torch.rand(h) * 0.05 if alibi else None
        yield testing.Sample(*_v2_buffers(q, max(lens), extra), 2.0 * q, kc, vc, kvh, d ** -0.5, bt, sl, bs,
                             max(lens), slopes, "auto", name=name)
    for name, a in _paged_errors(dtype):
        yield testing.Sample(*_v2_buffers(a["q"], max(a["msl"], 1)), a["q"], a["kc"], a["vc"], a["kvh"], 0.125,
                             a["bt"], a["sl"], a["bs"], a["msl"], None, a["kv"], 1.0, 1.0, 0, 0, a["vs"], name=name)
    q, kc, vc, bt, sl = _paged_cache(dtype, [700], 2, 2, 64, 16)
    es, ml, tmp = _v2_buffers(q, 700)[1:]
    yield testing.Sample(torch.empty_like(q), es[:, :, :1], ml[:, :, :1], tmp[:, :, :1], q, kc, vc, 2, 0.125, bt, sl,
                         16, 700, None, "auto", name="too few partitions in exp_sums (error)")


def _reshape_check(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, flash):
    _check_kv_dtype(kv_cache_dtype, k_scale, v_scale)
    if flash:
        nb, bs, kvh, d = key_cache.shape
    else:
        nb, kvh, d, bs, _ = _check_legacy_layout(key_cache, value_cache)
    if key.dim() != 3 or tuple(key.shape[1:]) != (kvh, d) or value.shape != key.shape:
        raise ValueError("key, value: expected [num_tokens, num_kv_heads, head_size]")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape[0] > key.shape[0]:
        raise ValueError("slot_mapping: expected int64, at most num_tokens slots")
    if (slot_mapping >= nb * bs).any():
        raise ValueError("slot_mapping: slot out of range")
    return bs


@testing.reference("vllm_like::reshape_and_cache")
def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale=1.0, v_scale=1.0):
    bs = _reshape_check(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, False)
    kc, vc = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            kc[slot // bs, :, :, slot % bs, :] = key[t].reshape(kc.shape[1], kc.shape[2], kc.shape[4])
            vc[slot // bs, :, :, slot % bs] = value[t]
    return [kc, vc]


@testing.reference("vllm_like::reshape_and_cache_flash")
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale=1.0,
                            v_scale=1.0):
    bs = _reshape_check(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, True)
    kc, vc = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            kc[slot // bs, slot % bs] = key[t]
            vc[slot // bs, slot % bs] = value[t]
    return [kc, vc]


def _reshape_samples(dtype, flash):
    def caches(nb, kvh, d, bs):
        if flash:
            return torch.randn(nb, bs, kvh, d, dtype=dtype), torch.randn(nb, bs, kvh, d, dtype=dtype)
        x = _x_of(dtype)
        return (torch.randn(nb, kvh, d // x, bs, x, dtype=dtype), torch.randn(nb, kvh, d, bs, dtype=dtype))

    for tokens, kvh, d, bs, nb, name in ((10, 2, 64, 16, 4, "block 16"), (37, 4, 32, 8, 6, "block 8"),
                                         (5, 1, 128, 32, 2, "block 32, MQA")):
        kc, vc = caches(nb, kvh, d, bs)
        slots = torch.randperm(nb * bs)[:tokens]
        slots[::4] = -1  # padding tokens
        key, value = torch.randn(tokens, kvh, d, dtype=dtype), torch.randn(tokens, kvh, d, dtype=dtype)
        yield testing.Sample(key, value, kc, vc, slots, "auto", name=name)
    kc, vc = caches(3, 2, 64, 16)
    key, value = torch.randn(6, 2, 64, dtype=dtype), torch.randn(6, 2, 64, dtype=dtype)
    yield testing.Sample(key, value, kc, vc, torch.tensor([0, 1, 2, 47, -1]), "auto",
                         name="fewer slots than key rows (padding)")
    yield testing.Sample(key, value, kc, vc, torch.tensor([0, 1, 2, 48, 4, 5]), "auto", name="slot out of range (error)")
    yield testing.Sample(key, value, kc, vc, torch.arange(6), "fp8", name="kv_cache_dtype fp8 (error)")
    yield testing.Sample(key[:, :1], value[:, :1], kc, vc, torch.arange(6), "auto", name="key heads != cache's (error)")
    if not flash:
        yield testing.Sample(key, value, kc.reshape(3, 2, 64 // (2 * _x_of(dtype)), 16, 2 * _x_of(dtype)), vc,
                             torch.arange(6), "auto", name="key_cache x = 2x (error)")


@testing.samples("vllm_like::reshape_and_cache")
def reshape_and_cache_samples(dtype):
    yield from _reshape_samples(dtype, False)


@testing.samples("vllm_like::reshape_and_cache_flash")
def reshape_and_cache_flash_samples(dtype):
    yield from _reshape_samples(dtype, True)


def _check_mapping(block_mapping, src_blocks, dst_blocks):
    if block_mapping.dtype != torch.int64 or block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError("block_mapping: expected int64 [n, 2]")
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    if ((src < 0) | (src >= src_blocks) | (dst < 0) | (dst >= dst_blocks)).any():
        raise ValueError("block_mapping: block id out of range")


@testing.reference("vllm_like::copy_blocks")
def copy_blocks(key_caches, value_caches, block_mapping):
    if len(key_caches) != len(value_caches):
        raise ValueError("key_caches, value_caches: expected as many")
    # vLLM's layout rule: every key cache like key_caches[0], every value cache
    # like value_caches[0], and a value block as many elements as a key block.
    for caches in (key_caches, value_caches):
        if any(c.shape != caches[0].shape for c in caches):
            raise ValueError("caches of one list: expected one shape for every layer")
    if key_caches and key_caches[0][0].numel() != value_caches[0][0].numel():
        raise ValueError("value_caches: expected the key caches' block size")
    out = []
    for c in list(key_caches) + list(value_caches):
        _check_mapping(block_mapping, c.shape[0], c.shape[0])
        c = c.clone()
        for s, d in block_mapping.tolist():
            c[d] = c[s]
        out.append(c)
    return out


@testing.samples("vllm_like::copy_blocks")
def copy_blocks_samples(dtype):
    x = _x_of(dtype)
    keys = [torch.randn(8, 2, 64 // x, 16, x, dtype=dtype) for _ in range(3)]
    values = [torch.randn(8, 2, 64, 16, dtype=dtype) for _ in range(3)]
    # Sources and destinations disjoint, as vLLM's copy-on-write mappings are.
    mapping = torch.tensor([[0, 5], [2, 7], [2, 6], [1, 4]])
    yield testing.Sample(keys, values, mapping, name="3 layers, 4 pairs")
    yield testing.Sample(keys[:1], values[:1], torch.zeros(0, 2, dtype=torch.int64), name="no pairs")
    yield testing.Sample(keys, values, torch.tensor([[0, 8]]), name="destination out of range (error)")
    yield testing.Sample(keys, values, torch.tensor([[-1, 3]]), name="negative source (error)")
    yield testing.Sample(keys, values, torch.tensor([0, 3]), name="block_mapping 1-d (error)")
    yield testing.Sample(keys, values[:2], mapping, name="fewer value caches (error)")
    yield testing.Sample(keys, [torch.randn(8, 2, 64, 8, dtype=dtype) for _ in range(3)], mapping,
                         name="value block size differs from the key's (error)")
    yield testing.Sample(keys[:2] + [torch.randn(8, 1, 64 // x, 16, x, dtype=dtype)], values, mapping,
                         name="one layer's key cache of another shape (error)")


@testing.reference("vllm_like::swap_blocks")
def swap_blocks(src, dst, block_mapping):
    if src.dim() == 0 or dst.dim() == 0:
        raise ValueError("src, dst: expected a block dimension")
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
        raise ValueError("dst: expected blocks of src's shape and dtype")
    _check_mapping(block_mapping, src.shape[0], dst.shape[0])
    dst = dst.clone()
    for s, d in block_mapping.tolist():
        dst[d] = src[s]
    return dst


@testing.samples("vllm_like::swap_blocks")
def swap_blocks_samples(dtype):
    x = _x_of(dtype)
    src, dst = torch.randn(6, 2, 64 // x, 16, x, dtype=dtype), torch.randn(10, 2, 64 // x, 16, x, dtype=dtype)
    yield testing.Sample(src, dst, torch.tensor([[0, 9], [5, 0], [3, 3]]), name="key cache blocks")
    yield testing.Sample(torch.randn(4, 3, 16, dtype=dtype), torch.randn(2, 3, 16, dtype=dtype),
                         torch.tensor([[3, 0], [1, 1]]), name="to a smaller cache")
    yield testing.Sample(src, dst, torch.tensor([[6, 0]]), name="source out of range (error)")
    yield testing.Sample(src, dst, torch.tensor([[0, 10]]), name="destination out of range (error)")
    yield testing.Sample(src, dst[:, :1], torch.tensor([[0, 0]]), name="block shapes differ (error)")
    yield testing.Sample(torch.tensor(1.0, dtype=dtype), torch.tensor(2.0, dtype=dtype), torch.tensor([[0, 0]]),
                         name="0-d caches (error)")


# ---------------------------------------------------------------------------
# flash_attn_varlen (plugins/vllm_like/src/flash_attention*.cpp): vLLM V1's
# varlen attention over the flash layout [num_blocks, block_size,
# num_kv_heads, head_size]. Reference: each sequence's keys and values
# gathered through its block table row, attention computed in the
# accumulating dtype (float32 for every sample dtype, as the op computes;
# float64 for the float64 run), with the causal offset (query i of a
# sequence of q_len new tokens sits at seqused_k - q_len + i), the window
# and the softcap; rows past cu_seqlens_q[-1] keep out's values.


def _flash_check(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                 block_table, window_left, softcap):
    if query.dim() != 3 or out.shape != query.shape or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        raise ValueError("query, out [tokens, heads, head_size]; caches [blocks, block_size, kv_heads, head_size]")
    nb, bs, kvh, d = key_cache.shape
    if d != query.shape[2] or kvh == 0 or query.shape[1] % kvh:
        raise ValueError("head_size or num_kv_heads do not match query")
    if any(t.dtype != torch.int32 for t in (cu_seqlens_q, seqused_k, block_table)):
        raise ValueError("cu_seqlens_q, seqused_k, block_table: expected int32")
    s = seqused_k.shape[0]
    if cu_seqlens_q.shape != (s + 1, ) or block_table.shape[0] != s:
        raise ValueError("cu_seqlens_q [num_seqs + 1], block_table [num_seqs, max_blocks]")
    if window_left < -1 or softcap < 0:
        raise ValueError("window_left >= -1, softcap >= 0")
    cu, used = cu_seqlens_q.tolist(), seqused_k.tolist()
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] > query.shape[0]:
        raise ValueError("cu_seqlens_q: 0, non-decreasing, at most num_tokens")
    for i, kv in enumerate(used):
        q_len = cu[i + 1] - cu[i]
        if q_len > max_seqlen_q or kv < 0 or kv > max_seqlen_k or kv > block_table.shape[1] * bs:
            raise ValueError(f"sequence {i}: lengths out of range")
        if causal and q_len > kv:
            raise ValueError(f"sequence {i}: more query tokens than cached ones (causal)")
        blocks = block_table[i, :(kv + bs - 1) // bs]
        if ((blocks < 0) | (blocks >= nb)).any():
            raise ValueError(f"block_table[{i}]: block id out of range")


@testing.reference("vllm_like::flash_attn_varlen")
def flash_attn_varlen(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, causal, block_table, window_left, softcap):
    _flash_check(out, query, key_cache, value_cache, cu_seqlens_q, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                 block_table, window_left, softcap)
    acc = _acc(key_cache)
    res = out.to(acc).clone()
    bs, kvh = key_cache.shape[1], key_cache.shape[2]
    h = query.shape[1]
    cu = cu_seqlens_q.tolist()
    for i, kv in enumerate(seqused_k.tolist()):
        q0, q1 = cu[i], cu[i + 1]
        if q1 == q0:
            continue
        if kv == 0:
            res[q0:q1] = 0  # no key to see
            continue
        t = torch.arange(kv)
        blocks = block_table[i, t // bs].long()
        k = key_cache[blocks, t % bs].to(acc).repeat_interleave(h // kvh, 1)  # [kv, h, D]
        v = value_cache[blocks, t % bs].to(acc).repeat_interleave(h // kvh, 1)
        s = softmax_scale * torch.einsum("ihd,thd->hit", query[q0:q1].to(acc), k)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        p = kv - (q1 - q0) + torch.arange(q1 - q0)[:, None]
        seen = torch.ones(q1 - q0, kv, dtype=torch.bool)
        if causal:
            seen &= t[None, :] <= p
        if window_left >= 0:
            seen &= t[None, :] >= p - window_left
        w = torch.softmax(s.masked_fill(~seen, float("-inf")), -1).nan_to_num(0.0)
        res[q0:q1] = torch.einsum("hit,thd->ihd", w, v)
    return res.to(out.dtype)


def _flash_cache(dtype, seqs, num_heads, num_kv_heads, head_size, block_size, spare_blocks=3, table_pad=1):
    # seqs: [(q_len, kv_len)]. Blocks shuffled through a cache with spare
    # blocks; free slots NaN and table entries past a sequence's blocks out
    # of range (the op must use neither); two padding rows after the last
    # sequence's (not written).
    counts = [(kv + block_size - 1) // block_size for _, kv in seqs]
    nb = sum(counts) + spare_blocks
    ids = torch.randperm(nb)
    table = torch.full((len(seqs), max(counts, default=0) + table_pad), nb + 5, dtype=torch.int32)
    kc = torch.full((nb, block_size, num_kv_heads, head_size), float("nan"), dtype=dtype)
    vc = torch.full((nb, block_size, num_kv_heads, head_size), float("nan"), dtype=dtype)
    at = 0
    for i, ((_, kv), c) in enumerate(zip(seqs, counts)):
        table[i, :c] = ids[at:at + c].int()
        at += c
        t = torch.arange(kv)
        blocks = table[i, t // block_size].long()
        kc[blocks, t % block_size] = torch.randn(kv, num_kv_heads, head_size, dtype=dtype)
        vc[blocks, t % block_size] = torch.randn(kv, num_kv_heads, head_size, dtype=dtype)
    cu = torch.tensor([0] + [q for q, _ in seqs]).cumsum(0).to(torch.int32)
    query = torch.randn(int(cu[-1]) + 2, num_heads, head_size, dtype=dtype)
    used = torch.tensor([kv for _, kv in seqs], dtype=torch.int32)
    return query, kc, vc, cu, used, table


@testing.samples("vllm_like::flash_attn_varlen")
def flash_attn_varlen_samples(dtype):
    # (name, seqs, heads, kv heads, head size, block size, causal, window_left, softcap)
    cases = (("prefill across blocks and chunks, GQA 8/4, block 16", [(1, 1), (17, 17), (150, 150)], 8, 4, 64, 16,
              True, -1, 0.0),
             ("chunked prefill and decode, GQA 8/2, block 32", [(5, 40), (1, 300), (64, 130), (0, 7)], 8, 2, 64, 32,
              True, -1, 0.0),
             ("decode batch, MQA 4/1, head 128", [(1, n) for n in (1, 16, 17, 200)], 4, 1, 128, 16, True, -1, 0.0),
             ("sliding window 20, softcap 3", [(30, 90), (1, 200)], 4, 2, 32, 16, True, 20, 3.0),
             ("not causal, more queries than keys, no keys", [(9, 4), (3, 0), (2, 40)], 2, 2, 32, 16, False, -1,
              0.0))
    for name, seqs, h, kvh, d, bs, causal, window, cap in cases:
        q, kc, vc, cu, used, table = _flash_cache(dtype, seqs, h, kvh, d, bs)
        out = torch.full(q.shape, 7.0, dtype=dtype)
        yield testing.Sample(out, 2.0 * q, kc, vc, cu, used, max(q for q, _ in seqs), max(kv for _, kv in seqs),
                             d ** -0.5, causal, table, window, cap, name=name)
    q, kc, vc, cu, used, table = _flash_cache(dtype, [(5, 20), (1, 9)], 4, 2, 64, 16)
    base = [torch.empty_like(q), q, kc, vc, cu, used, 5, 20, 0.125, True, table, -1, 0.0]

    def bad(name, **change):
        names = ("out", "query", "key_cache", "value_cache", "cu_seqlens_q", "seqused_k", "max_seqlen_q",
                 "max_seqlen_k", "softmax_scale", "causal", "block_table", "window_left", "softcap")
        args = [change.get(n, a) for n, a in zip(names, base)]
        return testing.Sample(*args, name=name + " (error)")

    wrong = table.clone()
    wrong[0, 1] = kc.shape[0]
    yield bad("block id out of range", block_table=wrong)
    yield bad("seqused_k beyond the block table", seqused_k=torch.tensor([20, 2 * 16 + 1], dtype=torch.int32),
              max_seqlen_k=64)
    yield bad("seqused_k beyond max_seqlen_k", max_seqlen_k=19)
    yield bad("q_len > seqused_k, causal", seqused_k=torch.tensor([4, 9], dtype=torch.int32))
    yield bad("cu_seqlens_q decreasing", cu_seqlens_q=torch.tensor([0, 5, 3], dtype=torch.int32))
    yield bad("cu_seqlens_q past num_tokens", cu_seqlens_q=torch.tensor([0, 5, 100], dtype=torch.int32))
    yield bad("cu_seqlens_q int64", cu_seqlens_q=cu.long())
    yield bad("kv heads not dividing the heads", key_cache=kc[:, :, :1].repeat(1, 1, 3, 1),
              value_cache=vc[:, :, :1].repeat(1, 1, 3, 1))


# compute_slot_mapping (plugins/vllm_like/src/slot_mapping.cpp): vLLM's
# ComputeSlotMappingKernel, each scheduled token's cache slot.
@testing.reference("vllm_like::compute_slot_mapping")
def compute_slot_mapping(query_start_loc, positions, block_table, slot_mapping, block_size, num_tokens):
    if query_start_loc.dtype != torch.int32 or positions.dtype != torch.int64 or block_table.dtype != torch.int32 \
            or slot_mapping.dtype != torch.int64:
        raise ValueError("dtypes: expected int32 query_start_loc and block_table, int64 positions and slot_mapping")
    if block_size <= 0 or not 0 <= num_tokens <= min(positions.shape[0], slot_mapping.shape[0]):
        raise ValueError("block_size, num_tokens out of range")
    out = torch.full_like(slot_mapping, -1)
    qsl = query_start_loc.tolist()
    for r in range(len(qsl) - 1):
        if not 0 <= qsl[r] <= qsl[r + 1] <= num_tokens:
            raise ValueError("query_start_loc: not a range of the tokens")
        for t in range(qsl[r], qsl[r + 1]):
            p = int(positions[t])
            if p < 0 or p // block_size >= block_table.shape[1]:
                raise IndexError("positions: beyond the block table")
            out[t] = int(block_table[r, p // block_size]) * block_size + p % block_size
    return [out]


@testing.samples("vllm_like::compute_slot_mapping")
def compute_slot_mapping_samples(dtype):
    table = torch.tensor([[7, 2, 9, 0], [3, 5, 1, 4], [8, 6, 10, 11]], dtype=torch.int32)
    # A prefill of 5 at 0, a decode at 33, a chunk of 4 at 14: 10 tokens,
    # 16 slots (the rest padding).
    qsl = torch.tensor([0, 5, 6, 10], dtype=torch.int32)
    pos = torch.tensor([0, 1, 2, 3, 4, 33, 14, 15, 16, 17], dtype=torch.int64)
    slots = torch.zeros(16, dtype=torch.int64)
    yield testing.Sample(qsl, pos, table, slots, 16, 10, name="prefill, decode and chunk, block 16")
    yield testing.Sample(qsl, pos, table, slots, 32, 10, name="block 32")
    yield testing.Sample(torch.tensor([0], dtype=torch.int32), pos, table, slots, 16, 0, name="no requests")
    yield testing.Sample(qsl, torch.tensor([0, 1, 2, 3, 4, 64, 14, 15, 16, 17]), table, slots, 16, 10,
                         name="position beyond the block table (error)")
    yield testing.Sample(torch.tensor([0, 5, 3, 10], dtype=torch.int32), pos, table, slots, 16, 10,
                         name="query_start_loc decreasing (error)")
    yield testing.Sample(qsl, pos, table, slots, 0, 10, name="block_size 0 (error)")
    yield testing.Sample(qsl, pos, table, slots, 16, 11, name="num_tokens beyond positions (error)")
    yield testing.Sample(qsl.long(), pos, table, slots, 16, 10, name="query_start_loc int64 (error)")
