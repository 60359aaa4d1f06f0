"""Autocast on npu is CUDA's policy (Note [Autocast on npu is CUDA's policy],
python_ext/csrc/aten/autocast.cpp): the same ops, with the same cast, as
torch.autocast("cuda"). The CPU build of PyTorch registers CUDA's autocast
kernels too, so the op lists are compared with CUDA's own registrations,
and each cast class is run on npu and judged against the CPU computing the
op on the inputs cast as the policy says (npubridge's error model against
float64)."""
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_judged, assert_matches

# CUDA's only entries the npu has no op for.
CUDA_ONLY = {"aten::cudnn_convolution", "aten::cudnn_convolution_transpose"}


def _autocast_ops(key):
    names = {s.name + (f".{s.overload_name}" if s.overload_name else "")
             for s in torch._C._jit_get_all_schemas() if s.name.startswith("aten::")}
    found = set()
    for name in names:
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
                found.add(name)
        except RuntimeError:  # a schema without an operator handle (aten::Bool.Tensor ...)
            pass
    return found


def test_the_npu_autocasts_every_op_cuda_autocasts():
    torch.ones(1, device="npu")  # the registrations are made at the start
    cuda, npu = _autocast_ops("AutocastCUDA"), _autocast_ops("AutocastPrivateUse1")
    assert len(cuda) > 100, sorted(cuda)  # CUDA's lists are registered in every build
    assert npu == cuda - CUDA_ONLY, (f"only CUDA: {sorted(cuda - CUDA_ONLY - npu)}; "
                                     f"only npu: {sorted(npu - cuda)}")


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


LP = torch.bfloat16  # the autocast dtype of the cases below (float16 in its own test)

# (name, fn, CPU inputs, the inputs as the policy casts them, the expected dtype).
# lower_precision_fp: floating inputs to the autocast dtype.
# fp32: floating inputs to float32. fp32_set_opt_dtype: float32 unless a
# dtype is given. fp32_append_dtype: norm's overloads get dtype=float32.
# promote: the widest floating dtype of the inputs.
_A, _B, _C3 = _r(6, 8), _r(8, 5), _r(2, 6, 8)
_Q, _K, _V = _r(1, 2, 5, 8), _r(1, 2, 5, 8), _r(1, 2, 5, 8, dtype=LP)
_IMG, _W2 = _r(1, 3, 6, 6), _r(4, 3, 3, 3)
_SIG, _W1 = _r(2, 3, 10), _r(4, 3, 3)
_H = _r(4, 8, dtype=LP)


def _lp(*ts):
    return [t.to(LP) for t in ts]


def _f32(*ts):
    return [t.float() for t in ts]


CASES = [
    # lower_precision_fp
    ("mm", torch.mm, (_A, _B), _lp(_A, _B), LP),
    ("bmm", torch.bmm, (_C3, _r(2, 8, 3)), None, LP),
    ("linear", F.linear, (_A, _r(5, 8), _r(5)), None, LP),
    ("einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), (_A, _B), None, LP),
    ("conv1d", F.conv1d, (_SIG, _W1), None, LP),
    ("conv2d", F.conv2d, (_IMG, _W2), None, LP),
    ("addmm", torch.addmm, (_r(5), _A, _B), None, LP),
    # q and k float32, v bfloat16: all three cast, as on CUDA (the
    # Trainer's bf16 failure: "Expected query, key, and value to have the
    # same dtype").
    ("scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
     (_Q, _K, _V), None, LP),
    # fp32
    ("exp", torch.exp, (_H,), _f32(_H), torch.float32),
    ("softplus", F.softplus, (_H,), _f32(_H), torch.float32),
    ("layer_norm", lambda x: F.layer_norm(x, (8,)), (_H,), _f32(_H), torch.float32),
    ("group_norm", lambda x: F.group_norm(x, 2), (_r(2, 4, 3, dtype=LP),), None, torch.float32),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), (_H,), _f32(_H), torch.float32),
    ("mse_loss", F.mse_loss, (_H, _r(4, 8, dtype=LP)), None, torch.float32),
    ("upsample_bilinear2d", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
     (_r(1, 2, 3, 3, dtype=LP),), None, torch.float32),
    ("pow", lambda x: torch.pow(x, 2), (_H,), _f32(_H), torch.float32),
    # fp32_set_opt_dtype
    ("sum", torch.sum, (_H,), _f32(_H), torch.float32),
    ("prod", lambda x: torch.prod(x, 1), (_H,), _f32(_H), torch.float32),
    ("softmax", lambda x: torch.softmax(x, -1), (_H,), _f32(_H), torch.float32),
    ("cumsum", lambda x: torch.cumsum(x, 1), (_H,), _f32(_H), torch.float32),
    ("linalg_vector_norm", torch.linalg.vector_norm, (_H,), _f32(_H), torch.float32),
    # fp32_append_dtype
    ("norm", torch.norm, (_H,), _f32(_H), torch.float32),
    # promote: bfloat16 and float32 together compute in float32
    ("addcmul", torch.addcmul, (_r(4, 8), _H, _H), None, torch.float32),
    ("atan2", torch.atan2, (_H, _r(4, 8)), None, torch.float32),
    ("scatter_add", lambda s, i, x: s.scatter_add(0, i, x),
     (_r(3, 8), torch.randint(0, 3, (4, 8)), _H), None, torch.float32),
]


