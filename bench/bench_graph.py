"""Graph mode against eager mode, in one run (issue #18).

1. The tiny Llama (tests/python/test_llama.py's config) forward, and one training step (forward,
   cross-entropy, backward, SGD step): `torch.compile(backend="npu")` on npu against eager npu
   (target >= 1.3x faster), and against `torch.compile` with Inductor on the CPU (printed; beating
   it is the aim).
2. A one-token decode step of the same model with a static KV cache: NPUGraph replay against the
   same step run eagerly on npu (target >= 1.5x).
3. Peak device memory of the training step (torch.npu.max_memory_allocated over one step after
   warm-up): compiled against eager (target <= 0.85x).
4. The compiled graphs' nodes, fused patterns and fallbacks (npubridge.compile_report).

Samples of the two sides of each ratio are interleaved, so that the machine's noise falls on both;
the ratio is the median of the per-sample ratios. Nothing is asserted: misses are reported.
Usage: bench_graph.py [OUT.json] [--quick]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time
import warnings

import torch

import npubridge

TARGET_COMPILED = 1.3   # compiled npu over eager npu (speed-up)
TARGET_REPLAY = 1.5     # replay over eager decode (speed-up)
TARGET_MEMORY = 0.85    # compiled peak / eager peak of a training step


def tiny_llama(seed=0):
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg)


def _sync(device):
    if device.startswith("npu"):
        torch.npu.synchronize()


def paired(fa, fb, samples, inner, reset=None):
    """Median of per-sample time ratios t(fa) / t(fb), and each side's median time per call (s).
    `reset`, if given, runs untimed before each side's calls."""
    ta, tb, ratios = [], [], []
    for _ in range(samples):
        pair = []
        for f in (fa, fb):
            if reset is not None:
                reset()
            t = time.perf_counter()
            for _ in range(inner):
                f()
            pair.append((time.perf_counter() - t) / inner)
        ta.append(pair[0])
        tb.append(pair[1])
        ratios.append(pair[0] / pair[1])
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb)


