"""npubridge.mindspore: MindSpore's operators on the plugins through the
dispatcher, in PyNative and GRAPH_MODE, against MindSpore's own network and
a float64 reference under a bound derived from the computation."""
import warnings

import numpy as np
import pytest

import mindspore as ms  # scripts/lib.sh installs it
from mindspore import Tensor, nn, ops

import npubridge.mindspore as ms_adapter

U16 = 2.0 ** -11  # float16's unit roundoff


@pytest.fixture(params=["pynative", "graph"])
def mode(request):
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms_adapter.disable()
    ms_adapter.set_optim_level("O2")
    ms_adapter.auto_convert_dtype(True)
    ms_adapter.reset_stats()


def _run(mode, fn, *args):
    """fn(*args), compiled by GRAPH_MODE (ms.jit) in the graph mode."""
    return ms.jit(fn)(*args) if mode == "graph" else fn(*args)


def _f64(t):
    return t.astype(ms.float32).asnumpy().astype(np.float64)


def _seed_example():
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(512, 1024), nn.ReLU(), nn.Dense(1024, 256)).to_float(ms.float16)


def _ulp16(v):
    mag = np.maximum(np.abs(v), 2.0 ** -14)
    return np.exp2(np.floor(np.log2(mag)) - 10)


def test_the_seed_example_runs_its_dense_layers_on_the_plugins(mode):
    ms_adapter.enable()
    ms_adapter.set_optim_level("O3")
    net = _seed_example()
    x = Tensor(np.ones((2, 512)), ms.float16)
    y = net(x)
    assert y.shape == (2, 256) and y.dtype == ms.float16
    s = ms_adapter.stats()
    assert s["kernels"]["aten::mm.out"]["cann_like"] >= 2, s
    assert s["kernels"]["aten::relu"]["cann_like"] >= 1, s
    assert s["routed"]["MatMul"] >= 2 and not s["fallbacks"], s

    # Reference: the same network in float64 from the float16 weights. The
    # float16 network rounds the hidden layer and the output once each, and
    # adds in float32 (whose error is far below float16's rounding): each
    # output element is within 2 u16 |h| |w2| + 2 ulp16(y) of it.
    w1, b1 = (_f64(p) for p in (net[0].weight, net[0].bias))
    w2, b2 = (_f64(p) for p in (net[2].weight, net[2].bias))
    h = np.maximum(np.ones((2, 512)) @ w1.T + b1, 0)
    ref = h @ w2.T + b2
    bound = 2 * U16 * (np.abs(h) @ np.abs(w2.T) + np.abs(b2)) + 2 * _ulp16(ref)
    assert (np.abs(_f64(y) - ref) <= bound).all()

    # MindSpore's own network, within both bounds of the reference.
    ms_adapter.disable()
    native = net(x)
    assert (np.abs(_f64(y) - _f64(native)) <= 2 * bound).all()


def test_disable_puts_mindsporess_own_operators_back(mode):
    net = _seed_example()
    x = Tensor(np.ones((2, 512)), ms.float16)
    ms_adapter.enable()
    ms_adapter.disable()
    ms_adapter.reset_stats()
    net(x)
    assert ms_adapter.stats()["kernels"] == {}
    assert ops.matmul.__module__.startswith("mindspore")


def _relu_of_double(x):
    return ops.relu(ops.add(x, x))


def test_optim_level_o0_leaves_every_call_to_mindspore_with_one_warning(mode):
    ms_adapter.enable()
    ms_adapter.set_optim_level("O0")
    ms_adapter.reset_stats()
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) - 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = _run(mode, ops.relu, x)
        y = _run(mode, _relu_of_double, x)
    np.testing.assert_array_equal(y.asnumpy(), np.maximum(2 * x.asnumpy(), 0))
    s = ms_adapter.stats()
    assert s["kernels"] == {} and s["fallbacks"]["ReLU"] >= 1, s
    relu_warnings = [w for w in caught if "ReLU" in str(w.message)]
    assert len(relu_warnings) == 1, [str(w.message) for w in caught]
    assert "runs MindSpore's own operator" in str(relu_warnings[0].message)


