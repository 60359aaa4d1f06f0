"""Lowering ATen FX graphs to the C++ execution loop (npubridge._compile.lowering)
and the memory plan (memory_plan.py).

Equality: a lowered graph runs the same plugin kernels in the same order as
the same graph run node by node on the npu (gm(*args): each node through
ATen and the eager bridge), so the results are compared bit for bit. Against
float64 on the CPU the bound is derived from the computation (see _mlp_bound).
"""
import random

import pytest
import torch
from functorch.compile import aot_function
from torch.fx.experimental.proxy_tensor import make_fx

import npubridge  # noqa: F401
from npubridge._compile import memory_plan
from npubridge._compile.lowering import lower

DEV = "npu"


def _kinds(summary):
    out = {}
    for n in summary["nodes"]:
        out.setdefault(n["kind"], []).append(n["name"])
    return out


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def _mlp(x, w1, b1, w2):
    h = torch.relu(x @ w1.t() + b1)
    return (h @ w2.t(),)


def _mlp_bound(x, w1, b1, w2, eps):
    # Forward error of a matmul chain (Higham, ch. 3): a K-term dot product
    # in precision eps errs by at most gamma_K = K*eps/(1-K*eps) of the sum
    # of |terms|; relu is 1-Lipschitz, so with the absolute-value network
    # y_abs = relu-free |h| @ |w2|^T the output errs by at most
    # (gamma_{K1+1} + gamma_{K2}) * y_abs plus the rounding of the output.
    k1, k2 = w1.shape[1] + 1, w2.shape[1]
    h_abs = x.abs() @ w1.abs().t() + b1.abs()
    y_abs = h_abs @ w2.abs().t()
    g = lambda k: k * eps / (1 - k * eps)  # noqa: E731
    return (g(k1) + g(k2) + eps) * y_abs


def _args(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes], dtype


# --- the memory planner --------------------------------------------------

def test_planner_never_overlaps_live_buffers_and_aligns():
    rng = random.Random(7)
    for trial in range(200):
        n = rng.randint(1, 30)
        bufs = []
        for i in range(n):
            s = rng.randint(0, 40)
            bufs.append(memory_plan.Buffer(i, rng.choice([0, 1, 3, 64, 100, 4096, rng.randint(1, 10000)]),
                                           s, s + rng.randint(0, 10)))
        p = memory_plan.plan(bufs)
        memory_plan.check(p)
        # The arena is at least the live peak and at most no reuse at all.
        assert p.live_peak_bytes <= p.arena_bytes <= max(p.intermediates_bytes, 64 * n)
    # A chain (each buffer read only by the next step) needs two buffers.
    chain = [memory_plan.Buffer(i, 1000, i, i + 1) for i in range(10)]
    p = memory_plan.plan(chain)
    assert p.arena_bytes == 2 * memory_plan.align(1000)
    assert p.live_peak_bytes == 2 * memory_plan.align(1000)
    with pytest.raises(ValueError, match="buffer 0: last use 1 before its definition 2"):
        memory_plan.plan([memory_plan.Buffer(0, 8, 2, 1)])


# --- MLP forward, fp32 and fp16 -------------------------------------------

@pytest.fixture(scope="module")
def mlp32():
    (x, w1, b1, w2), _ = _args((8, 32), (64, 32), (64,), (16, 64))
    args = [t.float().to(DEV) for t in (x, w1, b1, w2)]
    gm = make_fx(_mlp, tracing_mode="fake")(*args)
    return gm, args, lower(gm, args), (x, w1, b1, w2)


def test_mlp_forward_matches_eager_bit_for_bit(mlp32):
    gm, args, c, f64 = mlp32
    out = c(*args)
    ref = gm(*args)
    assert isinstance(out, tuple) and len(out) == 1
    assert _same(out[0], ref[0])
    # Against float64 on the CPU, within the matmul chain's bound.
    y64 = _mlp(*f64)[0]
    bound = _mlp_bound(*f64, eps=2.0**-24)
    assert ((out[0].cpu().double() - y64).abs() <= bound).all()
    s = c.summary()
    k = _kinds(s)
    assert s["lowered"] and s["fallbacks"] == 0
    assert sorted(k) == ["kernel", "view"], k
    plugins = {n["name"]: (n["plugin"], n["kernel_op"]) for n in s["nodes"] if n["kind"] == "kernel"}
    assert plugins["mm"] == ("cann_like", "aten::mm.out")
    assert plugins["relu"] == ("cann_like", "aten::relu")
    assert all(n["dtype_conversion"] is None for n in s["nodes"])
    # mm (8x64 f32), add, relu: a chain; the output is not planned.
    assert s["output_bytes"] == 8 * 16 * 4
    assert s["live_peak_bytes"] <= s["planned_bytes"] <= s["intermediates_bytes"]
    assert s["planned_bytes"] == 2 * 8 * 64 * 4  # two live 8x64 buffers at most


