"""PyTorch on npu against PyTorch on the CPU, in one process and run:
streams of small and large adds, an op that falls back to the CPU, and a tiny
Llama forward. Prints npu time / CPU time (lower is better) and writes the
figures to the JSON file given as argv[1]."""
import json
import sys
import warnings

import torch

import npubridge
from timing import timed

warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def add_stream(device, n, count):
    a = torch.randn(n, device=device)
    b = torch.randn(n, device=device)

    def run():
        x = a
        for _ in range(count):
            x = x + b
        if device != "cpu":
            torch.npu.synchronize()
        return x
    return run


def small_op_chain(device, count):
    """Eager per-op overhead: a chain of small functional, in-place and
    unary ops (the unboxed bridge's call plans on npu), 8 ops a step."""
    a = torch.randn(64, device=device)
    b = torch.randn(64, device=device)

    def run():
        x = a.clone()
        for _ in range(count):
            y = x + b
            y.mul_(0.5)
            y = torch.relu(y)
            y = y - b
            x = y * 0.999
            x.add_(b, alpha=0.001)
            x = torch.neg(x)
            x = torch.abs(x)
        if device != "cpu":
            torch.npu.synchronize()
        return x
    return run


def main():
    results = []

    def record(name, npu_fn, cpu_fn, target, reps=5):
        tn, tc = timed(npu_fn, reps), timed(cpu_fn, reps)
        ratio = tn / tc
        results.append({"name": name, "npu_ms": tn * 1e3, "cpu_ms": tc * 1e3, "ratio": ratio, "target": target})
        print(f"{name:48} npu {tn * 1e3:9.2f} ms  cpu {tc * 1e3:9.2f} ms  ratio {ratio:5.2f} "
              f"(target <= {target}) {'ok' if ratio <= target else 'MISSED'}", flush=True)

    record("10,000 adds of 1,000 elements", add_stream("npu", 1000, 10000), add_stream("cpu", 1000, 10000), 1.5, reps=3)
    record("eager chain of 8 small ops x 2,000 (64 elements)", small_op_chain("npu", 2000),
           small_op_chain("cpu", 2000), 3.0, reps=3)
    record("100 adds of 1M elements", add_stream("npu", 1 << 20, 100), add_stream("cpu", 1 << 20, 100), 1.1)
    x = torch.randn(1 << 20)
    xn = x.npu()
    record("a fallback op (torch.special.i0, 1M elements)", lambda: torch.special.i0(xn).cpu(),
           lambda: torch.special.i0(x), 3.0)
    try:
        import transformers

        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       attn_implementation="eager")
        cpu = transformers.LlamaForCausalLM(cfg).eval()
        npu = transformers.LlamaForCausalLM(cfg).eval()
        npu.load_state_dict(cpu.state_dict())
        npu = npu.to("npu")
        ids = torch.randint(0, 128, (2, 12))
        idn = ids.npu()

        def fwd_npu():
            with torch.no_grad():
                out = npu(idn).logits
            torch.npu.synchronize()
            return out

        def fwd_cpu():
            with torch.no_grad():
                return cpu(ids).logits
        record("tiny LlamaForCausalLM forward", fwd_npu, fwd_cpu, 1.2, reps=9)
    except ImportError:
        print("tiny LlamaForCausalLM forward: transformers is not installed")
    with open(sys.argv[1] if len(sys.argv) > 1 else "torch.json", "w") as f:
        json.dump({"torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
