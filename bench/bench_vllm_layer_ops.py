"""vllm_like's layer ops against the ATen composites a model writes without
them, both on npu, at Llama-like sizes (TinyLlama: 512 tokens, hidden 2048,
intermediate 5632, 32 query / 4 key-value heads of 64): median times and the
ratio composite / fused, per dtype. A quick check, not a recorded benchmark
(these machines are noisy: compare the ratios of one run).

Usage: PYTHONPATH=build/release/python python3 bench/bench_vllm_layer_ops.py
"""
import os
import sys

import torch
import torch.nn.functional as F

import npubridge  # noqa: F401  (registers the npu backend)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import timed  # noqa: E402

ops = torch.ops.vllm_like
T, HID, INTER, H, KV, D = 512, 2048, 5632, 32, 4, 64
REPS = 15


def timed_npu(fn):
    def run():
        fn()
        torch.npu.synchronize()
    return timed(run, REPS)


def rotate_half(x):
    x1, x2 = x[..., :x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rows_for(dt):
    """(op, composite seconds, fused seconds) per op."""
    rows = []
    x = torch.randn(T, 2 * INTER, dtype=dt).npu()
    out = torch.empty(T, INTER, dtype=dt).npu()
    a, b = x[:, :INTER], x[:, INTER:]
    for name, fused, comp in (
            ("silu_and_mul", lambda: ops.silu_and_mul(out, x), lambda: F.silu(a) * b),
            ("gelu_and_mul", lambda: ops.gelu_and_mul(out, x), lambda: F.gelu(a) * b),
            ("gelu_tanh_and_mul", lambda: ops.gelu_tanh_and_mul(out, x),
             lambda: F.gelu(a, approximate="tanh") * b)):
        rows.append((name, timed_npu(comp), timed_npu(fused)))

    h, r = torch.randn(T, HID, dtype=dt).npu(), torch.randn(T, HID, dtype=dt).npu()
    w = torch.randn(HID, dtype=dt).npu()
    o = torch.empty_like(h)

    def rms_composite(v):  # HF's LlamaRMSNorm
        f = v.float()
        return w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt)

    def add_rms_composite():
        s = h + r
        return rms_composite(s), s

    rows.append(("rms_norm", timed_npu(lambda: rms_composite(h)), timed_npu(lambda: ops.rms_norm(o, h, w, 1e-6))))
    rows.append(("fused_add_rms_norm", timed_npu(add_rms_composite),
                 timed_npu(lambda: ops.fused_add_rms_norm(h, r, w, 1e-6))))

    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    freqs = torch.outer(torch.arange(4096).float(), inv_freq)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1).to(dt).npu()
    cos = torch.cat([freqs.cos(), freqs.cos()], -1).to(dt).npu()
    sin = torch.cat([freqs.sin(), freqs.sin()], -1).to(dt).npu()
    pos = torch.randint(0, 4096, (T,)).npu()
    q, k = torch.randn(T, H * D, dtype=dt).npu(), torch.randn(T, KV * D, dtype=dt).npu()

    def rotary_composite():  # HF's apply_rotary_pos_emb
        c, s = cos[pos][:, None], sin[pos][:, None]
        qq, kk = q.view(T, H, D), k.view(T, KV, D)
        return qq * c + rotate_half(qq) * s, kk * c + rotate_half(kk) * s

    rows.append(("rotary_embedding (neox)", timed_npu(rotary_composite),
                 timed_npu(lambda: ops.rotary_embedding(pos, q, k, D, cache, True))))
    return rows


def main():
    for dt in (torch.float32, torch.bfloat16):
        print(f"--- {dt} tokens={T} hidden={HID} intermediate={INTER} heads={H}/{KV} x {D}")
        for name, tc, tf in rows_for(dt):
            print(f"{name:26s} composite {tc * 1e3:8.3f} ms  fused {tf * 1e3:8.3f} ms  ratio {tc / tf:6.2f}x")


if __name__ == "__main__":
    main()