def _cast_for(inputs, expected):
    return [t.to(expected) if t.is_floating_point() else t for t in inputs]


@pytest.mark.parametrize("name,fn,inputs,cast,expected", CASES, ids=[c[0] for c in CASES])
def test_each_cast_class_runs_as_on_cuda(name, fn, inputs, cast, expected):
    with torch.autocast("npu", dtype=LP):
        got = fn(*[t.to("npu") for t in inputs])
    assert got.device.type == "npu"
    assert got.dtype == expected, f"{name}: {got.dtype}, expected {expected} (CUDA's policy)"
    assert_matches(got, fn, *(cast if cast is not None else _cast_for(inputs, expected)))


def test_an_explicit_dtype_wins_over_fp32_set_opt_dtype():
    with torch.autocast("npu", dtype=LP):
        s = torch.sum(_H.to("npu"), dtype=torch.bfloat16)
        sm = torch.softmax(_H.to("npu"), -1, dtype=torch.float64)
    assert s.dtype == torch.bfloat16 and sm.dtype == torch.float64


def test_float16_autocast_and_outside_the_region():
    a, b = _A.to("npu"), _B.to("npu")
    with torch.autocast("npu", dtype=torch.float16):
        c = a @ b
        e = torch.exp(c)
    assert c.dtype == torch.float16 and e.dtype == torch.float32
    assert_matches(c, torch.mm, _A.half(), _B.half())
    assert (a @ b).dtype == torch.float32  # the region ended
    with torch.autocast("npu", enabled=False):
        assert (a @ b).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p, t = torch.rand(4).to("npu"), torch.rand(4).to("npu")
    with torch.autocast("npu", dtype=LP), pytest.raises(RuntimeError, match="unsafe to autocast on npu"):
        F.binary_cross_entropy(p, t)
    with torch.autocast("npu", dtype=LP):
        loss = F.binary_cross_entropy_with_logits(p, t)  # the safe form
    assert loss.dtype == torch.float32


def _attention_block(q, w, cast):
    k = cast(q) @ cast(w)
    out = F.scaled_dot_product_attention(cast(q), k, k, is_causal=True)
    return out, out.to(w.dtype).square().mean()


def test_an_attention_block_trains_under_bf16_autocast():
    # What the Trainer and Accelerate do with bf16=True: float32 weights,
    # mixed dtypes reaching attention (a float32 query, bfloat16 keys and
    # values), then backward. Judged against the CPU computing the same
    # casts by hand, and float64.
    torch.manual_seed(0)
    q, w = torch.randn(1, 2, 6, 8), torch.randn(8, 8)
    results = {}
    for where, dtype, cast in (("npu", torch.float32, lambda t: t), ("host", torch.float32, lambda t: t.to(LP)),
                               ("wide", torch.float64, lambda t: t)):
        dev = "npu" if where == "npu" else "cpu"
        qd, wd = q.to(dev, dtype), w.to(dev, dtype, copy=True).requires_grad_()
        with torch.autocast("npu", dtype=LP, enabled=where == "npu"):
            out, loss = _attention_block(qd, wd, cast)
        loss.backward()
        results[where] = (out, loss.detach(), wd.grad)
    assert results["npu"][0].dtype == LP and results["npu"][2].dtype == torch.float32
    for i, what in enumerate(("attention output", "loss", "weight gradient")):
        assert_judged(results["npu"][i], results["host"][i], results["wide"][i], what)