def forward_and_step(quick):
    samples, inner = (5, 3) if quick else (15, 5)
    ids_cpu = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    ids = ids_cpu.to("npu")
    eager = tiny_llama().to("npu")
    compiled_model = tiny_llama().to("npu")
    compiled = torch.compile(compiled_model, backend="npu")
    cpu_model = tiny_llama()
    inductor = torch.compile(cpu_model)
    results = {}

    def fwd(model, x, device):
        def run():
            with torch.no_grad():
                out = model(x, use_cache=False).logits
            _sync(device)
            return out
        return run

    t = time.perf_counter()
    fwd(compiled, ids, "npu")()
    compile_fwd_s = time.perf_counter() - t
    t = time.perf_counter()
    fwd(inductor, ids_cpu, "cpu")()
    compile_inductor_s = time.perf_counter() - t
    for f in (fwd(eager, ids, "npu"), fwd(compiled, ids, "npu"), fwd(inductor, ids_cpu, "cpu")):
        f()
    r_ce, t_c, t_e = paired(fwd(compiled, ids, "npu"), fwd(eager, ids, "npu"), samples, inner)
    r_ci, _, t_i = paired(fwd(compiled, ids, "npu"), fwd(inductor, ids_cpu, "cpu"), samples, inner)
    results["forward"] = {
        "eager_npu_ms": t_e * 1e3, "compiled_npu_ms": t_c * 1e3, "inductor_cpu_ms": t_i * 1e3,
        "speedup_vs_eager": 1 / r_ce, "target": TARGET_COMPILED, "met": 1 / r_ce >= TARGET_COMPILED,
        "speedup_vs_inductor_cpu": 1 / r_ci, "first_call_s": compile_fwd_s,
        "inductor_first_call_s": compile_inductor_s}

    def step(model, x, device):
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def run():
            out = model(x, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(out[:, :-1].reshape(-1, 128), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
        return run

    s_eager, s_comp, s_ind = step(eager, ids, "npu"), step(compiled, ids, "npu"), step(inductor, ids_cpu, "cpu")
    t = time.perf_counter()
    s_comp()
    compile_step_s = time.perf_counter() - t
    for f in (s_eager, s_comp, s_ind):
        f()
    r_ce, t_c, t_e = paired(s_comp, s_eager, samples, inner)
    r_ci, _, t_i = paired(s_comp, s_ind, samples, inner)
    results["train_step"] = {
        "eager_npu_ms": t_e * 1e3, "compiled_npu_ms": t_c * 1e3, "inductor_cpu_ms": t_i * 1e3,
        "speedup_vs_eager": 1 / r_ce, "target": TARGET_COMPILED, "met": 1 / r_ce >= TARGET_COMPILED,
        "speedup_vs_inductor_cpu": 1 / r_ci, "first_call_s": compile_step_s}

    def peak(run):
        run()
        torch.npu.synchronize()
        torch.npu.reset_peak_memory_stats()
        base = torch.npu.memory_allocated()
        run()
        torch.npu.synchronize()
        return torch.npu.max_memory_allocated() - base

    p_e, p_c = peak(s_eager), peak(s_comp)
    results["train_step_peak_memory"] = {
        "eager_bytes": p_e, "compiled_bytes": p_c, "ratio": p_c / p_e, "target": TARGET_MEMORY,
        "met": p_c / p_e <= TARGET_MEMORY}
    report = npubridge.compile_report(compiled)
    results["compile_report"] = report.as_dict() if hasattr(report, "as_dict") else report
    return results


def decode(quick):
    """One-token decode with transformers' StaticCache: eager npu against an NPUGraph replay of the
    same step (the step's inputs, the token and its position, are updated in place)."""
    import transformers
    samples, inner = (5, 5) if quick else (15, 10)
    model = tiny_llama().to("npu").eval()
    max_len = 48
    cache = transformers.StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len,
                                     device="npu", dtype=torch.float32)
    prompt = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(2)).to("npu")
    with torch.no_grad():
        pos = torch.arange(prompt.shape[1], device="npu")
        out = model(prompt, past_key_values=cache, cache_position=pos, use_cache=True)
    static_ids = out.logits[:, -1:].argmax(-1)
    static_pos = torch.tensor([prompt.shape[1]], device="npu")

    def eager_step():
        with torch.no_grad():
            logits = model(static_ids, past_key_values=cache, cache_position=static_pos, use_cache=True).logits
        torch.npu.synchronize()
        return logits

    eager_step()  # warm-up on the capture's shapes
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        with torch.no_grad():
            static_logits = model(static_ids, past_key_values=cache, cache_position=static_pos,
                                  use_cache=True).logits

    def replay_step():
        graph.replay()
        torch.npu.synchronize()
        return static_logits

    # transformers' StaticCache writes at its own device-side counter (each layer's
    # cumulative_length, advanced in place by every step, eager or replayed): put it back at the
    # prompt's end before each side's steps, so that neither runs past the cache.
    def rewind():
        for layer in cache.layers:
            layer.cumulative_length.fill_(prompt.shape[1])

    r, t_r, t_e = paired(replay_step, eager_step, samples, inner, reset=rewind)
    return {"eager_npu_ms": t_e * 1e3, "replay_ms": t_r * 1e3, "speedup": 1 / r, "target": TARGET_REPLAY,
            "met": 1 / r >= TARGET_REPLAY}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("NPUB_BENCH_THREADS", "2")))
    warnings.filterwarnings("ignore")
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "quick": a.quick}
    res.update(forward_and_step(a.quick))
    res["decode_step"] = decode(a.quick)
    for k in ("forward", "train_step"):
        r = res[k]
        print(f"{k:11s} eager npu {r['eager_npu_ms']:8.2f} ms  compiled npu {r['compiled_npu_ms']:8.2f} ms  "
              f"-> {r['speedup_vs_eager']:.2f}x (target {TARGET_COMPILED}: {'met' if r['met'] else 'MISS'}); "
              f"inductor cpu {r['inductor_cpu_ms']:8.2f} ms, compiled npu / inductor speed "
              f"{r['speedup_vs_inductor_cpu']:.2f}x")
    m = res["train_step_peak_memory"]
    print(f"peak memory of a training step: eager {m['eager_bytes'] / 1e6:.2f} MB, compiled "
          f"{m['compiled_bytes'] / 1e6:.2f} MB -> {m['ratio']:.2f} (target <= {TARGET_MEMORY}: "
          f"{'met' if m['met'] else 'MISS'})")
    d = res["decode_step"]
    print(f"decode step: eager npu {d['eager_npu_ms']:.2f} ms, replay {d['replay_ms']:.2f} ms -> "
          f"{d['speedup']:.2f}x (target {TARGET_REPLAY}: {'met' if d['met'] else 'MISS'})")
    rep = res["compile_report"]
    print("compile report:", json.dumps(rep.get("totals", rep) if isinstance(rep, dict) else str(rep))[:2000])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())