def test_new_data_each_call_and_a_kept_arena(mlp32):
    gm, args, c, _ = mlp32
    kept = lower(gm, args, keep_arena=True)
    for seed in range(3):
        (x, *_), _ = _args((8, 32), seed=seed + 10)
        new = [x.float().to(DEV)] + args[1:]
        ref = gm(*new)[0]
        assert _same(c(*new)[0], ref)
        assert _same(kept(*new)[0], ref)


def test_bad_inputs_are_errors_naming_the_input(mlp32):
    _, args, c, _ = mlp32
    with pytest.raises(RuntimeError, match=r"input 0: expected Float \[8, 32\].* but found Float \[4, 32\]"):
        c(torch.randn(4, 32, device=DEV), *args[1:])
    with pytest.raises(RuntimeError, match="input 1: expected a tensor on npu:0 but found cpu"):
        c(args[0], args[1].cpu(), *args[2:])
    with pytest.raises(RuntimeError, match="expected 4 tensor inputs but found 3"):
        c(*args[:3])


def test_fp16_runs_on_float32_kernels_by_conversion():
    (x, w1, b1, w2), _ = _args((8, 32), (64, 32), (64,), (16, 64), seed=3)
    f16 = [t.half() for t in (x, w1, b1, w2)]
    args = [t.to(DEV) for t in f16]
    gm = make_fx(_mlp, tracing_mode="fake")(*args)
    c = lower(gm, args)
    out = c(*args)[0]
    assert out.dtype == torch.float16
    assert _same(out, gm(*args)[0])  # the eager path converts the same way
    conv = {n["name"]: n["dtype_conversion"] for n in c.summary()["nodes"] if n["kind"] == "kernel"}
    # cann_like's mm.out has no float16 kernel: run in float32 and cast back.
    assert conv["mm"] == "float16->float32" and conv["mm_1"] == "float16->float32"
    # Bound: the inputs are exact in fp16; mm accumulates in float32 and
    # rounds to fp16 (unit 2^-11) after each op (mm, add, relu, mm): three
    # fp16 roundings of values bounded by the absolute network, carried
    # through |w2|, plus the float32 chain's own error.
    f64 = [t.double() for t in f16]
    y64 = _mlp(*f64)[0]
    u = 2.0**-11
    h_abs = f64[0].abs() @ f64[1].abs().t() + f64[2].abs()
    bound = _mlp_bound(*f64, eps=2.0**-24) + 2 * u * h_abs @ f64[3].abs().t() + u * y64.abs()
    assert ((out.cpu().double() - y64).abs() <= bound * 1.001).all()


# --- MLP forward and backward through AOTAutograd ---------------------------

@pytest.fixture(scope="module")
def mlp_aot():
    summaries = []

    def compiler(gm, example_inputs):
        c = lower(gm, example_inputs)
        summaries.append(c.summary())
        return c

    f = aot_function(_mlp, fw_compiler=compiler, bw_compiler=compiler)
    (x, w1, b1, w2), _ = _args((8, 32), (64, 32), (64,), (16, 64), seed=5)
    leaves = [t.float().to(DEV).requires_grad_() for t in (x, w1, b1, w2)]
    out = f(*leaves)[0]
    out.sum().backward()
    return out, [t.grad for t in leaves], leaves, summaries


def test_mlp_backward_matches_eager_autograd(mlp_aot):
    out, grads, leaves, summaries = mlp_aot
    eager = [t.detach().clone().requires_grad_() for t in leaves]
    ref = _mlp(*eager)[0]
    ref.sum().backward()
    assert _same(out.detach(), ref.detach())
    for g, e in zip(grads, eager):
        # AOTAutograd's backward graph is autograd's formulas as ATen ops:
        # the same kernels in the same order as eager autograd.
        assert _same(g, e.grad)
    assert len(summaries) == 2  # forward and backward, both lowered
    for s in summaries:
        assert s["lowered"] and s["fallbacks"] == 0, s
    bw = _kinds(summaries[1])
    assert "kernel" in bw and "view" in bw
    # threshold_backward (relu's) and the bias grad's sum are plugin kernels.
    ops = {n["kernel_op"] for n in summaries[1]["nodes"]}
    assert "aten::threshold_backward.grad_input" in ops and "aten::sum.IntList_out" in ops


