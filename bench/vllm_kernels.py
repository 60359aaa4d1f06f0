"""Kernel benchmarks of vllm_like's paged attention, for the engine bench
(bench/bench_vllm.py, ./scripts/bench.sh vllm) and on their own:

    PYTHONPATH=build/release/python python3 bench/vllm_kernels.py [--quick] [--only sdpa|v2|flash] [--json PATH]

decode_vs_sdpa: paged_attention_v1 over a paged cache (shuffled blocks) on
the npu against torch.nn.functional.scaled_dot_product_attention over
contiguous K/V of the same lengths on CPU tensors. The npu is simulated on
this CPU, so PyTorch's own CPU attention on the same cores is the reference
a user would otherwise run; it gets its best case: contiguous caches (no
block table to follow), one batched call, equal lengths (no mask) and
GQA without expanded K/V (enable_gqa). Both sides compute the same decode
step: one query token per sequence against all its cached tokens.

v2_vs_v1: paged_attention_v2 against v1 at long context with few
sequences (4 sequences of 16k tokens by default), where vLLM picks v2.
What v2 buys on a GPU is parallelism: v1 has one thread block per (sequence,
head), too few to fill the device when sequences are few. On this device
(2 compute threads) v1 runs one work item per (sequence, KV head) and
already has 4 x 8 = 32 equal items for 2 threads, and both versions read
each cached K and V element exactly once, so a partition's smaller working
set (its scores stay in L1; v1's 16k scores per head go out to L3 between
its passes) saves little; each partition also pays its own start-up and
reductions. v2 can win only where v1 has fewer (sequence, KV head) items
than threads, or a count they do not divide: the two extra cases measure
that (1 and 3 sequences with one KV head), and they need the second core
free.

flash_prefill: flash_attn_varlen (vLLM V1's attention) on a causal prefill
of 4 sequences x 512 tokens, 8 heads over 4 KV heads, head_size 64,
float32, from a flash-layout cache with shuffled blocks, in GFLOP/s (the
4 * head_size multiply-adds of each (query, key) pair a row sees, per head)
against the rate of a plain torch.mm on the npu (1024 x 512 x 1024: the
plugins' GEMM, which the kernel's smaller tiles also run on, on a product
that fills the threads) and against
torch.nn.functional.scaled_dot_product_attention on CPU tensors (contiguous
K/V, is_causal, GQA without expanded K/V), counted with the same FLOPs.
flash_decode: flash_attn_varlen on a decode step (one query token per
sequence) against paged_attention_v1 on the same lengths (vLLM's legacy
layout): the two paths vLLM's backends take for decode.

Times are medians of interleaved runs (A, B, A, B, ...), so that the load
of a shared machine falls on both alike; ratios are time(ours) / time(ref)
for decode_vs_sdpa and time(v1) / time(v2) (speed-up) for v2_vs_v1.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from npubridge.vllm import _custom_ops as ops


def _medians(fns, reps, settle=0.0):
    """One warm-up each, then interleaved timed runs: ([median wall time of
    each], [least CPU time of each]). The CPU time (all of the process's
    threads) is what a run costs even while other processes hold the cores;
    the wall time is what the benchmark's targets judge. `settle` seconds
    of sleep before each run (not timed) let the threads of the previous one
    stop spinning: PyTorch's OpenMP workers spin for a while after a CPU op
    and would take the cores from the next run's npu threads."""
    for f in fns:
        f()
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            if settle:
                time.sleep(settle)
            c, t = time.process_time(), time.perf_counter()
            f()
            wall[i].append(time.perf_counter() - t)
            cpu[i].append(time.process_time() - c)
    return [statistics.median(w) for w in wall], [min(c) for c in cpu]


def _median_pair(fa, fb, reps):
    """_medians of two: (median wall time of A, of B, least CPU time of A, of B)."""
    (wa, wb), (ca, cb) = _medians((fa, fb), reps)
    return wa, wb, ca, cb


