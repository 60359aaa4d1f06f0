"""Graph mode tests (torch.compile backend "npu", fusion patterns, NPUGraph
capture and replay, the profiler trace): their own ctest, python.graph,
release build only (a compile of the tiny Llama takes seconds)."""
import warnings

import pytest

import npubridge  # noqa: F401


@pytest.fixture(autouse=True)
def _quiet_fallback_notices():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*fell back to the host.*")
        yield
