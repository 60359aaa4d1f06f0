"""vllm_like's flash_attn_varlen (plugins/vllm_like/src/flash_attention*.cpp)
on npu tensors, through npubridge.vllm._custom_ops: results against a
float64 reference computed here over the cache gathered through the block
table, with an error bound derived from the kernel's float32 arithmetic and
the output dtype (prefill across blocks and key chunks, chunked prefill,
decode, mixed batches, GQA 1/2/4, block sizes 16/32, shuffled block tables,
sliding window, softcap, non-causal, padding rows, strided query, out and
caches); errors by message. The conformance samples are in
plugins/vllm_like/conformance/vllm_like_conformance.py."""
import math

import pytest
import torch

import npubridge
from conftest import assert_judged
from npubridge.vllm import _custom_ops as ops

U32 = 2.0**-24  # float32's unit roundoff: the kernel computes in float32
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SENTINEL = 7.0  # what out holds before the call: rows the call must not write keep it


# The in-tree plugin is built with the extension: not loaded is a failure,
# never a skip (a broken build must not shrink the suite).
@pytest.fixture(autouse=True)
def _vllm_like_is_loaded():
    assert any(p["name"] == "vllm_like" for p in npubridge.plugins()), \
        f"the vllm_like plugin is not loaded: {npubridge.load_failures()}"


def unit(dtype):
    return torch.finfo(dtype).eps / 2  # unit roundoff of dtype


