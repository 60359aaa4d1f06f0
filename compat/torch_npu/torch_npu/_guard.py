"""This package must never stand in for Ascend's torch_npu silently.

Both own the import name `torch_npu`. setup.py refuses to build where the
distribution "torch-npu" is installed; this check refuses the import when
one is installed beside it (a copy on PYTHONPATH, or an install that
overwrote files), so that a user never runs npubridge's simulated device
believing it is Ascend's."""
import importlib.metadata
import os

__all__ = ["check_no_real_torch_npu", "REAL_DISTRIBUTIONS"]

# The names Ascend's torch_npu is distributed under.
REAL_DISTRIBUTIONS = ("torch-npu", "torch_npu")


def check_no_real_torch_npu() -> None:
    for name in REAL_DISTRIBUTIONS:
        try:
            real = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        raise ImportError(
            f"npubridge's torch_npu compatibility package (imported from {where}) refuses to load: Ascend's "
            f"torch_npu ({real.metadata['Name']} {real.version}) is installed in this environment as well. "
            f"Use one of them: `pip uninstall npubridge-torch-npu` (or drop it from PYTHONPATH) to use Ascend's, "
            f"or a separate virtual environment for npubridge.")