def test_a_dtype_no_kernel_takes_falls_back_with_one_warning(mode):
    ms_adapter.enable()
    rng = np.random.default_rng(2)
    a = Tensor(rng.standard_normal((4, 8)), ms.float16)
    b = Tensor(rng.standard_normal((8, 3)), ms.float16)
    exact = _f64(a) @ _f64(b)
    bound = 2 * U16 * (np.abs(_f64(a)) @ np.abs(_f64(b))) + 2 * _ulp16(exact)

    # cann_like's mm kernels take float32 (and others), not float16: served
    # through the dispatcher's conversion by default...
    y = _run(mode, ops.matmul, a, b)
    s = ms_adapter.stats()
    assert s["conversions"]["aten::mm.out"] == 1 and s["kernels"]["aten::mm.out"]["cann_like"] == 1, s
    assert (np.abs(_f64(y) - exact) <= bound).all()

    # ... and by MindSpore's own MatMul without it, with one warning.
    ms_adapter.auto_convert_dtype(False)
    ms_adapter.reset_stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1 = _run(mode, ops.matmul, a, b)
        y2 = _run(mode, ops.matmul, a, b)
    s = ms_adapter.stats()
    # Decisions count calls under PyNative, compilations under GRAPH_MODE
    # (each ms.jit wrapper compiles its own graph).
    assert "aten::mm.out" not in s["kernels"] and s["fallbacks"]["MatMul"] == 2, s
    messages = [str(w.message) for w in caught if "MatMul" in str(w.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("npubridge.mindspore: MatMul (aten::mm.out) runs MindSpore's own operator: "
                                  "no kernel accepts dtype float16"), messages
    for y in (y1, y2):
        assert (np.abs(_f64(y) - exact) <= bound).all()


def test_register_op_routes_an_operator_and_checks_the_target(mode):
    ms_adapter.enable()
    with pytest.raises(ValueError, match=r"cannot map Tanh \(from 'aten::tanh.out'\) to "
                                         r"'mindspeed_like::npu_swiglu': .*argument 'dim'.*not a Tensor"):
        ms_adapter.register_op("Tanh", "mindspeed_like::npu_swiglu")
    with pytest.raises(ValueError, match="expected ms_op to be one of"):
        ms_adapter.register_op("NoSuchOp", "aten::tanh.out")
    with pytest.raises(ValueError, match="no loaded plugin defines it"):
        ms_adapter.register_op("Tanh", "nosuch::op")
    ms_adapter.register_op("Sigmoid", "aten::sigmoid.out")
    ms_adapter.reset_stats()
    x = Tensor(np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4))
    y = _run(mode, ops.sigmoid, x)
    assert ms_adapter.stats()["kernels"]["aten::sigmoid.out"]["cann_like"] == 1
    ref = 1 / (1 + np.exp(-x.asnumpy().astype(np.float64)))
    assert np.abs(y.asnumpy() - ref).max() <= 4 * 2.0 ** -24


def test_gradients_flow_through_the_plugins_derivative_kernels(mode):
    ms_adapter.enable()
    ms.set_seed(1)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    x = Tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))

    def loss(x):
        return ops.reduce_sum(ops.mul(net(x), net(x)))

    grads = ms.value_and_grad(loss, None, net.trainable_params())(x)[1]
    ms_adapter.disable()
    native = ms.value_and_grad(loss, None, net.trainable_params())(x)[1]
    for g, n in zip(grads, native):
        assert np.abs(g.asnumpy() - n.asnumpy()).max() <= 1e-4 * (1 + np.abs(n.asnumpy()).max())


