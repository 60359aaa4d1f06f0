"""Every ``torch.npu.<name>`` that the installed transformers, accelerate and
peft call in their NPU branches exists on npubridge's torch.npu (found by
reading their sources, so that a new release's new call fails here rather
than in a user's Trainer run)."""
import importlib.util
import os
import re

import pytest
import torch

import npubridge  # noqa: F401

_CALL = re.compile(r"\btorch\.npu\.([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")


def _calls(package):
    spec = importlib.util.find_spec(package)
    if spec is None:
        pytest.skip(f"{package} is not installed")
    root = os.path.dirname(spec.origin)
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for match in _CALL.finditer(f.read()):
                        found.setdefault(match.group(1), os.path.relpath(path, root))
    return found


@pytest.mark.parametrize("package", ["transformers", "accelerate", "peft"])
def test_every_torch_npu_call_exists(package):
    calls = _calls(package)
    missing = []
    for dotted, where in sorted(calls.items()):
        obj = torch.npu
        for part in dotted.split("."):
            if not hasattr(obj, part):
                missing.append(f"torch.npu.{dotted} ({package}/{where})")
                break
            obj = getattr(obj, part)
    assert not missing, "missing on torch.npu: " + ", ".join(missing)
    if package in ("transformers", "accelerate"):
        assert calls, f"found no torch.npu call in {package}: the scan is broken"