def _paged_from_contiguous(k, v, block_size, device):
    """The paged legacy-layout caches holding contiguous k, v [S, KVH, L, D]
    (blocks shuffled), with their block table."""
    s, kvh, length, d = k.shape
    x = ops.kv_cache_x(k.dtype)
    per_seq = (length + block_size - 1) // block_size
    num_blocks = s * per_seq
    ids = torch.randperm(num_blocks).reshape(s, per_seq)
    pad = per_seq * block_size - length
    kp = F.pad(k, (0, 0, 0, pad)).reshape(s, kvh, per_seq, block_size, d // x, x)
    vp = F.pad(v, (0, 0, 0, pad)).reshape(s, kvh, per_seq, block_size, d)
    key_cache = torch.empty(num_blocks, kvh, d // x, block_size, x, dtype=k.dtype)
    value_cache = torch.empty(num_blocks, kvh, d, block_size, dtype=k.dtype)
    key_cache[ids.reshape(-1)] = kp.permute(0, 2, 1, 4, 3, 5).reshape(num_blocks, kvh, d // x, block_size, x)
    value_cache[ids.reshape(-1)] = vp.permute(0, 2, 1, 4, 3).reshape(num_blocks, kvh, d, block_size)
    return key_cache.to(device), value_cache.to(device), ids.int().to(device)


def _problem(num_seqs, num_heads, num_kv_heads, head_size, length, dtype, block_size, device):
    torch.manual_seed(0)
    q = torch.randn(num_seqs, num_heads, head_size, dtype=dtype)
    k = torch.randn(num_seqs, num_kv_heads, length, head_size, dtype=dtype)
    v = torch.randn(num_seqs, num_kv_heads, length, head_size, dtype=dtype)
    key_cache, value_cache, tables = _paged_from_contiguous(k, v, block_size, device)
    lens = torch.full((num_seqs, ), length, dtype=torch.int32, device=device)
    return q, k, v, key_cache, value_cache, tables, lens


def _device_threads():
    import npubridge
    return npubridge.npu.get_device_properties().multi_processor_count  # the device's compute threads


def _sync(device):
    if device != "cpu":
        import npubridge
        npubridge.npu.synchronize()


def decode_vs_sdpa(quick=False, device="npu"):
    """paged_attention_v1 (npu) against CPU SDPA over contiguous K/V: per case
    the two median times and ratio = paged / sdpa (target <= 1.25), and the
    largest difference of the results (float32 reference)."""
    cases = [(8, 32, 8, 128, 1024, torch.float32), (8, 32, 8, 128, 4096, torch.float32),
             (8, 32, 8, 128, 4096, torch.bfloat16), (16, 32, 32, 64, 2048, torch.float32)]
    if quick:
        cases = [(4, 16, 4, 128, 1024, torch.float32), (4, 16, 4, 128, 1024, torch.bfloat16)]
    reps = 5 if quick else 11
    results = []
    for s, h, kvh, d, length, dtype in cases:
        q, k, v, key_cache, value_cache, tables, lens = _problem(s, h, kvh, d, length, dtype, 16, device)
        qn, out = q.to(device), torch.empty(s, h, d, dtype=dtype, device=device)
        scale = d ** -0.5
        q4 = q.unsqueeze(2)

        def paged():
            ops.paged_attention_v1(out, qn, key_cache, value_cache, kvh, scale, tables, lens, 16, length, None,
                                   "auto")
            _sync(device)

        def sdpa():
            return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=kvh != h)

        t_paged, t_sdpa, c_paged, c_sdpa = _median_pair(paged, sdpa, reps)
        diff = (out.cpu().float() - sdpa().squeeze(2).float()).abs().max().item()
        results.append(dict(num_seqs=s, num_heads=h, num_kv_heads=kvh, head_size=d, context=length,
                            dtype=str(dtype).replace("torch.", ""), block_size=16, paged_v1_ms=t_paged * 1e3,
                            sdpa_ms=t_sdpa * 1e3, ratio=t_paged / t_sdpa, paged_v1_cpu_ms=c_paged * 1e3,
                            sdpa_cpu_ms=c_sdpa * 1e3, cpu_ratio=c_paged / c_sdpa, max_abs_diff=diff))
    worst = max(r["ratio"] for r in results)
    return dict(name="paged_attention_v1 vs CPU SDPA (contiguous K/V)", target_ratio=1.25, worst_ratio=worst,
                met=worst <= 1.25, torch_threads=torch.get_num_threads(), device_threads=_device_threads(),
                cases=results)


def v2_vs_v1(quick=False, device="npu"):
    """paged_attention_v2 against v1, 4 sequences of 16k tokens (quick: 4k):
    median times and speedup = time(v1) / time(v2) (target >= 1.2)."""
    # The target cases (4 sequences of 16k), then two with fewer (sequence,
    # KV head) items than the device has threads or not a multiple of them,
    # where v1 cannot keep every core busy and v2's partitions can.
    cases = [(4, 32, 8, 128, 16384, torch.float32), (4, 32, 8, 128, 16384, torch.bfloat16),
             (1, 8, 1, 128, 16384, torch.float32), (3, 8, 1, 128, 16384, torch.float32)]
    targets = 2
    if quick:
        cases, targets = [(4, 16, 4, 128, 4096, torch.float32), (1, 8, 1, 128, 4096, torch.float32)], 1
    reps = 5 if quick else 9
    results = []
    for s, h, kvh, d, length, dtype in cases:
        q, k, v, key_cache, value_cache, tables, lens = _problem(s, h, kvh, d, length, dtype, 16, device)
        del k, v
        qn = q.to(device)
        out1 = torch.empty(s, h, d, dtype=dtype, device=device)
        out2 = torch.empty_like(out1)
        parts = (length + ops.PARTITION_SIZE - 1) // ops.PARTITION_SIZE
        exp_sums = torch.empty(s, h, parts, dtype=torch.float32, device=device)
        max_logits = torch.empty_like(exp_sums)
        tmp_out = torch.empty(s, h, parts, d, dtype=dtype, device=device)
        scale = d ** -0.5

        def v1():
            ops.paged_attention_v1(out1, qn, key_cache, value_cache, kvh, scale, tables, lens, 16, length, None,
                                   "auto")
            _sync(device)

        def v2():
            ops.paged_attention_v2(out2, exp_sums, max_logits, tmp_out, qn, key_cache, value_cache, kvh, scale,
                                   tables, lens, 16, length, None, "auto")
            _sync(device)

        t1, t2, c1, c2 = _median_pair(v1, v2, reps)
        diff = (out1.cpu().float() - out2.cpu().float()).abs().max().item()
        results.append(dict(num_seqs=s, num_heads=h, num_kv_heads=kvh, head_size=d, context=length,
                            dtype=str(dtype).replace("torch.", ""), v1_ms=t1 * 1e3, v2_ms=t2 * 1e3,
                            speedup=t1 / t2, v1_cpu_ms=c1 * 1e3, v2_cpu_ms=c2 * 1e3, cpu_speedup=c1 / c2,
                            max_abs_diff_v1_v2=diff,
                            vllm_picks="v1" if ops.use_v1(length, s, h) else "v2"))
    for i, r in enumerate(results):
        r["target_case"] = i < targets
    worst = min(r["speedup"] for r in results[:targets])
    return dict(name="paged_attention_v2 vs v1 (few sequences, long context)", target_speedup=1.2,
                worst_target_speedup=worst, met=worst >= 1.2, device_threads=_device_threads(), cases=results)


def _flash_cache(k, v, block_size, device):
    """The flash-layout caches [num_blocks, block_size, KVH, D] holding
    contiguous k, v [S, KVH, L, D] (blocks shuffled), with their block table."""
    s, kvh, length, d = k.shape
    per_seq = (length + block_size - 1) // block_size
    num_blocks = s * per_seq
    ids = torch.randperm(num_blocks).reshape(s, per_seq)
    pad = per_seq * block_size - length
    key_cache = torch.empty(num_blocks, block_size, kvh, d, dtype=k.dtype)
    value_cache = torch.empty_like(key_cache)
    for x, cache in ((k, key_cache), (v, value_cache)):
        blocks = F.pad(x, (0, 0, 0, pad)).reshape(s, kvh, per_seq, block_size, d).permute(0, 2, 3, 1, 4)
        cache[ids.reshape(-1)] = blocks.reshape(num_blocks, block_size, kvh, d)
    return key_cache.to(device), value_cache.to(device), ids.int().to(device)


def flash_prefill(quick=False, device="npu"):
    """flash_attn_varlen on a causal prefill (4 x 512 tokens, 8/4 heads, head
    64, float32; quick: 2 x 256) in GFLOP/s, against the rate of torch.mm on
    the npu ([1024, 512] x [512, 1024]: the GEMM's rate on a product that
    fills the threads) and CPU SDPA (contiguous K/V) on the same problem;
    gemm_fraction = flash / mm, sdpa_ratio = flash / SDPA (GFLOP/s)."""
    s, length, h, kvh, d, bs = (2, 256, 8, 4, 64, 16) if quick else (4, 512, 8, 4, 64, 16)
    reps = 5 if quick else 9
    torch.manual_seed(0)
    q = torch.randn(s, h, length, d)
    k = torch.randn(s, kvh, length, d)
    v = torch.randn(s, kvh, length, d)
    key_cache, value_cache, table = _flash_cache(k, v, bs, device)
    query = q.transpose(1, 2).reshape(s * length, h, d).to(device)
    out = torch.empty_like(query)
    cu = (torch.arange(s + 1, dtype=torch.int32) * length).to(device)
    used = torch.full((s, ), length, dtype=torch.int32, device=device)
    scale = d**-0.5
    flops = 4 * d * h * s * length * (length + 1) / 2  # the (query, key) pairs a causal row sees
    m, kk, n = 1024, 512 if not quick else 128, 1024
    a, b = torch.randn(m, kk, device=device), torch.randn(kk, n, device=device)

    def flash():
        ops.flash_attn_varlen(out, query, key_cache, value_cache, cu, used, length, length, scale, True, table)
        _sync(device)

    def mm():
        torch.mm(a, b)
        _sync(device)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    (t_flash, t_mm, t_sdpa), cpu = _medians((flash, mm, sdpa), reps, settle=0.05)
    want = sdpa().transpose(1, 2).reshape(s * length, h, d)
    diff = (out.cpu() - want).abs().max().item()
    g_flash, g_mm, g_sdpa = flops / t_flash / 1e9, 2 * m * kk * n / t_mm / 1e9, flops / t_sdpa / 1e9
    return dict(name="flash_attn_varlen prefill vs npu GEMM and CPU SDPA", num_seqs=s, tokens_per_seq=length,
                num_heads=h, num_kv_heads=kvh, head_size=d, block_size=bs, dtype="float32", causal=True,
                flash_ms=t_flash * 1e3, flash_gflops=g_flash, mm_shape=[m, kk, n], mm_ms=t_mm * 1e3, mm_gflops=g_mm,
                sdpa_ms=t_sdpa * 1e3, sdpa_gflops=g_sdpa, gemm_fraction=g_flash / g_mm, sdpa_ratio=g_flash / g_sdpa,
                flash_cpu_ms=cpu[0] * 1e3, mm_cpu_ms=cpu[1] * 1e3, sdpa_cpu_ms=cpu[2] * 1e3, max_abs_diff=diff,
                torch_threads=torch.get_num_threads(), device_threads=_device_threads())


def flash_decode(quick=False, device="npu"):
    """flash_attn_varlen on a decode step against paged_attention_v1, same
    lengths and heads (each in its own cache layout, blocks shuffled):
    median times and ratio = flash / paged (1: as fast as the legacy layout's
    kernel)."""
    cases = [(8, 32, 8, 128, 1024, torch.float32), (8, 32, 8, 128, 2048, torch.bfloat16),
             (16, 32, 32, 64, 1024, torch.float32)]
    if quick:
        cases = [(4, 16, 4, 128, 512, torch.float32), (4, 16, 4, 128, 512, torch.bfloat16)]
    reps = 5 if quick else 9
    results = []
    for s, h, kvh, d, length, dtype in cases:
        q, k, v, key_cache, value_cache, tables, lens = _problem(s, h, kvh, d, length, dtype, 16, device)
        flash_k, flash_v, flash_tables = _flash_cache(k, v, 16, device)
        del k, v
        qn = q.to(device)
        out_paged, out_flash = torch.empty_like(qn), torch.empty_like(qn)
        cu = torch.arange(s + 1, dtype=torch.int32, device=device)
        scale = d**-0.5

        def paged():
            ops.paged_attention_v1(out_paged, qn, key_cache, value_cache, kvh, scale, tables, lens, 16, length, None,
                                   "auto")
            _sync(device)

        def flash():
            ops.flash_attn_varlen(out_flash, qn, flash_k, flash_v, cu, lens, 1, length, scale, True, flash_tables)
            _sync(device)

        (t_flash, t_paged), _ = _medians((flash, paged), reps)
        diff = (out_flash.cpu().float() - out_paged.cpu().float()).abs().max().item()
        results.append(dict(num_seqs=s, num_heads=h, num_kv_heads=kvh, head_size=d, context=length,
                            dtype=str(dtype).replace("torch.", ""), flash_ms=t_flash * 1e3, paged_v1_ms=t_paged * 1e3,
                            ratio=t_flash / t_paged, max_abs_diff=diff))
    return dict(name="flash_attn_varlen decode vs paged_attention_v1", worst_ratio=max(r["ratio"] for r in results),
                device_threads=_device_threads(), cases=results)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", choices=["sdpa", "v2", "flash"])
    p.add_argument("--json", metavar="PATH", help="also write the results there")
    a = p.parse_args(argv)
    # The machine's load when the run started: the cores may be shared.
    out = {"loadavg_1_5_15_min": list(os.getloadavg())}
    if a.only in (None, "sdpa"):
        out["decode_vs_sdpa"] = decode_vs_sdpa(a.quick)
    if a.only in (None, "v2"):
        out["v2_vs_v1"] = v2_vs_v1(a.quick)
    if a.only in (None, "flash"):
        out["flash_prefill"] = flash_prefill(a.quick)
        out["flash_decode"] = flash_decode(a.quick)
        f = out["flash_prefill"]
        print(f"flash_attn_varlen prefill: {f['flash_gflops']:.1f} GFLOP/s; torch.mm on npu {f['mm_gflops']:.1f} "
              f"GFLOP/s ({f['gemm_fraction']:.2f} of it); CPU SDPA {f['sdpa_gflops']:.1f} GFLOP/s "
              f"({f['sdpa_ratio']:.2f}x)")
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
