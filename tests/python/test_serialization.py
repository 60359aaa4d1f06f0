"""torch.save and torch.load of npu tensors: a tensor saved from an npu
device loads back there, or where map_location says (the CPU, another
npu), with its values."""
import io

import torch

import npubridge  # noqa: F401  (registers the npu device)


def test_save_and_load_round_trip_to_every_map_location():
    x = torch.arange(6.0).reshape(2, 3).to("npu:1")
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    for location, device in ((None, "npu:1"), ("cpu", "cpu"), ("npu:0", "npu:0")):
        buf.seek(0)
        y = torch.load(buf, map_location=location)["x"]
        assert y.device == torch.device(device)
        assert torch.equal(y.cpu(), x.cpu())
