"""npubridge demo from PyTorch: a small model trained for a few steps on npu,
checked against the same training on the CPU, then the dispatcher's
statistics (ops served natively by which plugin, and CPU fallbacks)."""
import torch
import torch.nn.functional as F

import npubridge


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 4))


def main():
    torch.manual_seed(0)
    x, y = torch.randn(256, 16), torch.randint(0, 4, (256,))
    cpu_model = make_model()
    npu_model = make_model()
    npu_model.load_state_dict(cpu_model.state_dict())
    npu_model = npu_model.to("npu")
    opt_cpu = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    opt_npu = torch.optim.AdamW(npu_model.parameters(), lr=1e-2)
    xn, yn = x.to("npu"), y.to("npu")
    npubridge.reset_stats()
    print(f"devices: {torch.npu.device_count()} npu; plugins: {', '.join(p['name'] for p in npubridge.plugins())}")
    for step in range(5):
        loss_npu = F.cross_entropy(npu_model(xn), yn)
        opt_npu.zero_grad()
        loss_npu.backward()
        opt_npu.step()
        loss_cpu = F.cross_entropy(cpu_model(x), y)
        opt_cpu.zero_grad()
        loss_cpu.backward()
        opt_cpu.step()
        print(f"step {step}: loss npu {loss_npu.item():.6f}  cpu {loss_cpu.item():.6f}")
    for pn, pc in zip(npu_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(pn.cpu(), pc, atol=1e-4, rtol=1e-4)
    print("npu and cpu weights agree after training")

    stats = npubridge.stats()
    native = {op: s for op, s in stats.items() if s["native"]}
    fallback = {op: s for op, s in stats.items() if s["fallbacks"]}
    print(f"\n{sum(s['calls'] for s in stats.values())} op calls: "
          f"{sum(sum(s['native'].values()) for s in native.values())} served natively by plugins, "
          f"{sum(s['fallbacks'] for s in fallback.values())} fell back to the CPU")
    print("native (op: plugin x calls):")
    for op, s in sorted(native.items()):
        print(f"  {op:44} " + ", ".join(f"{p} x{n}" for p, n in s["native"].items()))
    print("fallback to CPU (op: calls):")
    for op, s in sorted(fallback.items()):
        print(f"  {op:44} x{s['fallbacks']}")


if __name__ == "__main__":
    main()
