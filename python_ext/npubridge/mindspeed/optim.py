"""FusedAdamW: torch.optim.AdamW's update, one plugin call per group of tensors.

torch.optim.AdamW(foreach=False) runs about a dozen ATen ops per parameter
per step, each a separate dispatch and pass over memory. FusedAdamW hands
all of a param group's tensors that share a dtype and a step count to
``mindspeed_like::npu_apply_adam_w`` at once, which updates param, exp_avg,
exp_avg_sq (and max_exp_avg_sq) in place in one pass per tensor.

The state has torch.optim.AdamW's keys and dtypes ('step' a float32 scalar
tensor on the CPU, 'exp_avg', 'exp_avg_sq', 'max_exp_avg_sq' shaped and
typed like the param), so a state_dict of either optimizer loads into the
other.
"""
import torch

from . import functional

__all__ = ["FusedAdamW"]


def _scalar(value):
    return value.item() if isinstance(value, torch.Tensor) else value


class FusedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) with the update fused into
    ``mindspeed_like::npu_apply_adam_w``; the numbers are those of
    ``torch.optim.AdamW(foreach=False)``.

    Args: as torch.optim.AdamW: ``params`` (tensors or param-group dicts),
    ``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad`` and the keyword
    ``maximize``; torch's ``foreach`` and ``fused`` are accepted and have no
    effect (the update is always fused), while ``capturable=True`` and
    ``differentiable=True`` are refused. ``lr`` may change between steps (LR schedulers write
    ``param_groups[i]['lr']``). Parameters must be npu tensors of float32,
    float16 or bfloat16 by the time ``step()`` runs; parameters without a
    gradient are skipped and sparse gradients are an error, as in torch.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, fused=None, capturable=False, differentiable=False):
        for name, value in (("capturable", capturable), ("differentiable", differentiable)):
            if value:
                raise ValueError(f"FusedAdamW: {name}=True is not supported (expected False); "
                                 "use torch.optim.AdamW for it")
        lr, betas = _scalar(lr), tuple(_scalar(b) for b in betas)
        if not 0.0 <= lr:
            raise ValueError(f"FusedAdamW: expected lr >= 0 but found {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"FusedAdamW: expected eps >= 0 but found {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"FusedAdamW: expected betas[{i}] in [0, 1) but found {beta}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"FusedAdamW: expected weight_decay >= 0 but found {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        # A state_dict of torch.optim.AdamW (or an older FusedAdamW) may lack
        # these keys; its own extra keys (foreach, fused, ...) are kept and ignored.
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    def _state_of(self, p, amsgrad):
        state = self.state[p]
        if len(state) == 0:
            # As torch.optim.AdamW without capturable/fused: 'step' lives on the CPU.
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @staticmethod
    def _check(p, where):
        if p.grad.is_sparse:
            raise RuntimeError(f"FusedAdamW does not support sparse gradients ({where}), please consider "
                               f"torch.optim.SparseAdam instead")
        if p.device.type != "npu":
            raise RuntimeError(f"FusedAdamW: expected npu parameters but found a {p.device.type} parameter "
                               f"({where}); move the model with .to('npu') first, or use torch.optim.AdamW")
        if p.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise RuntimeError(f"FusedAdamW: expected float32, float16, bfloat16 or float64 parameters but found "
                               f"{p.dtype} ({where})")
        if p.grad.device != p.device or p.grad.dtype != p.dtype:
            raise RuntimeError(f"FusedAdamW: expected the gradient on {p.device} in {p.dtype} like its parameter "
                               f"but found {p.grad.device} {p.grad.dtype} ({where})")

    @torch.no_grad()
    def step(self, closure=None):
        """One optimization step; ``closure`` (optional) re-evaluates the model
        and returns the loss, which step() returns."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Every parameter is checked before any state changes, so a refused
        # step leaves the optimizer as it was.
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is not None:
                    self._check(p, f"param group {gi}, param {pi}")
        for group in self.param_groups:
            amsgrad, maximize = bool(group["amsgrad"]), bool(group["maximize"])
            beta1, beta2 = (float(_scalar(b)) for b in group["betas"])
            lr, eps, wd = float(_scalar(group["lr"])), float(group["eps"]), float(group["weight_decay"])
            # One kernel call per (dtype, step): a param whose grad was None in
            # some step has a smaller step count than its group mates.
            buckets = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state_of(p, amsgrad)
                key = (p.dtype, int(state["step"].item()) + 1)
                buckets.setdefault(key, []).append((p, state))
            for (_, step), members in buckets.items():
                functional.npu_apply_adam_w([p for p, _ in members], [p.grad for p, _ in members],
                                            [s["exp_avg"] for _, s in members], [s["exp_avg_sq"] for _, s in members],
                                            [s["max_exp_avg_sq"] for _, s in members] if amsgrad else [], step, lr,
                                            beta1, beta2, eps, wd, amsgrad, maximize)
                for _, state in members:  # counted once the kernel has taken the step
                    state["step"] += 1
        return loss
