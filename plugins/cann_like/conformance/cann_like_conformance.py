"""npubridge.testing samples and reference of cann_like's own op
(plugins/cann_like/src/conv.cpp), for `python3 -m npubridge conformance
--plugin libnpub_cann_like.so --tests this file` (CTest
conformance.torch.cann_like); its ATen ops take PyTorch's OpInfo samples."""
import torch
import torch.nn.functional as F

from npubridge import testing


@testing.reference("cann_like::conv2d_bias_relu")
def conv2d_bias_relu(x, weight, bias, stride=1, padding=0, dilation=1, groups=1):
    if x.dim() != 4:  # the op takes batched inputs only (F.conv2d also takes an unbatched one)
        raise ValueError(f"input: expected a 4-d (N, C, H, W) tensor but found a {x.dim()}-d one")
    return F.relu(F.conv2d(x, weight, bias, stride, padding, dilation, groups))


@testing.samples("cann_like::conv2d_bias_relu")
def conv2d_bias_relu_samples(dtype):
    def case(name, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
        return testing.Sample(torch.randn(*x, dtype=dtype), torch.randn(*w, dtype=dtype),
                              torch.randn(w[0], dtype=dtype), list(stride), list(padding), list(dilation), groups,
                              name=name)

    yield case("3x3", (2, 3, 8, 8), (4, 3, 3, 3))
    yield case("stride 2, padding 1", (1, 4, 9, 9), (6, 4, 3, 3), stride=(2, 2), padding=(1, 1))
    yield case("dilation 2", (1, 2, 10, 10), (3, 2, 3, 3), dilation=(2, 2))
    yield case("groups 2", (2, 4, 6, 6), (6, 2, 3, 3), groups=2)
    yield case("1x1", (3, 8, 5, 5), (16, 8, 1, 1))
    yield case("3-d input (error)", (3, 8, 8), (4, 3, 3, 3))
