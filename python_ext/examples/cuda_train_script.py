"""An ordinary training script written for CUDA (nothing npu in it). On
npubridge, unchanged, with Ascend's migration switch:

    PYTHONPATH=compat/torch_npu python3 -c "import torch_npu.contrib.transfer_to_npu, runpy; \
        runpy.run_path('python_ext/examples/cuda_train_script.py', run_name='__main__')"

(./scripts/demo.sh runs it so; tests/python/test_transfer_to_npu.py checks
what it prints.) Prints one JSON line."""
import json

import torch

assert torch.cuda.is_available(), "needs a CUDA device"
torch.cuda.manual_seed_all(0)
torch.manual_seed(0)
device = torch.device("cuda:0")
torch.cuda.set_device(0)

model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler(init_scale=2.0**8)
x = torch.randn(64, 16, device="cuda")
y = torch.randn(64, 4).to(device)
w = torch.zeros(4, device=device).new_ones(4)

losses, dtypes = [], set()
for step in range(5):
    opt.zero_grad()
    with torch.cuda.amp.autocast():
        out = model(x)
        dtypes.add(str(out.dtype))
    loss = ((out.float() - y) ** 2 * w).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    losses.append(loss.item())
with torch.autocast("cuda", dtype=torch.bfloat16):
    dtypes.add(str(model(x).dtype))
torch.cuda.synchronize()
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    z = x.cuda() * 2
stream.synchronize()
state = torch.cuda.get_rng_state()
a = torch.rand(3, device="cuda")
torch.cuda.set_rng_state(state)
print(json.dumps({
    "losses": losses, "autocast_dtypes": sorted(dtypes), "param_device": str(next(model.parameters()).device),
    "x_device": str(x.device), "z_device": str(z.device), "is_cuda": x.is_cuda,
    "allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated(),
    "device_name": torch.cuda.get_device_name(0), "rng_repeats": torch.equal(a, torch.rand(3, device="cuda")),
    "scale": scaler.get_scale(),
}))
