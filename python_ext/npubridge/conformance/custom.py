"""The plugin's own ops for `python3 -m npubridge conformance --plugin`
(plugin.py): the samples and ATen-written reference of its
npubridge.testing file, its meta function on fake tensors and its derivative
formula against the reference's autograd and finite differences."""
import itertools
import os
import warnings

import torch

from .. import _C, testing
from .._autograd import _resolve
from .isolate import Checkpoint
from .judge import calibrated, judgeable, to_device, to_float32, tolerance, tree_map, weighted_grads
from .verdict import first_line, phase


def _shown(path):
    """A tests file as a report names it: relative to the working directory
    when it lies under it, so that a committed report names the checkout's
    file rather than one machine's path."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _clone_cpu(x):
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _float64_copy(x):
    # Copies even a float64 tensor: a reference of an op that writes its
    # arguments updates them in place, and must not update the sample's.
    return tree_map(lambda t: t.detach().to(torch.float64, copy=True) if isinstance(t, torch.Tensor)
                and t.is_floating_point() else (t.detach().clone() if isinstance(t, torch.Tensor) else t), x)


def _noncontiguous_like(t):
    # The same values in every other element of a buffer twice as long in
    # the last dimension (what torch.testing's noncontiguous_like makes,
    # without its test-only dependencies).
    wide = t.new_empty(t.shape[:-1] + (2 * t.shape[-1],))
    view = wide[..., ::2]
    view.copy_(t.detach())
    return view.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else view


def _noncontiguous(x):
    return tree_map(lambda t: _noncontiguous_like(t) if isinstance(t, torch.Tensor) and t.numel() > 1 and t.dim() > 0
                else t, x)


def _as_list(x):
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for t in x if isinstance(t, torch.Tensor)]


def _written(schema):
    return [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


class CustomOp:
    def __init__(self, op, tests: testing.OpTests, derivative):
        self.name, self.tests, self.derivative = op, tests, derivative
        self.packet = _resolve(op)
        self.schema = self.packet._schema
        self.written = _written(self.schema)
        self.returns_nothing = len(self.schema.returns) == 0

    def outputs(self, result, args, kwargs=None):
        """The op's results: its returns, or the tensors of the arguments it
        writes, in schema order, a written list (`Tensor(a!)[]`) tensor by
        tensor."""
        if self.returns_nothing:
            out = []
            for i in self.written:
                arg = args[i] if i < len(args) else (kwargs or {}).get(self.schema.arguments[i].name)
                out.extend(_as_list(arg))
            return out
        return _as_list(result)

    def reference(self, args, kwargs):
        result = self.tests.reference(*args, **kwargs)
        return _as_list(result)


def _unwritten_change(cop, npu_args, npu_kwargs, cpu_args, cpu_kwargs):
    """The name of a tensor argument the kernel changed although the schema
    does not mark it as written (Tensor(a!)), or None."""
    for i, a in enumerate(cop.schema.arguments):
        if i in cop.written:
            continue
        got = npu_args[i] if i < len(npu_args) else npu_kwargs.get(a.name)
        was = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(a.name)
        if not isinstance(was, (torch.Tensor, list, tuple)):
            continue
        for j, (g, w) in enumerate(zip(_as_list(got), _as_list(was))):
            g = g.detach().cpu()
            if g.shape != w.shape:
                return a.name + (f"[{j}]" if isinstance(got, (list, tuple)) else "")
            same = g == w
            if g.is_floating_point():  # NaN stays NaN; a bool or integer argument (a mask) compares as is
                same |= g.isnan() & w.isnan()
            if not same.all():
                return a.name + (f"[{j}]" if isinstance(got, (list, tuple)) else "")
    return None


def _judge_all(got, host, wide, what):
    if len(got) != len(host):
        raise AssertionError(f"{what}: the kernel produced {len(got)} tensors, the reference {len(host)}")
    for i, (g, h) in enumerate(zip(got, host)):
        w = wide[i] if wide is not None and i < len(wide) else None
        g = g.detach().cpu()
        if w is not None and (w.shape != h.shape):
            w = None
        if judgeable(g) and judgeable(h):
            if w is None or not w.is_floating_point():
                w = h.double() if h.is_floating_point() else h
            msg = _C.judge(g, h.detach(), w.detach())
            if msg:
                raise AssertionError(f"{what} {i}: {msg}")
        else:
            torch.testing.assert_close(g, h, equal_nan=True, check_device=False, **tolerance(h.dtype))


def _meta_check(cop, npu_args, npu_kwargs, got):
    """Runs the op on fake tensors; raises when its declared outputs differ
    from the kernel's real ones (shape, dtype)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, npu_args)
        fake_kwargs = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, npu_kwargs)
        try:
            result = cop.packet(*fake_args, **fake_kwargs)
        except Exception as e:  # noqa: BLE001 - reported with the meta function named
            raise AssertionError(
                f"the meta function raised on a sample the kernel computes: {first_line(e)}") from None
        declared = cop.outputs(result, list(fake_args), fake_kwargs)
        declared = [(tuple(t.shape), t.dtype) for t in declared]
    real = [(tuple(t.shape), t.dtype) for t in got]
    if len(declared) != len(real):
        raise AssertionError(f"the meta function declares {len(declared)} outputs, the kernel returned {len(real)}")
    for i, (d, r) in enumerate(zip(declared, real)):
        if d != r:
            raise AssertionError(f"output {i}: the meta function declares shape {list(d[0])} {str(d[1])[6:]}, "
                                 f"the kernel returned shape {list(r[0])} {str(r[1])[6:]}")


