import pytest
import torch

import npubridge  # noqa: F401  (registers the npu backend)


@pytest.fixture
def npu():
    return torch.device("npu:0")
