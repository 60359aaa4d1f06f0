"""mindspeed_like's fused ops and patching against what users run without them,
in one process and run: each figure is a ratio of two measurements taken
here, side by side (these machines are noisy; absolute times say little).

- rms_norm and swiglu, forward + backward: the fused op against the
  composite PyTorch users write, both on npu (the composite's ops run on
  cann_like); time, peak extra device memory and the memory a forward holds for
  backward.
- flash attention, forward + backward: mindspeed_like::npu_fusion_attention
  against PyTorch's own CPU scaled_dot_product_attention (time), and against
  attention that materialises the scores on npu (peak extra memory, and the
  working memory beyond the output and the gradients both allocate).
- fused AdamW over 50M parameters against torch.optim.AdamW on the CPU.
- end to end: a small transformers Llama trained on npu with
  npubridge.mindspeed.patch() and FusedAdamW against the same model on npu
  without them (mindspeed_like disabled: cann_like only), and against the
  CPU.

Usage: python3 bench/bench_mindspeed.py results.json [--quick]
(./scripts/bench.sh mindspeed). --quick runs small sizes, for a smoke test.
"""
import argparse
import json
import math
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import npubridge
import npubridge.mindspeed as ms
from timing import timed

warnings.filterwarnings("ignore")
torch.set_num_threads(2)

ops = torch.ops.mindspeed_like
results = []


def sync():
    torch.npu.synchronize()


def peak_extra_bytes(fn):
    """Device memory allocated by fn beyond what was live before it."""
    sync()
    torch.npu.reset_peak_memory_stats()
    base = torch.npu.memory_allocated()
    fn()
    sync()
    return torch.npu.max_memory_allocated() - base


def held_for_backward_bytes(fn, *inputs):
    """Device memory a forward keeps alive until its backward: allocated
    after the forward (the graph and its output alive) minus before, less
    the output itself. Counts what autograd saves however it is saved (a
    plugin op's derivative keeps its tensors in the autograd context)."""
    xs = [t.detach().requires_grad_(True) for t in inputs]
    sync()
    base = torch.npu.memory_allocated()
    y = fn(*xs)
    sync()
    held = torch.npu.memory_allocated() - base - y.numel() * y.element_size()
    del y
    return held


def record(name, **fields):
    fields = {"name": name, **fields}
    results.append(fields)
    verdicts = []
    for key, value in list(fields.items()):
        if key.endswith("_target"):
            measured = fields[key[: -len("_target")]]
            op, bound = value
            ok = measured >= bound if op == ">=" else measured <= bound
            verdicts.append(f"{key[: -len('_target')]} {measured:.3g} (target {op} {bound}) {'ok' if ok else 'MISSED'}")
            fields[key[: -len("_target")] + "_ok"] = ok
    shown = {k: v for k, v in fields.items() if k != "name" and not k.endswith(("_target", "_ok"))}
    extra = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())
    print(f"{name}\n    {extra}\n    " + "\n    ".join(verdicts), flush=True)


# --- rms_norm -----------------------------------------------------------------

def composite_rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def fused_rms_norm(x, w, eps=1e-6):
    return ops.npu_rms_norm(x, w, eps)[0]


def fwd_bwd(fn, *inputs):
    def run():
        xs = [t.detach().requires_grad_(True) for t in inputs]
        y = fn(*xs)
        y.backward(torch.ones_like(y))
        sync()
    return run


def bench_norm_like(name, fused, composite, inputs, reps, speed_target, held_ratio_target=None):
    t_fused = timed(fwd_bwd(fused, *inputs), reps)
    t_comp = timed(fwd_bwd(composite, *inputs), reps)
    m_fused = peak_extra_bytes(fwd_bwd(fused, *inputs))
    m_comp = peak_extra_bytes(fwd_bwd(composite, *inputs))
    held = {"fused": held_for_backward_bytes(fused, *inputs), "composite": held_for_backward_bytes(composite, *inputs)}
    fields = dict(fused_ms=t_fused * 1e3, composite_ms=t_comp * 1e3, speedup=t_comp / t_fused,
                  speedup_target=(">=", speed_target),
                  fused_peak_extra_mib=m_fused / 2**20, composite_peak_extra_mib=m_comp / 2**20,
                  memory_ratio=m_fused / m_comp,
                  fused_held_mib=held["fused"] / 2**20, composite_held_mib=held["composite"] / 2**20,
                  held_ratio=held["fused"] / held["composite"])
    if held_ratio_target is not None:
        fields["held_ratio_target"] = ("<=", held_ratio_target)
    record(name, **fields)