def test_the_precision_check_passes_right_kernels_and_catches_a_wrong_mapping(mode):
    ms_adapter.enable()
    ms_adapter.precision_check(True)
    try:
        net = _seed_example()
        _run(mode, net, Tensor(np.ones((2, 512)), ms.float16))
        x = Tensor(np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6))
        _run(mode, ops.softmax, x)
        assert ms_adapter.precision_mismatches() == []

        # Tanh served by sigmoid's kernel: the schemas fit, the values do not.
        ms_adapter.register_op("Tanh", "aten::sigmoid.out")
        _run(mode, ops.tanh, x)
        found = ms_adapter.precision_mismatches()
        assert found and {m["op"] for m in found} == {"Tanh"}, found
        worst = found[0]
        assert abs(worst["got"] - 1 / (1 + np.exp(-x.asnumpy().flat[worst["index"]]))) < 1e-6
        assert abs(worst["reference"] - np.tanh(x.asnumpy().astype(np.float64).flat[worst["index"]])) < 1e-12
        assert worst["abs_error"] > worst["bound"]
    finally:
        ms_adapter.precision_check(False)
        ms_adapter.register_op("Tanh", "aten::tanh.out")


def test_mindspores_type_promotion_and_arguments_stay_its_own(mode):
    ms_adapter.enable()
    ms_adapter.reset_stats()
    h = Tensor(np.array([1.001, 2.1234567, 3.0001]), ms.float16)
    f = Tensor(np.array([0.5, 0.25, 0.125]), ms.float32)
    i = Tensor(np.array([7, 9, 11]), ms.int32)
    mixed = _run(mode, ops.add, h, f)
    assert mixed.dtype == ms.float32
    np.testing.assert_array_equal(mixed.asnumpy(), h.asnumpy().astype(np.float32) + f.asnumpy())
    quotient = _run(mode, ops.div, i, Tensor(np.array([2, 3, 4]), ms.int32))
    assert quotient.dtype == ms.float32
    np.testing.assert_array_equal(quotient.asnumpy(), np.array([3.5, 3.0, 2.75], np.float32))
    floor = ops.div(f, Tensor(np.array([0.3, 0.3, 0.3]), ms.float32), rounding_mode="floor")
    np.testing.assert_array_equal(floor.asnumpy(), np.array([1, 0, 0], np.float32))
    tanh_gelu = ops.gelu(f, approximate="tanh")
    x = f.asnumpy().astype(np.float64)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.abs(tanh_gelu.asnumpy() - ref).max() <= 8 * 2.0 ** -24
    assert ms_adapter.stats()["kernels"] == {}


def _layer_norm_loss(x, gamma, beta):
    y = ops.layer_norm(x, (x.shape[-1],), gamma, beta, 1e-5)
    return ops.reduce_sum(ops.mul(y, y))


