"""``python3 -m npubridge graph``: the fusion patterns the compiler tries, or
(--demo) one compiled training step of a small model and its compile report."""
import time

import torch
import torch.nn.functional as F

from . import patterns as _patterns


def print_patterns():
    """Each pattern as its text (the C++ table keeps the block it parsed:
    subgraph, where lines, replacement and extra outputs), in the order the
    compiler tries them."""
    for p in _patterns.all_patterns():
        source = p.get("plugin") or "npubridge (builtin)"
        print(f"# from {source}")
        print(p["text"], end="")


def _demo_model(name):
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 4))
        x = torch.randn(32, 16)
        return model, (x,), lambda out: F.cross_entropy(out, torch.zeros(32, dtype=torch.long, device=out.device))
    if name == "llama":
        import transformers

        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       attn_implementation="sdpa", use_cache=False)
        return transformers.LlamaForCausalLM(cfg), (torch.randint(0, 128, (2, 12)),), lambda out: out.logits.sum()
    raise ValueError(f"python3 -m npubridge graph --demo: expected mlp or llama but found {name!r}")


def run_demo(name):
    from . import compile as npu_compile, compile_report

    model, inputs, loss_of = _demo_model(name)
    model = model.npu()
    compiled = npu_compile(model)
    start = time.perf_counter()
    loss_of(compiled(*[x.npu() for x in inputs])).backward()
    print(f"first training step (compile included): {time.perf_counter() - start:.2f} s")
    print(compile_report(compiled))


def main(args):
    if args.demo:
        run_demo(args.demo)
    else:
        print_patterns()
    return 0