def bench_rms_norm(quick):
    rows, cols = (512, 1024) if quick else (8192, 4096)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, cols, dtype=dtype).npu()
        w = torch.randn(cols, dtype=dtype).npu()
        bench_norm_like(f"rms_norm fwd+bwd [{rows}, {cols}] {str(dtype)[6:]}", fused_rms_norm, composite_rms_norm,
                        (x, w), 3 if quick else 5, 2.0, held_ratio_target=0.99)


# --- swiglu ---------------------------------------------------------------------

def composite_swiglu(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def bench_swiglu(quick):
    rows, cols = (512, 1024) if quick else (4096, 2 * 5504)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, cols, dtype=dtype).npu()
        bench_norm_like(f"swiglu fwd+bwd [{rows}, {cols}] {str(dtype)[6:]}", lambda t: ops.npu_swiglu(t, -1),
                        composite_swiglu, (x,), 3 if quick else 5, 1.5, held_ratio_target=0.99)


# --- flash attention --------------------------------------------------------------

def materialised_attention(q, k, v, scale):
    p = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1)
    return p @ v


def fused_attention(q, k, v, scale):
    return ops.npu_fusion_attention(q, k, v, q.shape[1], "BNSD", scale=scale)[0]


def bench_attention(quick):
    heads, dim = 8, 64
    for s in ((256, 512) if quick else (1024, 2048, 4096, 8192)):
        scale = 1 / math.sqrt(dim)
        q, k, v = (torch.randn(1, heads, s, dim) for _ in range(3))
        qn, kn, vn = q.npu(), k.npu(), v.npu()
        reps = 1 if s >= 4096 else 3
        t_fused = timed(fwd_bwd(lambda a, b, c: fused_attention(a, b, c, scale), qn, kn, vn), reps)

        def cpu_sdpa(a, b, c):
            return F.scaled_dot_product_attention(a, b, c, scale=scale)

        def cpu_run():
            xs = [t.detach().requires_grad_(True) for t in (q, k, v)]
            y = cpu_sdpa(*xs)
            y.backward(torch.ones_like(y))
        t_cpu = timed(cpu_run, reps)
        m_fused = peak_extra_bytes(fwd_bwd(lambda a, b, c: fused_attention(a, b, c, scale), qn, kn, vn))
        m_mat = peak_extra_bytes(fwd_bwd(lambda a, b, c: materialised_attention(a, b, c, scale), qn, kn, vn))
        # What any attention allocates, fused or not: the output, its
        # gradient and the gradients of q, k and v. The rest is the
        # algorithm's own working memory, which the target is about.
        io = 5 * q.numel() * q.element_size()
        record(f"flash attention fwd+bwd B=1 H={heads} S={s} D={dim} fp32",
               fused_ms=t_fused * 1e3, cpu_sdpa_ms=t_cpu * 1e3, time_ratio=t_fused / t_cpu,
               time_ratio_target=("<=", 1.5),
               fused_peak_extra_mib=m_fused / 2**20, materialised_peak_extra_mib=m_mat / 2**20,
               peak_ratio=m_fused / m_mat, outputs_and_gradients_mib=io / 2**20,
               working_memory_ratio=(m_fused - io) / (m_mat - io), working_memory_ratio_target=("<=", 0.1))


# --- fused AdamW --------------------------------------------------------------------

def bench_adamw(quick):
    total = 2_000_000 if quick else 50_000_000
    sizes = [total // 50] * 50  # 50 tensors, as a model's parameters
    torch.manual_seed(0)
    cpu_params = [torch.randn(n) for n in sizes]
    grads = [torch.randn(n) for n in sizes]
    npu_params = [p.npu() for p in cpu_params]
    for p, g in zip(npu_params, grads):
        p.grad = g.npu()
    for p, g in zip(cpu_params, grads):
        p.grad = g
    fused = ms.FusedAdamW(npu_params, lr=1e-3, weight_decay=0.01)
    reps = 3 if quick else 5

    def fused_step():
        fused.step()
        sync()
    t_fused = timed(fused_step, reps)
    times = {}
    for foreach in (False, True):
        opt = torch.optim.AdamW(cpu_params, lr=1e-3, weight_decay=0.01, foreach=foreach)
        times[foreach] = timed(opt.step, reps)
    record(f"fused AdamW step over {total / 1e6:.0f}M parameters (50 tensors)", fused_ms=t_fused * 1e3,
           cpu_single_tensor_ms=times[False] * 1e3, cpu_foreach_ms=times[True] * 1e3,
           speedup_vs_single_tensor=times[False] / t_fused, speedup_vs_single_tensor_target=(">=", 2.0),
           speedup_vs_foreach=times[True] / t_fused, speedup_vs_foreach_target=(">=", 1.0))

    # torch.optim.AdamW(fused=True) itself (aten::_fused_adamw_, fused_adam.cpp,
    # transformers' default) against the CPU's fused kernel, on the same sizes.
    npu_torch = [p.detach().clone().requires_grad_() for p in npu_params]
    for p, g in zip(npu_torch, grads):
        p.grad = g.npu()
    opt_npu = torch.optim.AdamW(npu_torch, lr=1e-3, weight_decay=0.01, fused=True)
    opt_cpu = torch.optim.AdamW(cpu_params, lr=1e-3, weight_decay=0.01, fused=True)

    def torch_fused_step():
        opt_npu.step()
        sync()
    t_npu = timed(torch_fused_step, reps)
    t_cpu = timed(opt_cpu.step, reps)
    record(f"torch.optim.AdamW(fused=True) step over {total / 1e6:.0f}M parameters (50 tensors)",
           npu_ms=t_npu * 1e3, cpu_fused_ms=t_cpu * 1e3, speedup_vs_cpu_fused=t_cpu / t_npu)


# --- end to end -----------------------------------------------------------------------

def llama_config(quick):
    import transformers
    if quick:
        return transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    # about 20M parameters
    return transformers.LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)


