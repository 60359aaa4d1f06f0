"""How a result on npu is compared with the CPU's, for every conformance
run (the OpInfo runner, a plugin's ATen ops and its own ops): the error
model (``_C.judge``, the one npub-conformance uses: within a few ulps of the
float64 result plus four times the CPU's own error against it; integer and
bool results exact), the tolerance table for what the model cannot judge,
and the host result a float64 sample is judged against (Note [Judging
float64 results])."""
import torch

from .. import _C

# Only where the error model cannot judge (complex results, an op with no
# float64 CPU kernel): the CPU's result at a per-dtype tolerance; integer and
# bool results exact.
TOLERANCE = {
    torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
}
_EXACT = dict(atol=0, rtol=0)


def tolerance(dtype):
    return TOLERANCE.get(dtype, _EXACT)


def tree_map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(tree_map(fn, e) for e in x)
    if isinstance(x, dict):
        return {k: tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def tensors(x):
    """The tensors of a nested structure, in order (torch.Size and other
    tuples of numbers are walked, not rebuilt)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors(e)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    return []


def to_device(device):
    """A function moving a tensor to `device` with its strides (anything
    else as is), for tree_map and SampleInput.transform."""
    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        t0 = t.detach()
        if t0.layout == torch.strided and not t0.is_contiguous() and t0.numel() > 0:
            # .to() lays a non-dense tensor out contiguous; the device copy
            # keeps the sample's strides, which is what the variant tests.
            moved = torch.empty_strided(t0.size(), t0.stride(), dtype=t0.dtype, device=device).copy_(t0)
        else:
            moved = t0.to(device)
        return moved.requires_grad_(t.requires_grad)
    return move


def to_float64(t):
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().double().requires_grad_(t.requires_grad)
    return t


def to_float32(t):
    if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
        return t.detach().float().requires_grad_(t.requires_grad)
    return t


def judgeable(t):
    return isinstance(t, torch.Tensor) and not t.is_complex() and t.layout == torch.strided


def assert_matches(got, ref, wide, tol):
    """got (npu) against ref (CPU, same dtype), judged by the error model
    against wide (CPU, float64; None when there is none); where the model
    cannot judge, the CPU's result at `tol`."""
    got_l, ref_l = tensors(got), tensors(ref)
    wide_l = tensors(wide) if wide is not None else []
    if len(got_l) != len(ref_l) or len(wide_l) not in (0, len(ref_l)):
        torch.testing.assert_close(tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got), ref,
                                   equal_nan=True, check_device=False, **tol)
        return
    if not got_l:
        torch.testing.assert_close(got, ref, equal_nan=True, **tol)
        return
    for i, (g, r) in enumerate(zip(got_l, ref_l)):
        w = wide_l[i] if wide_l else None
        if judgeable(g) and judgeable(r) and w is not None and judgeable(w):
            msg = _C.judge(g.detach().cpu(), r.detach(), w.detach())
            assert not msg, f"output {i}: {msg}"
        else:  # no float64 reference (or complex): the CPU's result at the tolerance
            torch.testing.assert_close(g.cpu(), r, equal_nan=True, check_device=False, **tol)


def weighted_grads(outs, inputs, weights):
    """The gradients of `inputs` of a fixed projection of `outs`."""
    loss = sum((t * (w.to(device=t.device, dtype=t.dtype))).sum() for t, w in zip(outs, weights))
    return torch.autograd.grad(loss, inputs, allow_unused=True)


# Note [Judging float64 results]
# The error model bounds a result by a few ulps of the float64 reference plus
# four times the error ATen's own result in the op's dtype shows against it.
# For a float64 op the reference is ATen's float64 result itself, which
# would leave no allowance for a different summation order: ATen's own
# float64 error is estimated instead from its float32 run on the same
# inputs, scaled by the ratio of the unit roundoffs (2^-53 / 2^-24), as the
# error bounds of the model scale with u, doubled because the reference is
# then a float64 result carrying the same kind of error as the kernel's (as
# npub-conformance allows a float64 kernel twice the bound), and doubled
# again because one float32 run is one draw of an error that depends on the
# order of the sums (a backward pass through five kernels missed 2x by 8%
# on cann_like). A defect (a dropped term, float64 read as float) misses
# this by many orders of magnitude still. The float32 run also starts from
# rounded inputs, so the estimate includes the op's sensitivity to a
# float64 rounding of its inputs: the allowance of a backward-stable kernel.
# `calibrated` makes the host result the judge compares with: the float64
# result moved by that estimate.
_F64_PER_F32 = 4 * 2.0 ** -29


def calibrated(host, narrow):
    """host (float64 results) moved by their float32 counterparts' error,
    scaled to float64 (Note [Judging float64 results]); host where there is
    no counterpart."""
    if narrow is None:
        return host
    hosts, narrows = tensors(host), tensors(narrow)
    if len(hosts) != len(narrows):
        return host
    moved = iter([h.detach() + (n.detach().double() - h.detach()).nan_to_num(0, 0, 0) * _F64_PER_F32
                  if h.dtype == torch.float64 and n.is_floating_point() and n.shape == h.shape else h
                  for h, n in zip(hosts, narrows)])
    return tree_map(lambda t: next(moved) if isinstance(t, torch.Tensor) else t, host)
