"""Refuses to build (and so to install) over a real torch_npu: both
distributions would own the folder `torch_npu/`, and this package must
never silently replace Ascend's. The metadata is in pyproject.toml."""
import importlib.metadata
import sys

from setuptools import setup

for _name in ("torch-npu", "torch_npu"):
    try:
        _real = importlib.metadata.distribution(_name)
    except importlib.metadata.PackageNotFoundError:
        continue
    sys.exit(f"npubridge-torch-npu: refusing to install: Ascend's torch_npu ({_real.metadata['Name']} "
             f"{_real.version}) is installed in this environment, and this compatibility package would replace its "
             f"files. Use a separate virtual environment, or `pip uninstall torch-npu` first.")

setup()