def train(device, fused, quick, steps):
    """Trains a fresh copy of the same model; returns losses, seconds per step
    (median, after one warm-up step) and peak device bytes (npu)."""
    import transformers
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(quick))
    seq, batch = (128, 2) if quick else (512, 2)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen) for _ in range(steps + 1)]
    if device == "npu":
        if fused:
            npubridge.enable_plugin("mindspeed_like")
            ms.patch()
        else:
            npubridge.disable_plugin("mindspeed_like")
        model = model.to("npu")
        sync()
        torch.npu.reset_peak_memory_stats()
    opt_cls = ms.FusedAdamW if fused else torch.optim.AdamW
    opt = opt_cls(model.parameters(), lr=1e-4, weight_decay=0.01)
    losses, times = [], []
    try:
        for ids in batches:
            ids = ids.to(device)
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()  # synchronises
            times.append(time.perf_counter() - t)
            losses.append(value)
        peak = torch.npu.max_memory_allocated() if device == "npu" else 0
    finally:
        if device == "npu":
            ms.unpatch()
            npubridge.enable_plugin("mindspeed_like")
    nparams = sum(p.numel() for p in model.parameters())
    return losses[1:], statistics.median(times[1:]), peak, nparams


def bench_end_to_end(quick):
    steps = 4 if quick else 20
    fused_losses, t_fused, m_fused, nparams = train("npu", True, quick, steps)
    base_losses, t_base, m_base, _ = train("npu", False, quick, steps)
    _, t_cpu, _, _ = train("cpu", False, quick, min(steps, 6))
    worst = max(abs(a - b) for a, b in zip(fused_losses, base_losses))
    record(f"Llama {nparams / 1e6:.1f}M params, seq {128 if quick else 512}, {steps} training steps "
           "(patch() + FusedAdamW vs unpatched + AdamW, npu)",
           fused_step_s=t_fused, unfused_step_s=t_base, cpu_step_s=t_cpu,
           speedup=t_base / t_fused, speedup_target=(">=", 1.3),
           fused_peak_mib=m_fused / 2**20, unfused_peak_mib=m_base / 2**20,
           memory_ratio=m_fused / m_base, memory_ratio_target=("<=", 0.7),
           loss_max_abs_diff=worst, loss_max_abs_diff_target=("<=", 1e-3),
           speedup_vs_cpu=t_cpu / t_fused,
           losses_fused=[round(x, 6) for x in fused_losses], losses_unfused=[round(x, 6) for x in base_losses])


SECTIONS = {"rms_norm": bench_rms_norm, "swiglu": bench_swiglu, "attention": bench_attention,
            "adamw": bench_adamw, "end_to_end": bench_end_to_end}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="JSON file for the results")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    args = parser.parse_args()
    if "mindspeed_like" not in {p["name"] for p in npubridge.plugins()}:
        sys.exit("bench_mindspeed: the mindspeed_like plugin is not loaded: " + "; ".join(npubridge.load_failures()))
    for name, fn in SECTIONS.items():
        if not args.only or name in args.only:
            fn(args.quick)
    missed = [f"{r['name']}: {k[:-3]}" for r in results for k, v in r.items() if k.endswith("_ok") and not v]
    with open(args.out, "w") as f:
        json.dump({"machine": {"threads": torch.get_num_threads()}, "quick": args.quick, "results": results,
                   "missed": missed}, f, indent=1)
    print(f"\n{len(missed)} target(s) missed" + ("".join(f"\n  {m}" for m in missed) if missed else ""))


if __name__ == "__main__":
    main()