# --- views, fallbacks, plugin ops, input mutation, constants ----------------

def test_view_heavy_graph():
    def f(x, y):
        a = x.view(4, 6).t()                     # view of an input
        b = a.expand(2, 6, 4)                    # stride-0 view
        c = (b * 2).permute(0, 2, 1)             # view of an intermediate
        d = c.reshape(8, 6)                      # non-contiguous: clone + _unsafe_view
        e = d[1:7:2, ::3]                        # slice with steps
        g = (e + y[0, :2]).unsqueeze(0)
        return g, c.select(1, 2), a              # outputs: views of an intermediate and of an input

    x = torch.randn(24, device=DEV)
    y = torch.randn(3, 2, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    c = lower(gm, [x, y])
    out, ref = c(x, y), gm(x, y)
    for o, r in zip(out, ref):
        assert _same(o, r) and o.stride() == r.stride()
    assert out[2].data_ptr() == x.data_ptr()  # a view of the input stays one
    k = _kinds(c.summary())
    assert len(k["view"]) >= 8, k
    # The bases of the returned views are allocated per call, not in the arena:
    # a second call must not overwrite what the first returned.
    keep = out[1].clone()
    c(torch.randn(24, device=DEV), y)
    assert _same(out[1], keep)


def test_views_of_planned_intermediates():
    def f(x):
        a = (x * 3).view(4, 6).t().reshape(24)  # clone + _unsafe_view of a transposed intermediate
        return (a.view(2, 12)[1] + 1,)

    x = torch.randn(24, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x)
    c = lower(gm, [x])
    assert _same(c(x)[0], gm(x)[0])
    s = c.summary()
    kind = {n["target"]: n["kind"] for n in s["nodes"]}
    assert kind["aten._unsafe_view.default"] == "view"  # aliases, though its schema does not say so
    assert kind["aten.clone.default"] == "kernel"
    # mul's and clone's results (24 floats, 128 bytes aligned) live together
    # while clone reads the view of mul's: the views keep their bases alive.
    assert s["planned_bytes"] == s["live_peak_bytes"] == 2 * memory_plan.align(24 * 4)


def test_fallback_node_is_counted_with_its_reason():
    def f(x):
        return (torch.special.expm1(x * 3) + 1,)

    x = torch.randn(5, 7, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x)
    c = lower(gm, [x])
    assert _same(c(x)[0], gm(x)[0])
    s = c.summary()
    assert s["fallbacks"] == 1
    fb = [n for n in s["nodes"] if n["kind"] == "fallback"]
    assert fb[0]["target"] == "aten.expm1.default"
    assert "no plugin serves aten::expm1" in fb[0]["reason"]
    assert s["host_bytes"] == 5 * 7 * 4  # its result is ATen's, not the arena's


def test_plugin_op_with_two_returns():
    def f(x, g):
        y, rstd = torch.ops.mindspeed_like.npu_rms_norm(x, g, 1e-6)
        return (y * 2, rstd)

    x = torch.randn(4, 16, device=DEV)
    g = torch.randn(16, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x, g)
    c = lower(gm, [x, g])
    for o, r in zip(c(x, g), gm(x, g)):
        assert _same(o, r)
    n = next(n for n in c.summary()["nodes"] if "rms_norm" in n["target"])
    assert (n["kind"], n["plugin"], n["kernel_op"]) == ("kernel", "mindspeed_like", "mindspeed_like::npu_rms_norm")


def test_input_mutation_by_copy_():
    def f(a, b):
        a.copy_(a + b)       # AOTAutograd's input mutation, as the graph's copy_
        return (a * b,)

    a0 = torch.randn(6, device=DEV)
    b = torch.randn(6, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(a0.clone(), b)
    c = lower(gm, [a0, b])
    a_ref, a_low = a0.clone(), a0.clone()
    ref = gm(a_ref, b)[0]
    out = c(a_low, b)[0]
    assert _same(a_low, a_ref) and _same(out, ref)
    n = next(n for n in c.summary()["nodes"] if n["target"] == "aten.copy_.default")
    assert (n["kind"], n["kernel_op"]) == ("kernel", "aten::copy_")


def test_a_kernel_that_declines_at_run_time_falls_back():
    # cann_like's clone declines a result laid out other than contiguously;
    # the step was resolved to it, and the decline sends the call to ATen,
    # as on every path (Note [A decline falls back on every path]).
    def f(x):
        return (x.clone(memory_format=torch.channels_last) * 2,)

    x = torch.randn(2, 3, 4, 5, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x)
    c = lower(gm, [x])
    n = next(n for n in c.summary()["nodes"] if n["name"] == "clone")
    assert (n["kind"], n["kernel_op"]) == ("kernel", "aten::clone")
    npubridge._C.reset_stats()
    out, ref = c(x)[0], gm(x)[0]
    assert _same(out, ref) and out.stride() == ref.stride()
    st = npubridge._C.stats()["aten::clone"]
    assert st["calls"] == 2 and st["fallbacks"] == 2  # the lowered call and the eager one


def test_copies_composed_of_kernel_steps():
    # Note [Copies as kernel steps]: _to_copy and slice_backward (the
    # backward of a slice) as allocation + zero_/copy_ kernel steps.
    def f(x):
        return (x[:, 1:5:2].to(torch.float64) * 2,)

    x0 = torch.randn(3, 6, device=DEV)
    summaries = []

    def compiler(gm, example_inputs):
        c = lower(gm, example_inputs)
        summaries.append(c.summary())
        return c

    x = x0.clone().requires_grad_()
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler)(x)[0]
    out.sum().backward()
    xe = x0.clone().requires_grad_()
    ref = f(xe)[0]
    ref.sum().backward()
    assert _same(out.detach(), ref.detach()) and _same(x.grad, xe.grad)
    rows = {n["target"]: n for s in summaries for n in s["nodes"]}
    for target in ("aten._to_copy.default", "aten.slice_backward.default"):
        assert rows[target]["kind"] == "kernel" and rows[target]["kernel_op"] == "aten::copy_", rows[target]
    assert all(s["fallbacks"] == 0 for s in summaries)


def test_boxed_call_drops_each_input_after_its_last_use():
    # The boxed call (AOTAutograd's convention) gives the loop the only
    # references: `a` (1 MiB) is read by the first step only, so its memory
    # is free again when the second step's 1 MiB output is allocated (an
    # output is allocated when first written). Unboxed, the caller still
    # holds `a`, and both are live at once.
    def f(a, b):
        return (a[0] * 1, b.expand(256, 1024) * 2)

    mib = 256 * 1024 * 4
    gm = make_fx(f, tracing_mode="fake")(torch.empty(256, 1024, device=DEV), torch.empty(1024, device=DEV))
    c = lower(gm, [torch.empty(256, 1024, device=DEV), torch.empty(1024, device=DEV)])
    b = torch.randn(1024, device=DEV)

    def peak(run):
        torch.npu.synchronize()
        torch.npu.reset_peak_memory_stats()
        base = torch.npu.memory_allocated()
        out = run()
        torch.npu.synchronize()
        return torch.npu.max_memory_allocated() - base, out

    a = torch.randn(256, 1024, device=DEV)
    ref = gm(a, b)
    unboxed, out1 = peak(lambda: c(a, b))
    args = [a, b]
    del a
    boxed, out2 = peak(lambda: c.boxed_fn()(args))
    assert args == []  # emptied, as AOTAutograd expects
    for x, y, r in zip(out1, out2, ref):
        assert _same(x, r) and _same(y, r)
    # Unboxed: the outputs (1 MiB + 4 KiB) on top of the held input; boxed:
    # the input's 1 MiB is the second output's.
    assert unboxed >= mib + 1024 * 4
    assert boxed <= unboxed - mib + 1024 * 4, (boxed, unboxed)


def test_convolution_forward_and_backward_on_the_overrideable_kernels():
    # Note [The overrideable convolutions, lowered]: the route ATen takes on
    # a backend without a native convolution, taken directly.
    def f(x, w, b):
        y = torch.nn.functional.conv2d(x, w, b, padding=1)
        return (torch.nn.functional.max_pool2d(torch.relu(y), 2),)

    summaries = []

    def compiler(gm, example_inputs):
        c = lower(gm, example_inputs)
        summaries.append(c.summary())
        return c.boxed_fn()

    g = torch.Generator().manual_seed(11)
    base = [torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g), torch.randn(4, generator=g)]
    leaves = [t.to(DEV).requires_grad_() for t in base]
    out = aot_function(f, fw_compiler=compiler, bw_compiler=compiler)(*leaves)[0]
    out.sum().backward()
    eager = [t.to(DEV).requires_grad_() for t in base]
    ref = f(*eager)[0]
    ref.sum().backward()
    assert _same(out.detach(), ref.detach())
    for a, e in zip(leaves, eager):
        assert _same(a.grad, e.grad)
    ops = {n["target"]: n["kernel_op"] for s in summaries for n in s["nodes"] if n["kind"] == "kernel"}
    assert ops["aten.convolution.default"] == "aten::convolution_overrideable"
    assert ops["aten.convolution_backward.default"] == "aten::convolution_backward_overrideable"
    assert all(s["fallbacks"] == 0 for s in summaries), [s["nodes"] for s in summaries]


