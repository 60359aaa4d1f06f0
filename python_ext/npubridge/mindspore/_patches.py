"""What enable() changes in MindSpore, and disable() puts back: functional
operators of mindspore.ops, and the construct of the layers that call
primitives they made themselves (nn.Dense's MatMul and BiasAdd, nn.ReLU's
ReLU, nn.LayerNorm's LayerNorm, ...). nn.Softmax is not among them: it
keeps its axis on its primitive alone, which a compiled construct cannot
read; ops.softmax is routed. A name bound before enable() (`from mindspore.ops import
matmul`) keeps MindSpore's operator; `ops.matmul(...)` and the layers see
the routed one, in PyNative and in graphs compiled afterwards.
"""
from mindspore import nn, ops

_saved = {}  # (owner, attribute) -> MindSpore's own
_fns = {}  # the routed functions in use, for the layers' construct


def _dense_construct(self, x):
    x_shape = x.shape
    if len(x_shape) != 2:
        x = ops.reshape(x, (-1, x_shape[-1]))
    # Under Cell.to_float(float16) MindSpore casts a layer's float32
    # parameters for its own primitives; the patched construct does the same.
    x = _routed_linear(x, ops.cast(self.weight, x.dtype))
    if self.has_bias:
        x = ops.add(x, ops.cast(self.bias, x.dtype))
    if self.activation_flag:
        x = self.activation(x)
    if len(x_shape) != 2:
        x = ops.reshape(x, x_shape[:-1] + (x.shape[-1],))
    return x


def _routed_linear(x, w):
    return _fns["linear"](x, w)


def _relu_construct(self, x):
    return ops.relu(x)


def _silu_construct(self, x):
    return ops.silu(x)


def _sigmoid_construct(self, x):
    return ops.sigmoid(x)


def _tanh_construct(self, x):
    return ops.tanh(x)


def _layer_norm_construct(self, x):
    if self.begin_norm_axis == -1 and self.begin_params_axis == -1 and len(self.normalized_shape) == 1:
        return _fns["layer_norm_affine"](x, self.gamma.astype(x.dtype), self.beta.astype(x.dtype), self.epsilon)
    y, _, _ = self.layer_norm(x, self.gamma.astype(x.dtype), self.beta.astype(x.dtype))
    return y


# layer -> (construct, the functional operator it needs routed)
_LAYERS = {
    nn.Dense: (_dense_construct, "linear"),
    nn.ReLU: (_relu_construct, "relu"),
    nn.SiLU: (_silu_construct, "silu"),
    nn.Sigmoid: (_sigmoid_construct, "sigmoid"),
    nn.Tanh: (_tanh_construct, "tanh"),
    nn.LayerNorm: (_layer_norm_construct, "layer_norm_affine"),
}


def _set(owner, name, value):
    if (owner, name) not in _saved:
        _saved[(owner, name)] = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)


def install(fns):
    _fns.clear()
    _fns.update(fns)
    for name, fn in fns.items():
        if name not in ("linear", "layer_norm_affine") and hasattr(ops, name):
            _set(ops, name, fn)
    for layer, (construct, needs) in _LAYERS.items():
        if needs in fns:
            _set(layer, "construct", construct)


def uninstall():
    for (owner, name), value in _saved.items():
        setattr(owner, name, value)
    _saved.clear()