def test_layer_norm_forward_and_backward_on_the_plugin(mode):
    ms_adapter.enable()
    rng = np.random.default_rng(4)
    x, g, b = (rng.standard_normal(s) for s in ((3, 16), (16,), (16,)))
    xt, gt, bt = (Tensor(v.astype(np.float32)) for v in (x, g, b))
    ms_adapter.reset_stats()
    y = _run(mode, ops.layer_norm, xt, (16,), gt, bt, 1e-5)
    grads = ms.grad(_run_fn(mode, _layer_norm_loss), (0, 1, 2))(xt, gt, bt)
    s = ms_adapter.stats()["kernels"]
    assert "aten::native_layer_norm" in s and "aten::native_layer_norm_backward" in s, s

    # float64 reference and its gradient (dL/dy = 2y through the normalisation).
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + 1e-5)
    ref = xhat * g + b
    dy = 2 * ref
    dxhat = dy * g
    dx = (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / np.sqrt(var + 1e-5)
    # 16-term sums in float32: gamma_16 relative to each result's terms, plus rounding.
    u = 2.0 ** -24
    assert np.abs(y.asnumpy() - ref).max() <= 64 * u * (np.abs(xhat * g).max() + np.abs(b).max())
    for got, want in zip(grads, (dx, (dy * xhat).sum(0), dy.sum(0))):
        assert np.abs(got.asnumpy() - want).max() <= 256 * u * np.abs(dy).max() * (1 + np.abs(xhat).max()) * 16

    # nn.LayerNorm routes through the same op.
    layer = nn.LayerNorm((16,), epsilon=1e-5)
    ms_adapter.reset_stats()
    out = _run(mode, layer, xt)
    assert ms_adapter.stats()["kernels"]["aten::native_layer_norm"]
    assert np.abs(out.asnumpy() - xhat).max() <= 64 * u * np.abs(xhat).max()


def _run_fn(mode, fn):
    return ms.jit(fn) if mode == "graph" else fn


def _tanh_sigmoid_loss(x):
    return ops.reduce_sum(ops.add(ops.tanh(x), ops.sigmoid(x)))


def test_tanh_and_sigmoid_gradients(mode):
    ms_adapter.enable()
    x = np.linspace(-3, 3, 13)
    ms_adapter.reset_stats()
    g = ms.grad(_run_fn(mode, _tanh_sigmoid_loss))(Tensor(x.astype(np.float32)))
    s = ms_adapter.stats()["kernels"]
    assert "aten::tanh_backward.grad_input" in s and "aten::sigmoid_backward.grad_input" in s, s
    sig = 1 / (1 + np.exp(-x))
    assert np.abs(g.asnumpy() - ((1 - np.tanh(x) ** 2) + sig * (1 - sig))).max() <= 16 * 2.0 ** -24


def test_register_op_can_be_called_again_and_again_and_refuses_without_changing_anything():
    ms_adapter.enable()
    try:
        for _ in range(20):  # bindings are reused: the 512 slots last
            ms_adapter.register_op("Tanh", "aten::sigmoid.out")
            ms_adapter.register_op("Tanh", "aten::tanh.out")
        with pytest.raises(ValueError, match="expected ms_op to be one of .*but found 'FlashAttentionScore'"):
            ms_adapter.register_op("FlashAttentionScore", "aten::relu")
        with pytest.raises(ValueError, match="cannot map Tanh"):
            ms_adapter.register_op("Tanh", "aten::mm.out")
        assert ms_adapter.routes()["Tanh"] == "aten::tanh.out"
        x = Tensor(np.array([0.5], np.float32))
        assert abs(float(ops.tanh(x).asnumpy()[0]) - np.tanh(0.5)) < 1e-6
    finally:
        ms_adapter.disable()


def _graph_matmul(a, b):
    return ops.matmul(a, b)


def test_a_graph_compiled_before_a_level_change_fails_saying_why():
    ms_adapter.enable()
    a = Tensor(np.ones((2, 2), np.float32))
    step = ms.jit(_graph_matmul)
    try:
        step(a, a).asnumpy()
        ms_adapter.set_optim_level("O0")
        with pytest.raises(RuntimeError):
            step(a, a).asnumpy()
        assert ms_adapter.last_error().startswith(
            "npubridge.mindspore: op 'aten::mm.out': no kernel serves this call now (optimisation level 0 "
            "disables every plugin kernel")
        assert "compile it again" in ms_adapter.last_error()
    finally:
        ms_adapter.set_optim_level("O2")
        ms_adapter.disable()


def _rms_loss(x, g):
    return ops.reduce_sum(ops.mul(ops.rms_norm(x, g, 1e-6)[0], x))


def test_float64_statistics_and_a_gamma_of_two_dims(mode):
    ms_adapter.enable()
    rng = np.random.default_rng(5)
    x, g = rng.standard_normal((3, 2, 4)), rng.standard_normal((2, 4))
    xt, gt = Tensor(x), Tensor(g)
    ms_adapter.reset_stats()
    dx, dg = ms.grad(_run_fn(mode, _rms_loss), (0, 1))(xt, gt)
    assert "mindspeed_like::npu_rms_norm_backward" in ms_adapter.stats()["kernels"]
    # d/dx sum(rms(x) * g * x) by central differences of the float64 formula.
    def loss(x):
        r = 1 / np.sqrt((x * x).mean((-2, -1), keepdims=True) + 1e-6)
        return (x * r * g * x).sum()
    h, num = 1e-6, np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = h
        num[i] = (loss(x + d) - loss(x - d)) / (2 * h)
    assert np.abs(dx.asnumpy() - num).max() <= 1e-6 * (1 + np.abs(num).max())
    r = 1 / np.sqrt((x * x).mean((-2, -1), keepdims=True) + 1e-6)
    assert np.abs(dg.asnumpy() - (x * r * x).sum(0)).max() <= 1e-12 * (1 + np.abs(x * r * x).sum())


def test_what_no_route_takes_is_mindsporess_and_counted(mode):
    ms_adapter.enable()
    ms_adapter.reset_stats()
    h = Tensor(np.ones((2, 3)), ms.float16)
    f = Tensor(np.ones((3, 2)), ms.float32)
    # As MindSpore alone: MatMul takes one dtype. Compiled, so that the error
    # is raised here: PyNative's queue may raise it again at a later operator.
    with pytest.raises(TypeError):
        ms.jit(ops.matmul)(h, f)
    y = _run(mode, ops.add, f, 2.0)
    np.testing.assert_array_equal(y.asnumpy(), np.full((3, 2), 3, np.float32))
    s = ms_adapter.stats()
    assert s["fallbacks"]["Add"] >= 1 and "a Python number operand" in s["fallback_reasons"]["Add"], s
    assert s["kernels"] == {}, s
    softmax = nn.Softmax(axis=0)  # not patched: MindSpore's own, whatever the mode
    np.testing.assert_allclose(_run(mode, softmax, f).asnumpy(), np.full((3, 2), 1 / 3), rtol=1e-6)


def test_a_dynamic_shape_goes_to_mindspore():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms_adapter.enable()
        net = nn.Dense(4, 2)
        net.set_inputs(Tensor(shape=[None, 4], dtype=ms.float32))
        ms_adapter.reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = net(Tensor(np.ones((3, 4), np.float32)))
        assert y.shape == (3, 2)
        s = ms_adapter.stats()
        assert "dynamic shape" in s["fallback_reasons"]["MatMul"] and "aten::mm.out" not in s["kernels"], s
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms_adapter.disable()


def test_optimizers_share_their_binding():
    ms_adapter.enable()
    p = ms.Parameter(Tensor(np.ones(3, np.float32)), name="p")
    try:
        for _ in range(600):  # more than the 512 slots
            ms_adapter.AdamW([p])
    finally:
        ms_adapter.disable()


# Last in the file: it starts PyTorch's npu runtime, whose fallback (PyTorch's
# CPU kernels) the dispatcher then holds for every host of the process, so
# that the test above would no longer fail (docs/mindspore.md, "Limits").
def test_a_level_set_from_pytorch_changes_mindsporess_routing_too():
    import npubridge

    ms_adapter.enable()
    a = Tensor(np.ones((2, 3), np.float32))
    try:
        ms_adapter.reset_stats()
        ops.matmul(a, ops.transpose(a, (1, 0)))
        assert ms_adapter.stats()["kernels"]["aten::mm.out"]["cann_like"] == 1
        npubridge.set_optim_level(0)
        ms_adapter.reset_stats()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = ops.matmul(a, ops.transpose(a, (1, 0)))
        np.testing.assert_array_equal(y.asnumpy(), np.full((2, 2), 3, np.float32))
        s = ms_adapter.stats()
        assert "aten::mm.out" not in s["kernels"] and s["fallbacks"]["MatMul"] == 1, s
    finally:
        npubridge.set_optim_level(2)
        ms_adapter.disable()