def test_factory_without_inputs_is_a_constant():
    def f(x):
        return (x * torch.full((3,), 2.5, device=DEV) + torch.scalar_tensor(1.0, device=DEV),)

    x = torch.randn(3, device=DEV)
    gm = make_fx(f, tracing_mode="fake")(x)
    c = lower(gm, [x])
    assert _same(c(x)[0], gm(x)[0])
    assert len(_kinds(c.summary())["constant"]) == 2


def test_a_graph_the_loop_cannot_run_runs_as_fx_and_says_why():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    g.output((y, n))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    xt = torch.randn(3, device=DEV)
    c = lower(gm, [xt, 4])
    s = c.summary()
    assert not s["lowered"] and "graph input 'n' is int, not a tensor" in s["reason"]
    out = c(xt, 4)
    assert _same(out[0], xt * xt) and out[1] == 4


# --- the tiny Llama, forward and backward through Dynamo + AOTAutograd ------

@pytest.fixture(scope="module")
def llama_step():
    import transformers
    from torch._dynamo.backends.common import aot_autograd
    from tiny_models import llama_config

    torch.manual_seed(0)
    cfg = llama_config(attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).to(DEV)
    ids = torch.randint(0, 128, (2, 12)).to(DEV)
    summaries = []

    def compiler(gm, example_inputs):
        c = lower(gm, example_inputs)
        summaries.append(c.summary())
        return c.boxed_fn()

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=compiler, bw_compiler=compiler))
    out = compiled(ids, labels=ids)
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(ids, labels=ids)
    ref.loss.backward()
    yield out, grads, ref, [p.grad for p in model.parameters()], summaries
    torch._dynamo.reset()


