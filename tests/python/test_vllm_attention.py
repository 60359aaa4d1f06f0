"""vllm_like's paged_attention_v1 / v2 on npu tensors, through
npubridge.vllm._custom_ops: results against a float64 reference over the
contiguous K/V the paged cache holds (GQA, alibi, block sizes 8/16/32,
lengths 0, 1 and across partitions, shuffled blocks), with error bounds
derived from the float32 computation; v2's partition statistics; errors by
message."""

import pytest
import torch

import npubridge
from conftest import plugins_loaded_with
from npubridge.vllm import _custom_ops as ops

# The in-tree plugin is built with the extension: not loaded is a failure,
# never a skip (a broken build must not shrink the suite).
@pytest.fixture(autouse=True)
def _vllm_like_is_loaded():
    assert any(p["name"] == "vllm_like" for p in npubridge.plugins()), \
        f"the vllm_like plugin is not loaded: {npubridge.load_failures()}"

U32 = 2.0**-24
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def paged(k, v, lens, block_size, dtype, table_pad=2):
    """A paged cache holding k, v (lists of [L, kvh, D] float64) in dtype,
    blocks shuffled, free slots NaN, unused table entries out of range."""
    kvh, d = k[0].shape[1], k[0].shape[2]
    x = ops.kv_cache_x(dtype)
    counts = [(n + block_size - 1) // block_size for n in lens]
    nb = sum(counts) + 2
    ids = torch.randperm(nb)
    tables = torch.full((len(lens), max(counts) + table_pad), nb + 3, dtype=torch.int32)
    kc = torch.full((nb, kvh, d // x, block_size, x), float("nan"), dtype=dtype)
    vc = torch.full((nb, kvh, d, block_size), float("nan"), dtype=dtype)
    at = 0
    for i, (n, c) in enumerate(zip(lens, counts)):
        tables[i, :c] = ids[at:at + c].int()
        at += c
        for t in range(n):
            b, off = int(tables[i, t // block_size]), t % block_size
            kc[b, :, :, off, :] = k[i][t].reshape(kvh, d // x, x).to(dtype)
            vc[b, :, :, off] = v[i][t].to(dtype)
    return kc.to("npu"), vc.to("npu"), tables.to("npu"), torch.tensor(lens, dtype=torch.int32).to("npu")


def problem(lens, h, kvh, d, dtype, q_scale=1.0):
    # Inputs rounded to dtype first, so the reference sees the kernel's inputs.
    q = (q_scale * torch.randn(len(lens), h, d)).to(dtype).double()
    k = [torch.randn(n, kvh, d).to(dtype).double() for n in lens]
    v = [torch.randn(n, kvh, d).to(dtype).double() for n in lens]
    return q, k, v


def reference(q, k, v, lens, scale, slopes=None):
    """float64 attention of each sequence's query over its tokens, with
    vLLM's 1e-6 in the denominator; and the bound of the float32 kernel's
    error per sequence and head (see bound())."""
    h, d = q.shape[1], q.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, n in enumerate(lens):
        if n == 0:
            continue
        kk = k[i].repeat_interleave(h // k[i].shape[1], 1)
        vv = v[i].repeat_interleave(h // v[i].shape[1], 1)
        s = scale * torch.einsum("hd,thd->ht", q[i], kk)
        if slopes is not None:
            s = s + slopes.double()[:, None] * (torch.arange(n, dtype=torch.float64) - (n - 1))
        p = torch.exp(s - s.amax(1, keepdim=True))
        out[i] = torch.einsum("ht,thd->hd", p, vv) / (p.sum(1)[:, None] + 1e-6)
    return out


def score_error(q_row, kk, scale, alibi_max=0.0):
    """Bound of a float32 score's error, per head: the dot product's
    gamma_D * scale * sum|q_d k_d|, and the roundings of the scaling and the
    alibi addition (u each, of values below sum|q k| * scale + |alibi|)."""
    d = q_row.shape[-1]
    dots = scale * torch.einsum("hd,thd->ht", q_row.abs(), kk.abs()).amax(1)
    return d * U32 / (1 - d * U32) * dots + 2 * U32 * (dots + alibi_max)


def bound(q, k, v, lens, scale, dtype, out, partitions=False, slopes=None):
    """Per element: the final rounding to dtype, plus the float32 pipeline's
    error. A score carries at most score_error(); an error e in the scores
    changes the softmax weights by a relative 2e, hence the output, a convex
    combination of V rows, by 2e max|v|; exp, the sum of n weights and the
    weighted sum of n rows add (n + 8) u max|v| (Higham's gamma_n). v2
    stores each partition's output in dtype before the reduction: one more
    rounding of a value bounded by max|v|."""
    b = torch.zeros(q.shape, dtype=torch.float64)
    for i, n in enumerate(lens):
        if n == 0:
            continue
        kk = k[i].repeat_interleave(q.shape[1] // k[i].shape[1], 1)
        alibi_max = 0.0 if slopes is None else float(slopes.abs().max()) * n
        e = score_error(q[i], kk, scale, alibi_max)
        vmax = v[i].abs().amax()
        b[i] = 4 * (2 * e[:, None] + (n + 8) * U32) * vmax
        if partitions and dtype != torch.float32:
            b[i] += 2 * UNIT[dtype] * vmax
    return b + 2 * UNIT[dtype] * out.abs()


def check(got, ref, b):
    err = (got.cpu().double() - ref).abs()
    assert torch.isfinite(got.cpu()).all()
    worst = (err - b).argmax()
    assert (err <= b).all(), f"error {err.flatten()[worst]} > bound {b.flatten()[worst]} at {worst}"


def run_v1(q, kc, vc, kvh, scale, tables, lens_t, bs, max_len, dtype, slopes=None):
    out = torch.empty(q.shape, dtype=dtype, device="npu")
    ops.paged_attention_v1(out, q.to(dtype).to("npu"), kc, vc, kvh, scale, tables, lens_t, bs, max_len,
                           None if slopes is None else slopes.to("npu"), "auto")
    return out


def v2_buffers(q, max_len, dtype):
    s, h, d = q.shape
    parts = (max_len + 511) // 512
    es = torch.full((s, h, parts), 7.0, device="npu")
    return (torch.empty(q.shape, dtype=dtype, device="npu"), es, es.clone(),
            torch.full((s, h, parts, d), 7.0, dtype=dtype, device="npu"))


def run_v2(q, kc, vc, kvh, scale, tables, lens_t, bs, max_len, dtype, slopes=None):
    out, es, ml, tmp = v2_buffers(q, max_len, dtype)
    ops.paged_attention_v2(out, es, ml, tmp, q.to(dtype).to("npu"), kc, vc, kvh, scale, tables, lens_t, bs,
                           max_len, None if slopes is None else slopes.to("npu"), "auto")
    return out, es, ml, tmp


CASES = [  # lens, heads, kv heads, head size, block size, alibi
    ([1, 17, 100, 0], 4, 4, 64, 16, False),
    ([5, 64, 130], 8, 2, 128, 8, False),
    ([1, 33, 200], 4, 1, 64, 32, True),
    ([3, 45], 2, 2, 32, 4, False),  # a block size without a compile-time loop
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_v1_matches_float64_reference(dtype, case):
    lens, h, kvh, d, bs, alibi = CASES[case]
    torch.manual_seed(case)
    q, k, v = problem(lens, h, kvh, d, dtype, q_scale=2.0)
    slopes = torch.rand(h) * 0.3 if alibi else None
    kc, vc, tables, lens_t = paged(k, v, lens, bs, dtype)
    scale = d**-0.5
    out = run_v1(q, kc, vc, kvh, scale, tables, lens_t, bs, max(lens), dtype, slopes)
    ref = reference(q, k, v, lens, scale, slopes)
    check(out, ref, bound(q, k, v, lens, scale, dtype, ref, slopes=slopes))
    assert (out.cpu()[torch.tensor(lens) == 0] == 0).all()  # a seq_len of 0 gives 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_v2_partitions_and_reduction(dtype):
    torch.manual_seed(1)
    lens, h, kvh, d, bs = [1, 511, 512, 513, 1300], 4, 2, 64, 16
    q, k, v = problem(lens, h, kvh, d, dtype, q_scale=2.0)
    slopes = torch.rand(h) * 0.01
    kc, vc, tables, lens_t = paged(k, v, lens, bs, dtype)
    scale = d**-0.5
    out, es, ml, tmp = run_v2(q, kc, vc, kvh, scale, tables, lens_t, bs, max(lens), dtype, slopes)
    ref = reference(q, k, v, lens, scale, slopes)
    check(out, ref, bound(q, k, v, lens, scale, dtype, ref, partitions=True, slopes=slopes))
    es, ml, tmp = es.cpu(), ml.cpu(), tmp.cpu()
    for i, n in enumerate(lens):
        parts = (n + 511) // 512
        # Partitions the sequence does not reach keep their contents (as in vLLM).
        assert (es[i, :, parts:] == 7).all() and (ml[i, :, parts:] == 7).all() and (tmp[i, :, parts:] == 7).all()
        for p in range(parts):
            t0, t1 = 512 * p, min(n, 512 * (p + 1))
            # The partition alone: its tokens' positions are those of the whole sequence (alibi).
            kk = k[i][t0:t1].repeat_interleave(h // kvh, 1)
            s = scale * torch.einsum("hd,thd->ht", q[i], kk) + slopes.double()[:, None] * (
                torch.arange(t0, t1, dtype=torch.float64) - (n - 1))
            m = s.amax(1)
            e = score_error(q[i], kk, scale, float(slopes.abs().max()) * n)
            assert ((ml[i, :, p].double() - m).abs() <= e).all()
            # sum_t exp(s_t - m): each term off by a relative 2e (two scores) plus exp's few ulps, and
            # the sum of n terms by gamma_n.
            l = torch.exp(s - m[:, None]).sum(1)
            assert ((es[i, :, p].double() - l).abs() <= (2 * e + (t1 - t0 + 8) * U32) * l).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bs", [24, 40, 1024])
def test_v2_with_block_sizes_that_do_not_divide_the_partition(bs, dtype):
    # A 512-token partition starts and ends inside a block (24, 40), or one
    # block spans several partitions (1024).
    torch.manual_seed(bs)
    lens, h, kvh, d = [1, 500, 530, 1100], 2, 1, 32
    q, k, v = problem(lens, h, kvh, d, dtype, q_scale=2.0)
    kc, vc, tables, lens_t = paged(k, v, lens, bs, dtype, table_pad=1)
    scale = d**-0.5
    out = run_v2(q, kc, vc, kvh, scale, tables, lens_t, bs, max(lens), dtype)[0]
    ref = reference(q, k, v, lens, scale)
    check(out, ref, bound(q, k, v, lens, scale, dtype, ref, partitions=True))


def test_v2_equals_v1_within_rounding_and_helper_picks_by_vllms_rule():
    torch.manual_seed(2)
    lens, h, kvh, d, bs = [900, 20], 2, 2, 64, 16
    q, k, v = problem(lens, h, kvh, d, torch.float32)
    kc, vc, tables, lens_t = paged(k, v, lens, bs, torch.float32)
    out1 = run_v1(q, kc, vc, kvh, 0.125, tables, lens_t, bs, 900, torch.float32)
    out2 = torch.empty_like(out1)
    assert ops.paged_attention(out2, q.float().to("npu"), kc, vc, kvh, 0.125, tables, lens_t, bs, 900) == "v2"
    ref = reference(q, k, v, lens, 0.125)
    b1 = bound(q, k, v, lens, 0.125, torch.float32, ref)
    b2 = bound(q, k, v, lens, 0.125, torch.float32, ref, partitions=True)
    check(out1, ref, b1)
    check(out2, ref, b2)
    # Both within their bounds of the reference: within the sum of each other.
    check(out1, out2.cpu().double(), b1 + b2)
    assert ops.use_v1(512, 1, 1) and ops.use_v1(8192, 32, 32) and not ops.use_v1(8192, 4, 32)
    assert not ops.use_v1(8193, 1000, 32)


def test_free_slots_are_never_read():
    # NaN fills every free slot (paged() does): the tail of each last block
    # and the spare blocks; a result read from one would be NaN.
    torch.manual_seed(3)
    lens = [3, 19]
    q, k, v = problem(lens, 2, 1, 32, torch.float32)
    kc, vc, tables, lens_t = paged(k, v, lens, 16, torch.float32)
    out = run_v1(q, kc, vc, 1, 0.1, tables, lens_t, 16, 19, torch.float32)
    assert torch.isfinite(out.cpu()).all()


def error_call(**change):
    torch.manual_seed(4)
    lens = [20, 9]
    q, k, v = problem(lens, 4, 2, 64, torch.float32)
    kc, vc, tables, lens_t = paged(k, v, lens, 16, torch.float32)
    a = dict(out=torch.empty(2, 4, 64, device="npu"), query=q.float().to("npu"), key_cache=kc, value_cache=vc,
             num_kv_heads=2, scale=0.125, block_tables=tables, seq_lens=lens_t, block_size=16, max_seq_len=20,
             alibi_slopes=None, kv_cache_dtype="auto")
    a.update({name: (f(a) if callable(f) else f) for name, f in change.items()})
    ops.paged_attention_v1(**a)


def with_entry(t, i, j, value):
    t = t.cpu().clone()
    t[i, j] = value
    return t.to("npu")


@pytest.mark.parametrize("change, error, message", [
    (dict(block_tables=lambda a: with_entry(a["block_tables"], 0, 1, 1000)), IndexError,
     r"block_tables\[0\]\[1\]: block id 1000 is out of range for \d+ cache blocks"),
    (dict(block_tables=lambda a: with_entry(a["block_tables"], 1, 0, -2)), IndexError,
     r"block_tables\[1\]\[0\]: block id -2 is out of range"),
    (dict(seq_lens=lambda a: torch.tensor([20, 100], dtype=torch.int32, device="npu"), max_seq_len=100),
     IndexError, r"seq_lens\[1\]: expected 0 <= seq_len <= min\(max_blocks_per_seq \* block_size = 64, "
     r"max_seq_len = 100\) but found 100"),
    (dict(max_seq_len=19), IndexError, r"seq_lens\[0\]: .* max_seq_len = 19\) but found 20"),
    (dict(seq_lens=lambda a: torch.tensor([20, -1], dtype=torch.int32, device="npu")), IndexError,
     r"seq_lens\[1\]: .* but found -1"),
    (dict(key_cache=lambda a: a["key_cache"].cpu().reshape(a["key_cache"].shape[0], 2, 8, 16, 8).to("npu")),
     RuntimeError, r"key_cache: expected the layout \[num_blocks, num_kv_heads, head_size/x, block_size, x\] with "
     r"x = 16 / 4 = 4 for float32, but found x = 8"),
    (dict(kv_cache_dtype="fp8"), RuntimeError, r"kv_cache_dtype: expected 'auto' .* but found 'fp8'"),
    (dict(num_kv_heads=4), RuntimeError, r"num_kv_heads: expected key_cache's 2"),
    (dict(alibi_slopes=torch.zeros(3, device="npu")), RuntimeError,
     r"alibi_slopes \(\[num_heads\]\): expected shape \[4\] but found \[3\]"),
    (dict(block_size=8), RuntimeError, r"block_size: expected key_cache's 16"),
])
def test_errors_name_op_argument_expected_and_found(change, error, message):
    with pytest.raises(error, match="vllm_like::paged_attention_v1: " + message):
        error_call(**change)


def test_v2_refuses_too_few_partitions():
    torch.manual_seed(5)
    q, k, v = problem([700], 2, 2, 64, torch.float32)
    kc, vc, tables, lens_t = paged(k, v, [700], 16, torch.float32)
    out, es, ml, tmp = v2_buffers(q, 700, torch.float32)
    with pytest.raises(RuntimeError, match=r"paged_attention_v2: exp_sums: expected \[num_seqs, num_heads, "
                       r"max_num_partitions\] with max_num_partitions >= ceil\(max_seq_len / 512\) = 2"):
        ops.paged_attention_v2(out, es[:, :, :1], ml[:, :, :1], tmp[:, :, :1], q.float().to("npu"), kc, vc, 2, 0.1,
                               tables, lens_t, 16, 700, None, "auto")


def test_the_retired_isa_cap_is_refused_naming_the_one_cap():
    # The cap is NPUB_PLUGINS_MAX_ISA (test_settings.py); a value in the
    # retired per-plugin name is refused rather than ignored.
    names, failures = plugins_loaded_with(NPUB_VLLM_MAX_ISA="avx2")
    assert "vllm_like" not in names
    assert ("NPUB_VLLM_MAX_ISA: expected unset (the in-tree plugins read one cap, NPUB_PLUGINS_MAX_ISA) "
            "but found 'avx2'") in failures