def build(seqs, h, kvh, d, dtype, block_size, q_scale=1.0, pad_rows=3, table_pad=2, spare_blocks=3, seed=0):
    """A batch of sequences [(q_len, kv_len), ...] in the flash layout's
    caches [num_blocks, block_size, kvh, d]: each sequence's blocks drawn from
    a shuffled pool, the free slots and spare blocks NaN (a kernel that read
    one would give NaN), the table entries past a sequence's blocks out of
    range (a kernel that used one would fault or raise). Returns CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    counts = [(kv + block_size - 1) // block_size for _, kv in seqs]
    nb = sum(counts) + spare_blocks
    ids = torch.randperm(nb, generator=g)
    table = torch.full((len(seqs), max(counts, default=0) + table_pad), nb + 7, dtype=torch.int32)
    kc = torch.full((nb, block_size, kvh, d), float("nan"), dtype=dtype)
    vc = torch.full((nb, block_size, kvh, d), float("nan"), dtype=dtype)
    at = 0
    for s, ((_, kv), c) in enumerate(zip(seqs, counts)):
        table[s, :c] = ids[at:at + c].int()
        at += c
        t = torch.arange(kv)
        blocks = table[s, t // block_size].long()
        kc[blocks, t % block_size] = torch.randn(kv, kvh, d, generator=g).to(dtype)
        vc[blocks, t % block_size] = torch.randn(kv, kvh, d, generator=g).to(dtype)
    cu = torch.tensor([0] + [q for q, _ in seqs], dtype=torch.int64).cumsum(0).to(torch.int32)
    tokens = int(cu[-1]) + pad_rows
    q = (q_scale * torch.randn(tokens, h, d, generator=g)).to(dtype)
    used = torch.tensor([kv for _, kv in seqs], dtype=torch.int32)
    return dict(query=q, key_cache=kc, value_cache=vc, cu_seqlens_q=cu, seqused_k=used, block_table=table,
                max_seqlen_q=max([q for q, _ in seqs], default=0), max_seqlen_k=max([kv for _, kv in seqs], default=0))


def reference(a, scale, causal, window_left=-1, softcap=0.0, acc=torch.float64):
    """float64 (or `acc`) attention of each sequence's query rows over its keys and
    values gathered through its block table row; and the bound of the
    kernel's float32 error per element (before the rounding to the output
    dtype).

    The bound, per query row and head: the kernel scales q by softmax_scale
    (one rounding) and takes each score as a dot product of D terms (GEMM or
    its own loop, any order), so a score is off by at most
    E = gamma_{D+2} scale sum_d |q_d k_d| (Higham's gamma_n = n u / (1 - n u));
    softcap's c tanh(s / c) has slope <= 1, so it passes E on and adds its own
    roundings and tanh's few ulps, 8 u c. Scores off by E change each softmax
    weight by a relative 2E (the row's maximum moves too), and a convex
    combination of value rows by twice that times max|v|. exp's few ulps, the
    running sums over the n keys the row sees, the weighted sum of n value
    rows and the rescalings at each 128-key chunk (the same factor on output
    and sum) add (n + 8) u max|v|. A factor 4 covers the first-order terms'
    neglected products."""
    q, kc, vc = a["query"].to(acc), a["key_cache"].to(acc), a["value_cache"].to(acc)
    cu, used, table = a["cu_seqlens_q"].tolist(), a["seqused_k"].tolist(), a["block_table"]
    tokens, h, d = q.shape
    bs, kvh = kc.shape[1], kc.shape[2]
    out = torch.zeros(tokens, h, d, dtype=acc)
    bound = torch.zeros(tokens, h, d, dtype=acc)
    gamma = (d + 2) * U32 / (1 - (d + 2) * U32)
    for s, kv in enumerate(used):
        q0, q1 = cu[s], cu[s + 1]
        q_len = q1 - q0
        if q_len == 0 or kv == 0:
            continue  # no rows, or rows that see no key: 0
        t = torch.arange(kv)
        blocks = table[s, t // bs].long()
        k = kc[blocks, t % bs].repeat_interleave(h // kvh, 1)  # [kv, h, d]
        v = vc[blocks, t % bs].repeat_interleave(h // kvh, 1)
        qs = q[q0:q1]
        scores = scale * torch.einsum("ihd,thd->hit", qs, k)
        magnitude = abs(scale) * torch.einsum("ihd,thd->hit", qs.abs(), k.abs())
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        p = kv - q_len + torch.arange(q_len)[:, None]  # each query's position (the causal offset)
        seen = torch.ones(q_len, kv, dtype=torch.bool)
        if causal:
            seen &= t[None, :] <= p
        if window_left >= 0:
            seen &= t[None, :] >= p - window_left
        w = torch.softmax(scores.masked_fill(~seen, float("-inf")), -1).nan_to_num(0.0)  # no key seen: 0
        out[q0:q1] = torch.einsum("hit,thd->ihd", w, v)
        e = gamma * magnitude.masked_fill(~seen, 0).amax(-1) + 8 * U32 * softcap  # [h, i]
        n = seen.sum(-1)  # [i]
        vmax = (v.abs().amax(-1)[:, :, None] * seen.T[:, None, :]).amax(0)  # [h, i]: over the keys seen
        bound[q0:q1] = (4 * (2 * e + (n[None, :] + 8) * U32) * vmax).T[:, :, None]
    return out, bound


def run(a, scale, causal, window_left=-1, softcap=0.0, out=None):
    """The op on npu copies of a's tensors; out (an npu tensor of query's
    shape) starts as SENTINEL unless given. Returns out."""
    n = {k: (x.to("npu") if isinstance(x, torch.Tensor) else x) for k, x in a.items()}
    if out is None:
        out = torch.full(a["query"].shape, SENTINEL, dtype=a["query"].dtype, device="npu")
    ops.flash_attn_varlen(out, n["query"], n["key_cache"], n["value_cache"], n["cu_seqlens_q"], n["seqused_k"],
                          n["max_seqlen_q"], n["max_seqlen_k"], scale, causal, n["block_table"], window_left, softcap)
    return out


def check(got, a, scale, causal, window_left=-1, softcap=0.0):
    """got (npu) within the bound of the float64 reference, rounded to its
    dtype: the float32 error, plus the final rounding (2 u |ref|, and u times
    the smallest normal where a result underflows); rows past
    cu_seqlens_q[-1] untouched. The derived bound holds for any order of
    the sums, so it is loose for float32 (a thousand times the usual error):
    the result is also judged by npubridge's error model against the same
    computation on the CPU in float32, rounded to got's dtype (conftest's
    assert_judged: within a few times that computation's own error)."""
    ref, b = reference(a, scale, causal, window_left, softcap)
    host, _ = reference(a, scale, causal, window_left, softcap, acc=torch.float32)
    dtype = got.dtype
    b = b + 2 * unit(dtype) * ref.abs() + unit(dtype) * torch.finfo(dtype).tiny
    got = got.cpu()
    end = int(a["cu_seqlens_q"][-1])
    assert (got[end:] == SENTINEL).all(), "rows past cu_seqlens_q[-1] were written"
    g = got[:end].double()
    assert torch.isfinite(g).all(), "a non-finite result: a free cache slot was read"
    err = (g - ref[:end]).abs()
    worst = int((err - b[:end]).flatten().argmax())
    assert (err <= b[:end]).all(), \
        f"error {err.flatten()[worst]:.3g} > bound {b[:end].flatten()[worst]:.3g} at flat index {worst}"
    assert_judged(got[:end], host[:end].to(dtype), ref[:end])


PREFILL = [(1, 1), (17, 17), (129, 129), (600, 600)]  # across blocks and 128-key chunks
CHUNKED = [(5, 40), (64, 200), (130, 131), (1, 300), (33, 33)]
DECODE = [(1, n) for n in (1, 15, 16, 17, 129, 400, 1000)]
MIXED = [(1, 50), (37, 37), (100, 260), (1, 1), (0, 10), (3, 9), (1, 700)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, block_size", [(1, 16), (2, 32), (4, 16)], ids=["MHA-b16", "GQA2-b32", "GQA4-b16"])
def test_prefill(dtype, group, block_size):
    a = build(PREFILL, 4 * group, 4, 64, dtype, block_size, seed=group)
    check(run(a, 0.125, True), a, 0.125, True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_prefill(dtype):
    a = build(CHUNKED, 8, 2, 64, dtype, 16, q_scale=2.0, seed=1)
    check(run(a, 0.125, True), a, 0.125, True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group, block_size", [(1, 16), (2, 32), (4, 16)], ids=["MHA-b16", "GQA2-b32", "GQA4-b16"])
def test_decode_batch(dtype, group, block_size):
    # Four KV heads and seven sequences: some decode tiles take several KV
    # heads, some fewer (flash_attention.cpp, heads_per_direct_tile).
    a = build(DECODE, 4 * group, 4, 128, dtype, block_size, q_scale=2.0, seed=2)
    check(run(a, 128**-0.5, True), a, 128**-0.5, True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mixed_batch(dtype):
    a = build(MIXED, 8, 4, 64, dtype, 16, seed=3)
    check(run(a, 0.125, True), a, 0.125, True)


@pytest.mark.parametrize("window_left", [0, 7, 100])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "not causal"])
def test_sliding_window(window_left, causal):
    a = build(MIXED, 8, 2, 64, torch.float32, 16, seed=4)
    check(run(a, 0.125, causal, window_left), a, 0.125, causal, window_left)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softcap(dtype):
    # Scores up to about 3 * 3 * 8 = 72 > softcap: the cap bends them.
    a = build(CHUNKED, 4, 2, 64, dtype, 16, q_scale=3.0, seed=5)
    check(run(a, 0.125, True, softcap=5.0), a, 0.125, True, softcap=5.0)
    check(run(a, 0.125, False, 16, softcap=5.0), a, 0.125, False, 16, softcap=5.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_not_causal(dtype):
    # More query rows than keys, and a sequence without keys (its rows 0).
    a = build([(10, 5), (7, 7), (3, 0), (1, 40), (70, 300)], 4, 4, 32, dtype, 32, seed=6)
    out = run(a, 0.2, False)
    check(out, a, 0.2, False)
    assert (out.cpu()[17:20] == 0).all()


def test_gemm_and_direct_tiles_agree_within_their_bounds():
    # The same rows once as one token of a decode step (direct tile), once
    # inside a prefill tile (GEMM): both within the bound of the reference.
    a = build([(1, 300), (64, 300)], 8, 2, 64, torch.float32, 16, seed=7)
    a["block_table"][1] = a["block_table"][0]
    a["query"][64] = a["query"][0]  # the prefill's last query row is the decode step's
    out = run(a, 0.125, True).cpu()
    check(out, a, 0.125, True)
    ref, b = reference(a, 0.125, True)
    torch.testing.assert_close(out[0].double(), out[64].double(), rtol=0, atol=float(2 * b[0].max()))


def test_strided_query_out_and_caches_match_the_contiguous_call_exactly():
    # vLLM's backend passes query as a slice of the fused qkv projection,
    # writes into a slice of its output buffer, and sees key and value caches
    # as views of one [num_blocks, num_kv_heads, block_size, 2 * head_size]
    # tensor (transposed and split): the kernel reads every tensor through its
    # strides and computes exactly what it computes on contiguous copies.
    h, kvh, d, bs = 8, 2, 64, 16
    a = build(MIXED, h, kvh, d, torch.bfloat16, bs, seed=8)
    want = run(a, 0.125, True).cpu()
    n = a["query"].shape[0]
    qkv = torch.randn(n, (h + 2 * kvh) * d).to(torch.bfloat16)
    qkv[:, :h * d] = a["query"].reshape(n, h * d)
    query = qkv.npu()[:, :h * d].view(n, h, d)
    assert query.stride() == ((h + 2 * kvh) * d, d, 1)
    kv = torch.empty(a["key_cache"].shape[0], kvh, bs, 2 * d, dtype=torch.bfloat16)
    kv[..., :d] = a["key_cache"].transpose(1, 2)
    kv[..., d:] = a["value_cache"].transpose(1, 2)
    key_cache, value_cache = kv.npu().transpose(1, 2).split(d, dim=-1)
    assert not key_cache.is_contiguous() and key_cache.shape == a["key_cache"].shape
    big = torch.full((n, 2 * h * d), SENTINEL, dtype=torch.bfloat16, device="npu")
    out = big[:, h * d:].view(n, h, d)
    strided = dict(a, query=query, key_cache=key_cache, value_cache=value_cache)
    run(strided, 0.125, True, out=out)
    assert torch.equal(out.cpu(), want)
    assert (big.cpu()[:, :h * d] == SENTINEL).all()


def test_empty_batches():
    # No sequences at all, and sequences without query rows: nothing written.
    for seqs in ([], [(0, 5), (0, 0)]):
        a = build(seqs, 4, 2, 32, torch.float32, 16, seed=9)
        out = run(a, 0.1, True)
        assert (out.cpu() == SENTINEL).all()


def test_opcheck():
    # PyTorch's checker: the schema (out written), fake tensors (the meta
    # function) and AOT dispatch.
    a = build([(3, 20), (1, 9)], 4, 2, 32, torch.float32, 16, seed=10)
    n = {k: (x.npu() if isinstance(x, torch.Tensor) else x) for k, x in a.items()}
    args = (torch.empty(n["query"].shape, device="npu"), n["query"], n["key_cache"], n["value_cache"],
            n["cu_seqlens_q"], n["seqused_k"], n["max_seqlen_q"], n["max_seqlen_k"], 0.1, True, n["block_table"], -1,
            0.0)
    r = torch.library.opcheck(torch.ops.vllm_like.flash_attn_varlen.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert set(r.values()) == {"SUCCESS"}, r


# --- errors: each names the op, the argument, what was expected and what was found ---


def error_call(**change):
    a = build([(5, 20), (1, 9)], 4, 2, 64, torch.float32, 16, seed=11)
    n = {k: (x.npu() if isinstance(x, torch.Tensor) else x) for k, x in a.items()}
    args = dict(out=torch.empty(a["query"].shape, device="npu"), query=n["query"], key_cache=n["key_cache"],
                value_cache=n["value_cache"], cu_seqlens_q=n["cu_seqlens_q"], seqused_k=n["seqused_k"],
                max_seqlen_q=5, max_seqlen_k=20, softmax_scale=0.125, causal=True, block_table=n["block_table"],
                window_left=-1, softcap=0.0)
    args.update({k: (f(args) if callable(f) else f) for k, f in change.items()})
    ops.flash_attn_varlen(**args)


def ints(*values):
    return torch.tensor(values, dtype=torch.int32, device="npu")


def with_entry(t, index, value):
    t = t.cpu().clone()
    t[index] = value
    return t.npu()


@pytest.mark.parametrize("change, error, message", [
    (dict(block_table=lambda a: with_entry(a["block_table"], (0, 1), 1000)), IndexError,
     r"block_table\[0\]\[1\]: block id 1000 is out of range for \d+ cache blocks \(expected 0 <= id < \d+\)"),
    (dict(block_table=lambda a: with_entry(a["block_table"], (1, 0), -1)), IndexError,
     r"block_table\[1\]\[0\]: block id -1 is out of range"),
    (dict(seqused_k=ints(20, 100), max_seqlen_k=100), IndexError,
     r"seqused_k\[1\]: expected 0 <= seqused_k <= min\(max_blocks_per_seq \* block_size = 4 \* 16, "
     r"max_seqlen_k = 100\) but found 100"),
    (dict(max_seqlen_k=19), IndexError, r"seqused_k\[0\]: .*max_seqlen_k = 19\) but found 20"),
    (dict(seqused_k=ints(20, -3)), IndexError, r"seqused_k\[1\]: .* but found -3"),
    (dict(seqused_k=ints(4, 9)), RuntimeError,
     r"seqused_k\[0\]: expected at least the sequence's 5 query tokens \(causal: they are the last of its cached "
     r"tokens\) but found 4"),
    (dict(cu_seqlens_q=ints(0, 5, 3)), RuntimeError,
     r"cu_seqlens_q: expected non-decreasing values but found cu_seqlens_q\[2\] = 3 < cu_seqlens_q\[1\] = 5"),
    (dict(cu_seqlens_q=ints(1, 5, 6)), RuntimeError, r"cu_seqlens_q\[0\]: expected 0 but found 1"),
    (dict(cu_seqlens_q=ints(0, 5, 100)), IndexError,
     r"cu_seqlens_q\[2\]: expected at most num_tokens = 9 \(query's rows\) but found 100"),
    (dict(max_seqlen_q=4), RuntimeError,
     r"cu_seqlens_q: expected sequences of at most max_seqlen_q = 4 query tokens but found "
     r"cu_seqlens_q\[1\] - cu_seqlens_q\[0\] = 5"),
    (dict(cu_seqlens_q=lambda a: a["cu_seqlens_q"].long()), RuntimeError,
     r"cu_seqlens_q: expected dtype int32 but found int64"),
    (dict(seqused_k=ints(20)), RuntimeError,
     r"seqused_k \(\[num_seqs\], one fewer than cu_seqlens_q\): expected shape \[2\] but found \[1\]"),
    (dict(block_table=lambda a: a["block_table"][:1]), RuntimeError,
     r"block_table: expected one row per sequence \(2\) but found shape \[1, 4\]"),
    (dict(block_table=lambda a: a["block_table"].long()), RuntimeError,
     r"block_table: expected dtype int32 but found int64"),
    (dict(query=lambda a: a["query"].half()), RuntimeError,
     r"query \(out's dtype\): expected dtype float32 but found float16"),
    (dict(key_cache=lambda a: a["key_cache"].bfloat16()), RuntimeError,
     r"key_cache: expected dtype float32 but found bfloat16"),
    (dict(value_cache=lambda a: a["value_cache"][:, :8]), RuntimeError,
     r"value_cache \(key_cache's shape\): expected shape \[\d+, 16, 2, 64\] but found \[\d+, 8, 2, 64\]"),
    (dict(key_cache=lambda a: a["key_cache"][..., :32], value_cache=lambda a: a["value_cache"][..., :32]),
     RuntimeError, r"key_cache: expected head_size 64 \(query's\) but found 32"),
    (dict(key_cache=lambda a: torch.zeros(a["key_cache"].shape[0], 16, 3, 64, device="npu"),
          value_cache=lambda a: torch.zeros(a["key_cache"].shape[0], 16, 3, 64, device="npu")), RuntimeError,
     r"key_cache: expected num_kv_heads a positive divisor of query's num_heads = 4 but found 3"),
    (dict(out=lambda a: a["out"][:, :2]), RuntimeError, r"out \(query's shape\): expected shape \[9, 4, 64\] but found "
     r"\[9, 2, 64\]"),
    (dict(query=lambda a: a["query"][0]), RuntimeError, r"query: expected a 3-d tensor but found shape \[4, 64\]"),
    (dict(window_left=-2), RuntimeError, r"window_left: expected -1 \(no window\) or >= 0 but found -2"),
    (dict(softcap=-1.0), RuntimeError, r"softcap: expected 0 \(off\) or a positive finite number but found -1"),
    (dict(softmax_scale=math.inf), RuntimeError, r"softmax_scale: expected a finite number but found inf"),
    (dict(max_seqlen_q=-1), RuntimeError, r"max_seqlen_q, max_seqlen_k: expected >= 0 but found -1, 20"),
])
def test_errors_name_op_argument_expected_and_found(change, error, message):
    with pytest.raises(error, match="vllm_like::flash_attn_varlen: " + message):
        error_call(**change)


def test_the_meta_function_checks_what_the_kernel_checks():
    # Fake tensors see the same metadata errors (the kernel body is the meta
    # function up to its first data access).
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(9, 4, 64, device="npu")
        cache = torch.empty(10, 16, 2, 32, device="npu")
        cu, used = torch.empty(3, dtype=torch.int32, device="npu"), torch.empty(2, dtype=torch.int32, device="npu")
        table = torch.empty(2, 4, dtype=torch.int32, device="npu")
        with pytest.raises(RuntimeError, match=r"key_cache: expected head_size 64 \(query's\) but found 32"):
            ops.flash_attn_varlen(torch.empty_like(q), q, cache, cache, cu, used, 5, 20, 0.1, True, table)