def test_llama_training_step_is_bit_equal_to_eager(llama_step):
    out, grads, ref, ref_grads, summaries = llama_step
    # Every plugin kernel the eager step runs, the lowered graphs run in the
    # same order on the same data: logits, loss and all gradients agree exactly.
    assert _same(out.logits.detach(), ref.logits.detach())
    assert _same(out.loss.detach(), ref.loss.detach())
    assert len(grads) == len(ref_grads) == 21
    for g, r in zip(grads, ref_grads):
        assert _same(g, r)
    assert len(summaries) == 2 and all(s["lowered"] for s in summaries)
    fw, bw = summaries
    for s in summaries:
        kinds = _kinds(s)
        assert len(kinds["kernel"]) > 3 * s["fallbacks"], (s["fallbacks"], len(kinds["kernel"]))
        assert s["live_peak_bytes"] <= s["planned_bytes"] < s["intermediates_bytes"]
    fw_ops = {n["kernel_op"] for n in fw["nodes"]}
    assert {"aten::mm.out", "aten::bmm.out", "aten::_softmax.out", "aten::embedding"} <= fw_ops
    # mul.Scalar runs as mul.Tensor with a wrapped number, as ATen composes it.
    assert all(n["kind"] == "kernel" for n in fw["nodes"] + bw["nodes"] if n["target"] == "aten.mul.Scalar")


