"""npubridge's torch_npu compatibility package (compat/torch_npu): the
libraries' NPU detection, torch_npu's fused ops with its signatures and
return conventions on mindspeed_like's kernels (judged against CPU
references by the error model), NpuFusedAdamW against torch.optim.AdamW,
the NotImplementedError of what is not there, and the refusal to stand in
for a real torch_npu."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import TORCH_NPU_COMPAT_DIR, assert_judged, assert_matches, import_torch_npu_compat
from tiny_models import llama_config

torch_npu = import_torch_npu_compat()


def test_libraries_detect_the_npu():
    from accelerate import Accelerator
    from accelerate.utils import is_npu_available
    from peft.utils.other import infer_device
    from transformers import TrainingArguments
    from transformers.utils import is_torch_npu_available

    assert is_torch_npu_available() and is_npu_available()
    assert infer_device() == "npu"
    args = TrainingArguments(output_dir="unused", report_to=[])
    assert args.device == torch.device("npu", 0)
    assert Accelerator().device.type == "npu"
    # bf16 is accepted on the npu (it is refused where the device has none).
    assert TrainingArguments(output_dir="unused", report_to=[], bf16=True).bf16


def test_accelerate_mixed_precision_on_the_npu():
    # accelerate's fp16 on an NPU: torch.npu.amp.GradScaler and
    # torch.autocast("npu"); bf16 autocasts without a scaler.
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        acc = Accelerator(mixed_precision="fp16")
        assert acc.device.type == "npu" and isinstance(acc.scaler, torch.npu.amp.GradScaler)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        before = model.weight.detach().clone()
        model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        x = torch.randn(16, 8, device=acc.device)
        with acc.autocast():
            assert torch.is_autocast_enabled("npu") and torch.get_autocast_dtype("npu") == torch.float16
            assert (x @ x.T).dtype == torch.float16
            loss = model(x).float().square().mean()
        acc.backward(loss)
        opt.step()
        assert acc.scaler.get_scale() == 2.0**16 and not torch.equal(model.weight.detach().cpu(), before)
        AcceleratorState._reset_state(reset_partial_state=True)
        acc = Accelerator(mixed_precision="bf16")
        assert acc.scaler is None
        with acc.autocast():
            assert (x @ x.T).dtype == torch.bfloat16
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_torch_npu_namespace():
    assert torch_npu.npu.device_count() == torch.npu.device_count()
    from torch_npu.npu.amp import GradScaler

    assert GradScaler is torch.npu.amp.GradScaler
    torch.npu.set_compile_mode(jit_compile=False)
    torch.npu.config.allow_internal_format = False
    x = torch.ones(3, device="npu")
    assert torch_npu.npu_format_cast(x, 29) is x and x.npu_format_cast(2) is x
    assert torch_npu.get_npu_format(x) == 2


def _rms(x, g, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def test_rms_norm_and_add_rms_norm():
    torch.manual_seed(0)
    x1, x2, g = torch.randn(3, 5, 16), torch.randn(3, 5, 16), torch.randn(16)
    y, rstd = torch_npu.npu_rms_norm(x1.npu(), g.npu(), epsilon=1e-6)
    assert rstd.shape == (3, 5, 1) and rstd.dtype == torch.float32
    assert_matches(y, _rms, x1, g)
    y, rstd, s = torch_npu.npu_add_rms_norm(x1.npu(), x2.npu(), g.npu(), 1e-6)
    assert_matches(s, torch.add, x1, x2)
    assert_matches(y, lambda a, b, w: _rms(a + b, w), x1, x2, g)


def _rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def test_rotary_mul_and_swiglu():
    torch.manual_seed(1)
    x, cos, sin = torch.randn(2, 4, 3, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
    got = torch_npu.npu_rotary_mul(x.npu(), cos.npu(), sin.npu())
    assert_matches(got, lambda x, c, s: x * c + _rotate_half(x) * s, x, cos, sin)
    t = torch.randn(4, 12)
    assert_matches(torch_npu.npu_swiglu(t.npu(), dim=-1), lambda t: F.silu(t[:, :6]) * t[:, 6:], t)


def _attention(q, k, v, scale, keep):
    """q [B, N, Sq, D], k/v [B, N, Skv, D], keep [Sq, Skv] bool."""
    s = (q @ k.transpose(-1, -2)) * scale
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


@pytest.mark.parametrize("sparse_mode", [0, 2, 3])
@pytest.mark.parametrize("layout", ["BSND", "BNSD"])
def test_fusion_attention_layouts_and_sparse_modes(layout, sparse_mode):
    torch.manual_seed(2)
    B, N, Sq, Skv, D = 2, 2, 4, 6, 8
    q, k, v = torch.randn(B, N, Sq, D), torch.randn(B, N, Skv, D), torch.randn(B, N, Skv, D)
    i, j = torch.arange(Sq)[:, None], torch.arange(Skv)[None, :]
    if sparse_mode == 0:
        keep = (i + j) % 3 != 0  # any mask: True in atten_mask masks a score out
        mask = (~keep).npu()
    else:
        keep = j <= i if sparse_mode == 2 else j <= i + (Skv - Sq)
        mask = torch.triu(torch.ones(2048, 2048, device="npu"), diagonal=1).bool()  # transformers' mask
    to_layout = (lambda t: t.transpose(1, 2).contiguous()) if layout == "BSND" else (lambda t: t)
    scale = 1 / math.sqrt(D)
    out = torch_npu.npu_fusion_attention(to_layout(q).npu(), to_layout(k).npu(), to_layout(v).npu(), N, layout,
                                         atten_mask=mask, scale=scale, sparse_mode=sparse_mode)
    assert isinstance(out, tuple) and len(out) == 7 and out[4:] == (0, 0, 0)  # torch_npu's 7 returns
    got = out[0].transpose(1, 2) if layout == "BSND" else out[0]
    assert_matches(got, lambda q, k, v: _attention(q, k, v, scale, keep), q, k, v)


def test_fusion_attention_tnd_varlen_and_backward():
    # transformers' varlen call: TND, cumulative lengths as tuples, causal.
    torch.manual_seed(3)
    N, D, lens = 2, 8, (3, 5)
    T = sum(lens)
    q, k, v = (torch.randn(T, N, D, dtype=torch.float32) for _ in range(3))
    mask = torch.triu(torch.ones(2048, 2048, device="npu"), diagonal=1).bool()
    qn, kn, vn = (t.npu().requires_grad_() for t in (q, k, v))
    out = torch_npu.npu_fusion_attention(qn, kn, vn, N, pse=None, padding_mask=None, atten_mask=mask, scale=0.5,
                                         keep_prob=1.0, input_layout="TND", actual_seq_qlen=(3, 8),
                                         actual_seq_kvlen=(3, 8), sparse_mode=3)[0]

    def ref(q, k, v):
        pieces, start = [], 0
        for n in lens:
            sl = slice(start, start + n)
            keep = torch.ones(n, n, dtype=torch.bool).tril()
            pieces.append(_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), 0.5,
                                     keep).transpose(0, 1))
            start += n
        return torch.cat(pieces)

    assert_matches(out, ref, q, k, v)
    out.sum().backward()
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    qw, kw, vw = (t.double().requires_grad_() for t in (q, k, v))
    ref(qc, kc, vc).sum().backward()
    ref(qw, kw, vw).sum().backward()
    for got, host, wide, name in ((qn, qc, qw, "dq"), (kn, kc, kw, "dk"), (vn, vc, vw, "dv")):
        assert_judged(got.grad, host.grad, wide.grad, name)


def test_fusion_attention_refuses_dropout_by_name():
    q = torch.randn(1, 2, 2, 4, device="npu")
    with pytest.raises(RuntimeError, match="keep_prob"):
        torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", keep_prob=0.9)


def test_npu_fused_adamw_matches_torch_adamw():
    from torch_npu.optim import NpuFusedAdamW

    torch.manual_seed(4)
    cpu = torch.nn.Linear(8, 4)
    npu = torch.nn.Linear(8, 4).npu()
    npu.load_state_dict(cpu.state_dict())
    wide = torch.nn.Linear(8, 4).double()
    wide.load_state_dict(cpu.state_dict())
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opts = [torch.optim.AdamW(cpu.parameters(), foreach=False, **kw), NpuFusedAdamW(npu.parameters(), **kw),
            torch.optim.AdamW(wide.parameters(), foreach=False, **kw)]
    x = torch.randn(16, 8)
    for _ in range(3):
        for m, opt in zip((cpu, npu, wide), opts):
            opt.zero_grad()
            inp = x.npu() if m is npu else x.double() if m is wide else x
            m(inp).square().mean().backward()
            opt.step()
    for pc, pn, pw in zip(cpu.parameters(), npu.parameters(), wide.parameters()):
        assert_judged(pn.detach(), pc.detach(), pw.detach(), "weights after 3 steps")
    # torch.optim.AdamW's state: a state_dict loads into AdamW.
    torch.optim.AdamW(npu.parameters(), **kw).load_state_dict(opts[1].state_dict())


def test_not_implemented_apis_name_themselves():
    with pytest.raises(NotImplementedError, match=r"torch_npu\.npu_grouped_matmul is not implemented"):
        torch_npu.npu_grouped_matmul([], [])
    with pytest.raises(NotImplementedError, match=r"torch_npu\.optim\.NpuFusedSGD is not implemented"):
        torch_npu.optim.NpuFusedSGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    assert not hasattr(torch_npu, "no_such_api")


def test_refuses_to_stand_in_for_a_real_torch_npu(tmp_path):
    # A real torch_npu's metadata in the environment: the import refuses,
    # and so does building the distribution.
    dist_info = tmp_path / "torch_npu-2.13.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-npu\nVersion: 2.13.0\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.normpath(TORCH_NPU_COMPAT_DIR), str(tmp_path),
                                                        os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", "import torch_npu"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert "refuses to load: Ascend's torch_npu (torch-npu 2.13.0) is installed" in run.stderr
    build = subprocess.run([sys.executable, os.path.join(TORCH_NPU_COMPAT_DIR, "setup.py"), "--name"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=TORCH_NPU_COMPAT_DIR)
    assert build.returncode != 0 and "refusing to install: Ascend's torch_npu (torch-npu 2.13.0)" in build.stderr


def test_transformers_flash_attention_2_runs_npu_fusion_attention():
    # attn_implementation="flash_attention_2" on an NPU: transformers calls
    # torch_npu.npu_fusion_attention (BSND with its 2048 x 2048 causal mask
    # and sparse_mode 3; TND varlen for a padded batch). Logits judged
    # against the eager model on the CPU and in float64.
    import copy

    import npubridge
    import transformers

    torch.manual_seed(0)
    cfg = llama_config(vocab_size=64, hidden_size=32, intermediate_size=64, max_position_embeddings=32,
                       attn_implementation="sdpa")
    cpu = transformers.LlamaForCausalLM(cfg).eval()
    wide = copy.deepcopy(cpu).double()
    flash_cfg = copy.deepcopy(cfg)
    flash_cfg._attn_implementation = "flash_attention_2"
    npu = transformers.LlamaForCausalLM(flash_cfg)
    npu.load_state_dict(cpu.state_dict())
    npu = npu.to("npu").eval()
    ids = torch.randint(0, 64, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0  # left padding: the varlen (TND) path
    npubridge.reset_stats()
    with torch.no_grad():
        assert_judged(npu(ids.npu()).logits, cpu(ids).logits, wide(ids).logits, "logits")
        keep = mask.bool()
        got = npu(ids.npu(), attention_mask=mask.npu()).logits
        assert_judged(got[keep.npu()], cpu(ids, attention_mask=mask).logits[keep],
                      wide(ids, attention_mask=mask).logits[keep], "padded logits")
    calls = npubridge.stats()["mindspeed_like::npu_fusion_attention"]
    assert calls["native"]["mindspeed_like"] == 4 and calls["fallbacks"] == 0  # 2 layers x 2 forwards


# Every torch_npu name the installed Hugging Face clients use (an attribute
# chain `torch_npu.a.b`, or `from torch_npu[.mod] import name`) exists in this
# package, found by reading their sources: a new release's new call fails
# here rather than in a user's run.
_ATTR = re.compile(r"\btorch_npu((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_FROM = re.compile(r"^\s*from\s+torch_npu((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s+import\s+\(?([A-Za-z0-9_, ]+)", re.M)


@pytest.mark.parametrize("package", ["transformers", "accelerate", "peft", "trl"])
def test_every_torch_npu_name_the_clients_use_exists(package):
    import importlib

    root = os.path.dirname(importlib.util.find_spec(package).origin)
    used = {}
    for folder, _, files in os.walk(root):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in _ATTR.finditer(text):
                used.setdefault(m.group(1)[1:], os.path.relpath(path, root))
            for m in _FROM.finditer(text):
                for item in m.group(2).split(","):
                    if item.strip():
                        used.setdefault((m.group(1)[1:] + "." if m.group(1) else "") + item.split()[0],
                                        os.path.relpath(path, root))
    missing = []
    for dotted, where in sorted(used.items()):
        obj = torch_npu
        for part in dotted.split("."):
            if not hasattr(obj, part):
                try:  # a submodule not imported by the package itself
                    obj = importlib.import_module(f"{obj.__name__}.{part}")
                    continue
                except (ImportError, AttributeError):
                    missing.append(f"torch_npu.{dotted} ({package}/{where})")
                    break
            obj = getattr(obj, part)
    assert not missing, "missing in npubridge's torch_npu: " + ", ".join(missing)
    if package in ("transformers", "trl"):
        assert used, f"found no torch_npu name in {package}: the scan is broken"


def test_peft_lora_on_the_npu():
    # peft's infer_device() says "npu"; a LoRA model there computes the
    # CPU's gradients for its adapters (judged against float64).
    import copy

    import peft
    import transformers

    torch.manual_seed(0)
    cfg = llama_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       max_position_embeddings=32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian")
    cpu = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), lora)
    models = {"cpu": cpu, "npu": copy.deepcopy(cpu).to(peft.utils.other.infer_device()),
              "wide": copy.deepcopy(cpu).double()}
    ids = torch.randint(0, 64, (2, 8))
    for kind, m in models.items():
        x = ids.to("npu") if kind == "npu" else ids
        m(x, labels=x).loss.backward()
    trainable = [n for n, p in cpu.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    params = {k: dict(m.named_parameters()) for k, m in models.items()}
    for n in trainable:
        assert params["npu"][n].device.type == "npu"
        assert_judged(params["npu"][n].grad, params["cpu"][n].grad, params["wide"][n].grad, f"{n} gradient")


def test_distribution_builds_installs_and_imports(tmp_path):
    # `pip install --no-build-isolation ./compat/torch_npu`, into a target
    # folder (the source copied first: setuptools writes build/ beside it).
    import shutil

    src = tmp_path / "src"
    shutil.copytree(TORCH_NPU_COMPAT_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                          "--no-index", "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    code = ("import importlib.metadata as m, torch_npu, torch_npu.optim, torch_npu.contrib, torch_npu.npu.amp; "
            "print(torch_npu.__file__); print(m.distribution('npubridge-torch-npu').requires)")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    where, requires = run.stdout.strip().splitlines()
    assert where.startswith(str(site)) and requires == "['npubridge']"
