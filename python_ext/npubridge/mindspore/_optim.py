"""AdamW on the plugins' fused kernel (mindspeed_like::npu_apply_adam_w, the
update torch.optim.AdamW makes): one Custom call per parameter updates the
parameter and both moments; MindSpore's own mint.optim.AdamW when the
adapter is disabled or no kernel serves the dtype."""
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from . import _routes


def _shapes(*s):
    return [s[0], s[2], s[3]]


def _dtypes(*d):
    return [d[0], d[2], d[3]]


class AdamW(nn.Cell):
    """optimizer(grads) updates `params` in place, as torch.optim.AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(auto_prefix=False)
        from . import _build, _functions
        if not _functions:
            _build()
        self.parameters = ms.ParameterTuple(list(params))
        self.exp_avg = self.parameters.clone(prefix="exp_avg", init="zeros")
        self.exp_avg_sq = self.parameters.clone(prefix="exp_avg_sq", init="zeros")
        self.step_count = Parameter(Tensor(0, ms.int64), name="adamw_step", requires_grad=False)
        self.lr, self.beta1, self.beta2, self.eps, self.weight_decay = float(lr), float(betas[0]), float(
            betas[1]), float(eps), float(weight_decay)
        from ._table import TABLE, bind
        self.key = bind("AdamW", *TABLE["AdamW"], _shapes, _dtypes)
        self.prim = _routes.binding(self.key).prim

    def construct(self, grads):
        step = self.step_count + 1
        ops.assign(self.step_count, step)
        for i in range(len(self.parameters)):
            p, g, m, v = self.parameters[i], grads[i], self.exp_avg[i], self.exp_avg_sq[i]
            if _routes.served(self.key, (p.dtype, g.dtype, m.dtype, v.dtype, ms.int64, ms.float64, ms.float64,
                                         ms.float64, ms.float64, ms.float64),
                              (p.shape, g.shape, m.shape, v.shape, (), (), (), (), (), ()),
                              (None, None, None, None, 1, self.lr, self.beta1, self.beta2, self.eps,
                               self.weight_decay)):
                new_p, new_m, new_v = self.prim(p, g, m, v, step, Tensor(self.lr, ms.float64),
                                                Tensor(self.beta1, ms.float64), Tensor(self.beta2, ms.float64),
                                                Tensor(self.eps, ms.float64), Tensor(self.weight_decay, ms.float64))
            else:
                new_p, new_m, new_v = _adamw_native(p, g, m, v, step, self.lr, self.beta1, self.beta2, self.eps,
                                                    self.weight_decay)
            ops.assign(p, new_p)
            ops.assign(m, new_m)
            ops.assign(v, new_v)
        return True


def _adamw_native(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW's update in MindSpore's operators."""
    t = ops.cast(step, ms.float32)
    p = p * (1 - lr * weight_decay)
    m = m * beta1 + g * (1 - beta1)
    v = v * beta2 + g * g * (1 - beta2)
    bc1 = 1 - ops.pow(Tensor(beta1, ms.float32), t)
    bc2 = 1 - ops.pow(Tensor(beta2, ms.float32), t)
    denom = ops.sqrt(v) / ops.sqrt(bc2) + eps
    return p - (lr / bc1) * m / denom, m, v