def test_an_integer_division_by_zero_names_the_node_and_says_what_the_cpu_says():
    # ATen's CPU kernel raises RuntimeError("ZeroDivisionError"); under AOTAutograd's runtime wrapper it
    # reached the compiled graph's loop as a Python exception, which came out as a RuntimeError with an
    # empty message. Now: the CPU's error, its message prefixed with the graph node, the original as cause.
    # fmod of integers runs on the CPU fallback (no plugin kernel); floor_divide on cann_like, whose
    # refusal names the node and says ZeroDivisionError too.
    def f(a, b):
        return torch.fmod(a, b)

    def g(a, b):
        return a // b

    a = torch.tensor([5, 6], device="npu")
    b = torch.tensor([0, 1], device="npu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as cpu:
        f(a.cpu(), b.cpu())
    compiled = torch.compile(f, backend="npu")
    with pytest.raises(type(cpu.value), match=r"^graph node '[^']+' \(aten::fmod\.Tensor\): ZeroDivisionError$") as e:
        compiled(a, b)
    assert str(e.value.__cause__) == str(cpu.value)
    assert compiled(a, b + 1).cpu().tolist() == [0, 0]
    native = torch.compile(g, backend="npu")
    with pytest.raises(RuntimeError, match=r"^graph node '[^']+' \(aten::floor_divide\): .*ZeroDivisionError"):
        native(a, b)
    assert native(a, b + 1).cpu().tolist() == [5, 3]


def test_the_program_bindings_are_typed_and_name_what_is_wrong():
    """The lowering's slots and steps (_C._SlotSpec, _C._StepSpec): a slot's
    kind is checked when it is made and when it is set; a step's values are
    read by its op's schema when it is made, and a bad one names the node
    and the argument; a step's plan (_C._StepPlan) has typed fields."""
    from npubridge import _C
    s = _C._SlotSpec("arena", 0, torch.float32, [2, 3], [3, 1], 0)
    assert (s.kind, s.index, s.dtype, s.sizes, s.strides, s.offset, s.tensor) == \
        ("arena", 0, torch.float32, [2, 3], [3, 1], 0, None)
    s.index, s.offset = 64, 0
    assert s.index == 64
    with pytest.raises(RuntimeError, match="graph program: unknown slot kind 'arean'"):
        _C._SlotSpec("arean", 0, torch.float32, [2], [1], 0)
    with pytest.raises(RuntimeError, match="graph program: unknown slot kind 'viw'"):
        s.kind = "viw"
    with pytest.raises(RuntimeError, match="graph program: a constant slot needs its tensor"):
        _C._SlotSpec("constant", 0, torch.float32, [2], [1], 0)
    with pytest.raises(RuntimeError, match="graph program: expected a torch.dtype but found <class 'str'>"):
        _C._SlotSpec("arena", 0, "float32", [2], [1], 0)
    step = _C._StepSpec("mul_1", "aten::mul", "Tensor", "aten::mul.out", True, [("slot", 0), ("value", 2.0)],
                        [1])
    assert (step.node, step.target, step.via_out, step.outs) == ("mul_1", "aten::mul.out", True, [1])
    with pytest.raises(RuntimeError, match=r"graph node 'sum_2', argument 'dim': "):
        _C._StepSpec("sum_2", "aten::sum", "dim_IntList", "", False,
                     [("slot", 0), ("value", "rows"), ("value", False), ("value", None)], [1])
    with pytest.raises(RuntimeError, match=r"graph node 'mul_1': expected 2 arguments"):
        _C._StepSpec("mul_1", "aten::mul", "Tensor", "", False, [("slot", 0)], [1])
    with pytest.raises(RuntimeError, match=r"graph node 'mul_1', argument 'other': unknown kind 'slto'"):
        _C._StepSpec("mul_1", "aten::mul", "Tensor", "", False, [("slot", 0), ("slto", 1)], [1])
    with pytest.raises(RuntimeError, match=r"graph program: unknown ATen op 'aten::mull.Tensor'"):
        _C._StepSpec("mul_1", "aten::mull", "Tensor", "", False, [("slot", 0), ("slot", 1)], [2])
    slots = {0: _C._SlotSpec("input", 0, torch.float16, [4], [1], 0),
             1: _C._SlotSpec("arena", 0, torch.float16, [4], [1], 0)}
    plan = _C._plan_step(0, slots, _C._StepSpec("neg", "aten::neg", "", "aten::neg.out", True, [("slot", 0)], [1]))
    assert (plan.plugin, plan.reason, plan.conversion) == ("cann_like", "", "")  # cann_like's neg takes float16
    # A multi-return op's plan says its kernel's returns (LayerNorm's mean
    # and rstd in the input's dtype, where ATen's meta says float32).
    slots = {0: _C._SlotSpec("input", 0, torch.float16, [4, 8], [8, 1], 0),
             1: _C._SlotSpec("input", 1, torch.float16, [8], [1], 0)}
    ln = _C._StepSpec("ln", "aten::native_layer_norm", "", "aten::native_layer_norm", False,
                      [("slot", 0), ("value", [8]), ("slot", 1), ("value", None), ("value", 1e-5)], [-1, -1, -1])
    plan = _C._plan_step(0, slots, ln)
    assert plan.plugin == "cann_like"
    assert plan.returns == [([4, 8], torch.float16), ([4, 1], torch.float16), ([4, 1], torch.float16)]
