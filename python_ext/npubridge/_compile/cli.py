"""``python3 -m npubridge graph``: the fusion patterns the compiler tries, or
(--demo) one compiled training step of a small model and its compile report."""
import time

import torch
import torch.nn.functional as F

from . import patterns as _patterns


def _arg_text(a):
    kind = a["kind"]
    if kind == "value":
        return f"%{a['name']}"
    if kind == "capture":
        return f"${a['name']}"
    if kind == "any":
        return "_"
    if kind == "const":
        return repr(a["value"])
    if kind == "list":
        return "[" + ", ".join(_arg_text(x) for x in a["items"]) + "]"
    if kind == "size":
        return f"%{a['name']}.size({a['dim']})"
    ret = f"[{a['ret']}]" if a.get("ret") else ""
    return f"{a['op']}(" + ", ".join(_arg_text(x) for x in a["args"]) + ")" + ret


def print_patterns():
    for p in _patterns.all_patterns():
        source = p.get("plugin") or "npubridge (builtin)"
        print(f"pattern {p['name']} priority {p.get('priority', 0)}   # from {source}")
        for n in p["nodes"]:
            print(f"  %{n['out']} = {n['op']}(" + ", ".join(_arg_text(a) for a in n["args"]) + ")")
        print(f"  => {_arg_text(p['replacement'])}")
        for o in p.get("outputs", []):
            print(f"  => %{o['name']} <- [{o['ret']}]")
        print("end")


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