def _has_meta(op):
    """Whether PyTorch has a Meta kernel for the op (what a plugin's meta
    function is registered as)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")
    except RuntimeError:
        return False


def _gradient_check(cop, sample, dtype, gradcheck):
    """The plugin's derivative formula against the reference's autograd (and
    finite differences when `gradcheck`)."""
    entry = cop.derivative
    inputs = [i for i in entry["inputs"] if i < len(sample.args) and isinstance(sample.args[i], torch.Tensor)]
    diff_outs = sorted({i for kind, i in (tuple(a) for a in entry["args"]) if kind == "grad"})
    if not inputs or any(not sample.args[i].is_floating_point() or sample.args[i].numel() == 0 for i in inputs):
        return False

    def with_grad(args, device, to):
        args = list(args)
        for i in range(len(args)):
            if isinstance(args[i], torch.Tensor):
                t = to(args[i].detach())
                args[i] = to_device(device)(t) if device != "cpu" else t.clone()
        for i in inputs:
            args[i].requires_grad_(True)
        return args

    def pick(outs):
        return [outs[i] for i in diff_outs if i < len(outs)]

    npu_args = with_grad(sample.args, "npu", lambda t: t)
    npu_outs = pick(_as_list(cop.packet(*npu_args, **sample.kwargs)))
    weights = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape) for t in npu_outs]
    npu_grads = weighted_grads(npu_outs, [npu_args[i] for i in inputs], weights)
    host_args = with_grad(sample.args, "cpu", lambda t: t)
    try:
        host_outs = pick(cop.reference(host_args, sample.kwargs))
        host_grads = weighted_grads(host_outs, [host_args[i] for i in inputs], weights)
        wide_args = with_grad(sample.args, "cpu", lambda t: t.double() if t.is_floating_point() else t)
        wide_outs = pick(cop.reference(wide_args, sample.kwargs))
        wide_grads = weighted_grads(wide_outs, [wide_args[i] for i in inputs],
                                            [w.double() for w in weights])
        if dtype == torch.float64:
            narrow_args = with_grad(sample.args, "cpu", to_float32)
            narrow_outs = pick(cop.reference(narrow_args, sample.kwargs))
            narrow_grads = weighted_grads(narrow_outs, [narrow_args[i] for i in inputs],
                                                  [w.float() for w in weights])
            host_grads = [calibrated(h, n) if h is not None and n is not None else h
                          for h, n in zip(host_grads, narrow_grads)]
    except Exception as e:  # noqa: BLE001 - the reference is not differentiable: only gradcheck can judge
        host_grads = None
        if not gradcheck:
            raise AssertionError(f"the reference is not differentiable ({first_line(e)}) and the kernel takes "
                                 "no float64 for gradcheck") from None
    if host_grads is not None:
        names = [cop.schema.arguments[i].name for i in inputs]
        for name, g, h, w in zip(names, npu_grads, host_grads, wide_grads):
            if (g is None) != (h is None):
                raise AssertionError(f"gradient of {name}: defined by {'the formula' if h is None else 'the reference'}"
                                     " only")
            if g is not None:
                _judge_all([g], [h], [w], f"gradient of {name} (the formula against the reference's autograd):"
                           " output")
    if gradcheck:
        base = with_grad(sample.args, "npu", lambda t: t)

        def fn(*diff):
            args = list(base)
            for slot, t in zip(inputs, diff):
                args[slot] = t
            return tuple(pick(_as_list(cop.packet(*args, **sample.kwargs))))

        try:
            torch.autograd.gradcheck(fn, tuple(base[i] for i in inputs), eps=1e-6, atol=1e-5, rtol=1e-3,
                                     raise_exception=True)
        except Exception as e:  # noqa: BLE001
            text = " ".join(str(e).split())[:500]
            raise AssertionError(f"gradcheck (the formula against finite differences, float64): {text}") from None
    return True


def run_custom(cells, ops, probe, max_samples, derivatives, where, log=print, checkpoint=None):
    """Runs the npubridge.testing samples of the plugin's own ops, an op at
    one dtype a unit of `checkpoint`."""
    checkpoint = checkpoint or Checkpoint()
    registered = testing.registered()
    for op, dtypes in ops.items():
        tests = registered.get(op)
        op_cells = [cells[(op, d)] for d in dtypes]
        if tests is None or tests.samples is None:
            for c in op_cells:
                c.finish(f"no samples: declare @testing.samples(\"{op}\") in {where}")
            continue
        if tests.reference is None:
            for c in op_cells:
                c.finish(f"no reference: declare @testing.reference(\"{op}\") in {where}")
            continue
        try:
            cop = CustomOp(op, tests, derivatives.get(op))
        except Exception as e:  # noqa: BLE001 - PyTorch refused the op's schema
            for c in op_cells:
                c.finish(f"PyTorch has no op {op} to call ({first_line(e)})")
            continue
        has_meta = _has_meta(op)
        source = f"tests {_shown(tests.where.rsplit(':', 1)[0])}"
        for dtype_name in dtypes:
            cell = cells[(op, dtype_name)]
            dtype = getattr(torch, dtype_name)
            unit = f"custom {op} {dtype_name}"
            if checkpoint.skip(unit, [(op, dtype_name)]):
                continue
            torch.manual_seed(0)
            try:
                samples = list(itertools.islice(tests.samples(dtype) or (), max_samples))
            except Exception as e:  # noqa: BLE001 - the author's sample function failed
                cell.fail(f"the samples function raised for {dtype_name}: {first_line(e)}")
                checkpoint.done(unit)
                continue
            for i, s in enumerate(samples):
                if not isinstance(s, testing.Sample):
                    cell.fail(f"sample {i}: expected a testing.Sample but found {type(s).__name__}")
                    break
                label = f"sample {i}" + (f" '{s.name}'" if s.name else "")
                for variant, sample in (("", s), (" non-contiguous", None)):
                    if variant:
                        sample = testing.Sample(*_noncontiguous(s.args), name=s.name, **_noncontiguous(s.kwargs))
                    checkpoint.start(unit, [(op, dtype_name)], source, label + variant)
                    _run_custom_sample(cell, cop, sample, dtype, source, label + variant, probe,
                                       meta=has_meta and not variant,
                                       gradients=cop.derivative is not None and not variant)
            if not has_meta and cell.samples:
                cell.note = ("no meta function: fake tensors, torch.compile and torch.export cannot trace "
                             "the op")
            cell.finish(f"no sample for {dtype_name}, which the kernel declares (the samples function yielded "
                        "none)" if not samples else "no sample reached the kernel")
            checkpoint.done(unit)


def _run_custom_sample(cell, cop, sample, dtype, source, label, probe, meta, gradients):
    try:
        host = cop.reference(_clone_cpu(list(sample.args)), _clone_cpu(sample.kwargs))
        ref_error = None
    except Exception as e:  # noqa: BLE001 - the reference rejects the sample: the kernel must too
        host, ref_error = None, first_line(e)
    wide = None
    if ref_error is None:
        try:
            wide = cop.reference(_float64_copy(list(sample.args)), _float64_copy(sample.kwargs))
        except Exception:  # noqa: BLE001 - no float64 reference: the sample's dtype alone decides
            wide = None
        if dtype == torch.float64:
            try:
                host = calibrated(host, cop.reference(tree_map(to_float32, _clone_cpu(list(sample.args))),
                                                      tree_map(to_float32, _clone_cpu(sample.kwargs))))
            except Exception:  # noqa: BLE001 - no float32 run: the float64 result alone is the host's
                pass
    npu_args = tree_map(to_device("npu"), list(sample.args))
    npu_kwargs = tree_map(to_device("npu"), sample.kwargs)
    box = {}

    def forward():
        box["result"] = cop.packet(*npu_args, **npu_kwargs)

    _, error, served, declined = phase(probe, forward)
    op = cop.name
    if op in declined and op not in served:
        cell.declined += 1
        cell.decline_reason = cell.decline_reason or declined[op]
        return
    if ref_error is not None:
        cell.served(source, "error case")
        if error is None:
            cell.fail(f"{source} {label}: the reference rejects the sample ({ref_error}) but the kernel "
                      "accepted it")
        else:
            cell.passed += 1
        return
    cell.served(source, "forward")
    if error is not None:
        cell.fail(f"{source} {label} (forward): {error}")
        return
    changed = _unwritten_change(cop, npu_args, npu_kwargs, list(sample.args), sample.kwargs)
    if changed is not None:
        cell.fail(f"{source} {label} (forward): the kernel changed argument '{changed}', which the schema does not "
                  "mark as written (Tensor(a!))")
        return
    got = cop.outputs(box.get("result"), npu_args, npu_kwargs)
    try:
        _judge_all(got, host, wide, "output")
    except AssertionError as e:
        cell.fail(f"{source} {label} (forward): {e}")
        return
    except Exception as e:  # noqa: BLE001
        cell.fail(f"{source} {label} (forward): {first_line(e)}")
        return
    if meta:
        try:
            _meta_check(cop, tree_map(to_device("npu"), list(sample.args)), tree_map(to_device("npu"), sample.kwargs),
                        got)
            if "meta" not in cell.checks:
                cell.checks.append("meta")
        except AssertionError as e:
            cell.fail(f"{source} {label} (meta): {e}")
            return
        except Exception as e:  # noqa: BLE001
            cell.fail(f"{source} {label} (meta): {first_line(e)}")
            return
    if gradients and dtype.is_floating_point:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                checked = _gradient_check(cop, sample, dtype, gradcheck=dtype == torch.float64)
            if checked:
                check = "gradcheck" if dtype == torch.float64 else "backward"
                if check not in cell.checks:
                    cell.checks.append(check)
        except AssertionError as e:
            cell.fail(f"{source} {label} (derivative): {e}")
            return
        except Exception as e:  # noqa: BLE001
            cell.fail(f"{source} {label} (derivative): {first_line(e)}")
            return
    cell.passed += 1
