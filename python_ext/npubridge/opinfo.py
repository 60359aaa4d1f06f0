"""Runs PyTorch's own OpInfo database (torch.testing._internal, shipped in the
wheel) on npu against the CPU.

For every op of ``op_db`` that supports the dtype (float32, or bfloat16 for
ops a plugin serves natively): each sample input (up to ``max_samples``)
runs on the CPU, on the CPU in float64, and, moved to npu, on npu; outputs
are judged by the error model npub-conformance and the precision check use
(``_C.judge``, host-calibrated: within a few ulps of the float64 result
plus four times the CPU's own error against it; integer and bool results
exact),
see _assert_matches; where the op supports
autograd the gradients of a fixed projection of the outputs are compared too;
every third sample also runs with non-contiguous inputs. Ops whose results
are random or uninitialised by definition are not compared (SKIPPED, with the
reason), as PyTorch's own device tests skip them.
"""
import json
import time
import warnings

import torch

# Only where the error model cannot judge (complex results, or an op with no
# float64 CPU kernel): the CPU's result at a per-dtype tolerance.
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2)}

# Ops whose output is not a function of their inputs, or that need other
# hardware; PyTorch's device tests skip these the same way.
SKIPPED = {
    "empty": "uninitialised memory", "empty_like": "uninitialised memory", "new_empty": "uninitialised memory",
    "new_empty_strided": "uninitialised memory", "empty_strided": "uninitialised memory",
    "empty_permuted": "uninitialised memory",
    "randn_like": "random", "rand_like": "random", "randint_like": "random", "randint": "random", "randn": "random",
    "rand": "random", "normal": "random", "normal.in_place": "random", "normal.number_mean": "random", "uniform": "random",
    "bernoulli": "random", "multinomial": "random", "cauchy": "random", "exponential": "random",
    "geometric": "random", "log_normal": "random", "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random", "nn.functional.dropout3d": "random", "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.feature_alpha_dropout.without_train": "random", "nn.functional.rrelu": "random",
    "nn.functional.fractional_max_pool2d": "random", "nn.functional.fractional_max_pool3d": "random",
    "as_strided.partial_views": "reads storage outside the view, which a device copy of the view does not carry",
    "as_strided": "reads storage outside the view, which a device copy of the view does not carry",
    "as_strided_copy": "reads storage outside the view, which a device copy of the view does not carry",
    "as_strided_scatter": "reads storage outside the view, which a device copy of the view does not carry",
    "tensor_split": "takes its indices on the CPU by contract",
}
SKIPPED_PREFIXES = ("jiterator_", "_refs.")

# Samples whose result is random (attention with dropout in training) run
# with the dropout off: PyTorch's own CPU comparison skips these ops for
# that reason ("output is non-deterministic (when dropout_p > 0)"), and
# multi_head_attention_forward's only sample has dropout.
def _without_dropout(sample, **off):
    from torch.testing._internal.opinfo.core import SampleInput

    return SampleInput(sample.input, args=sample.args, kwargs={**sample.kwargs, **off})


DETERMINISTIC = {
    "nn.functional.scaled_dot_product_attention": lambda s: _without_dropout(s, dropout_p=0.0),
    "nn.functional.multi_head_attention_forward": lambda s: _without_dropout(s, training=False),
}


def _tree_map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, e) for e in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def _to(device):
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


def _tensors(x):
    """The tensors of a nested structure, in order (torch.Size and other
    tuples of numbers are walked, not rebuilt)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _tensors(e)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _native_calls():
    import npubridge

    return sum(sum(s["native"].values()) for s in npubridge.stats().values())


def _float64(t):
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.detach().double().requires_grad_(t.requires_grad)
    return t


def _judgeable(t):
    return isinstance(t, torch.Tensor) and not t.is_complex() and t.layout == torch.strided


def _assert_matches(got, ref, wide, tol):
    """got (npu) against ref (CPU, same dtype), judged by the error model
    against wide (CPU, float64; None when there is none)."""
    got_l, ref_l = _tensors(got), _tensors(ref)
    wide_l = _tensors(wide) if wide is not None else []
    if len(got_l) != len(ref_l) or len(wide_l) not in (0, len(ref_l)):
        torch.testing.assert_close(_tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got), ref,
                                   equal_nan=True, check_device=False, **tol)
        return
    if not got_l:
        torch.testing.assert_close(got, ref, equal_nan=True, **tol)
        return
    for i, (g, r) in enumerate(zip(got_l, ref_l)):
        w = wide_l[i] if wide_l else None
        if _judgeable(g) and _judgeable(r) and w is not None and _judgeable(w):
            msg = _C().judge(g.detach().cpu(), r.detach(), w.detach())
            assert not msg, f"output {i}: {msg}"
        else:  # no float64 reference (or complex): the CPU's result at TOLERANCE
            torch.testing.assert_close(g.cpu(), r, equal_nan=True, check_device=False, **tol)


def _C():
    import npubridge

    return npubridge._C


def _weighted_grads(outs, inputs, weights, device=None):
    loss = sum((t * (w.to(device=t.device, dtype=t.dtype))).sum() for t, w in zip(outs, weights))
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _check_sample(op, sample, backward, tol):
    """Compares the sample's results (and gradients) on npu with the CPU's;
    True when it did, False when the CPU refused the sample and the npu
    refused it alike (the same class, the CPU's reason in the message)."""
    try:
        ref = op(sample.input, *sample.args, **sample.kwargs)
    except Exception as cpu_error:  # noqa: BLE001 - the npu must refuse the sample as the CPU does
        reason = (str(cpu_error).strip().splitlines() or [""])[0]
        npu_sample = sample.transform(_to("npu"))
        try:
            op(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
        except type(cpu_error) as npu_error:
            if reason in str(npu_error):
                return False
            raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), the npu "
                                 f"another error: {str(npu_error).strip()[:200]}") from None
        raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), "
                             "the npu did not") from None
    wide_sample, wide = None, None
    if op.supports_dtype(torch.float64, "cpu"):
        try:
            wide_sample = sample.transform(_float64)
            wide = op(wide_sample.input, *wide_sample.args, **wide_sample.kwargs)
        except Exception:  # noqa: BLE001 - no float64 reference: the CPU's result at TOLERANCE decides
            wide_sample, wide = None, None
    npu_sample = sample.transform(_to("npu"))
    out = op(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
    _assert_matches(out, ref, wide, tol)
    if not backward:
        return True
    ref_outs = [t for t in _tensors(ref) if t.requires_grad and t.is_floating_point()]
    npu_outs = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    if not ref_outs:
        return True
    ref_in = [t for t in _tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
    npu_in = [t for t in _tensors([npu_sample.input, npu_sample.args, npu_sample.kwargs]) if t.requires_grad]
    weights = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape) for t in ref_outs]
    ref_grads = _weighted_grads(ref_outs, ref_in, weights)
    npu_grads = _weighted_grads(npu_outs, npu_in, weights)
    wide_grads = None
    if wide is not None:
        wide_outs = [t for t in _tensors(wide) if t.requires_grad and t.is_floating_point()]
        wide_in = [t for t in _tensors([wide_sample.input, wide_sample.args, wide_sample.kwargs]) if t.requires_grad]
        if len(wide_outs) == len(ref_outs) and len(wide_in) == len(ref_in):
            try:
                wide_grads = _weighted_grads(wide_outs, wide_in, weights)
            except Exception:  # noqa: BLE001 - no float64 gradient: the CPU's at TOLERANCE decides
                wide_grads = None
    for i, (g_ref, g_npu) in enumerate(zip(ref_grads, npu_grads)):
        if g_ref is None or g_npu is None:
            assert (g_ref is None) == (g_npu is None), "gradient defined on one device only"
            continue
        g_wide = wide_grads[i] if wide_grads is not None else None
        _assert_matches(g_npu, g_ref, g_wide, tol)
    return True


def op_db():
    """PyTorch's OpInfo database, or an error that says what to install:
    torch.testing._internal imports test-only packages PyTorch's wheel does
    not depend on."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db as db
    except ModuleNotFoundError as err:
        raise RuntimeError(f"PyTorch's OpInfo samples (torch.testing._internal) need the package '{err.name}', "
                           "which PyTorch does not install: pip install expecttest hypothesis") from err
    return db


def _reason(e):
    return f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:300]


def run(max_samples=8, ops=None, time_limit=None, dtype=torch.float32):
    """Returns {op name: {"status": "pass" | "fail" | "skip", "reason": str,
    "samples": int, "failures": {sample id: reason}, "checked": [sample id],
    "native": bool}} for every op of op_db that supports `dtype`.

    Every sample is checked, a failing one does not stop the op: "samples"
    counts the samples compared (passed or failed; up to `max_samples`; a
    sample the CPU and the npu both refuse is not counted), "failures" gives
    each failing check's reason by sample id: "3" for sample 3 (its
    position in the OpInfo's sample_inputs, 0-based; forward and backward),
    "3nc" for its non-contiguous variant (run for every third compared
    sample), "samples" when PyTorch's sample generator itself raised;
    "checked" lists the ids of every check that ran.
    "native": some call of the op's run was served by a plugin kernel (not
    all by the CPU fallback). For a dtype other than float32, ops that ran
    entirely on the CPU fallback are skipped: the check is of the plugins'
    kernels for that dtype."""
    db = op_db()

    results = {}
    start = time.time()
    torch.manual_seed(0)  # sample inputs are random: make the run repeatable
    for op in db:
        name = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        if ops is not None and name not in ops:
            continue
        if not op.supports_dtype(dtype, "cpu"):
            continue
        if name in SKIPPED or name.startswith(SKIPPED_PREFIXES):
            results[name] = {"status": "skip", "reason": SKIPPED.get(name, "needs CUDA"), "samples": 0,
                             "failures": {}, "checked": []}
            continue
        if time_limit is not None and time.time() - start > time_limit:
            results[name] = {"status": "skip", "reason": "time limit", "samples": 0, "failures": {},
                             "checked": []}
            continue
        backward = op.supports_autograd and dtype.is_floating_point
        native_before = _native_calls()
        count, failures, checked = _check_op(op, name, dtype, backward, max_samples)
        status = "fail" if failures else "pass"
        reason = "; ".join(f"sample {k}: {v}" for k, v in failures.items())[:600]
        if failures:
            reason = f"{len(failures)} failing checks of {count} samples: " + reason
        if status == "pass" and count == 0:
            status, reason = "skip", "no sample"
        native = _native_calls() > native_before
        if dtype != torch.float32 and not native:
            status, reason = "skip", "served by the CPU fallback only (no native kernel for this dtype)"
            if failures:  # not the plugins' kernels, but not hidden either
                first = next(iter(failures))
                reason += (f"; {len(failures)} checks failed, not judged here: sample {first}: "
                           f"{failures[first]}")[:400]
        results[name] = {"status": status, "reason": reason, "samples": count, "failures": failures,
                         "checked": checked, "native": native}
    return results


def _check_op(op, name, dtype, backward, max_samples):
    """Checks every sample of `op` (up to max_samples compared); returns the
    number compared, {sample id: reason} of the failing checks and the ids
    of every check run (passed or failed)."""
    tol = TOLERANCE[dtype]
    failures, checked, count = {}, [], 0
    deterministic = DETERMINISTIC.get(name, lambda s: s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = iter(op.sample_inputs("cpu", dtype, requires_grad=backward))
        except Exception as e:  # noqa: BLE001 - PyTorch's generator failed: recorded, not the npu's fault
            return 0, {"samples": _reason(e)}, ["samples"]
        index = -1
        while count < max_samples:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - the generator failed mid-way: the samples so far stand
                failures["samples"] = _reason(e)
                checked.append("samples")
                break
            index += 1
            try:
                sample = deterministic(sample)
                if not _check_sample(op, sample, backward, tol):
                    continue  # refused on both sides: no result to compare
            except Exception as e:  # noqa: BLE001 - every failure is recorded with its reason
                failures[str(index)] = _reason(e)
            checked.append(str(index))
            if count % 3 == 0:
                try:
                    variant = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample with no non-contiguous form (sparse): not checked
                    variant = None
                if variant is not None:
                    checked.append(f"{index}nc")
                    try:
                        _check_sample(op, variant, False, tol)
                    except Exception as e:  # noqa: BLE001
                        failures[f"{index}nc"] = _reason(e)
            count += 1
    return count, failures, checked


def summary(results):
    tested = {k: v for k, v in results.items() if v["status"] != "skip"}
    passed = sum(1 for v in tested.values() if v["status"] == "pass")
    return passed, len(tested)


def write_report(results, path_md, path_json=None, results_bf16=None):
    """Markdown (and JSON) report: float32, and bfloat16 when given."""
    def table(f, res, title, tol):
        passed, tested = summary(res)
        f.write(f"## {title}\n\n{passed} of {tested} ops pass ({100.0 * passed / max(tested, 1):.1f}%); forward "
                f"and backward against the CPU, judged by the error model (float64 reference; see "
                f"docs/plugin-authoring.md).\n\n")
        f.write("| op | result | served | samples | reason |\n|---|---|---|---|---|\n")
        for name in sorted(res):
            r = res[name]
            served = "native" if r.get("native") else "fallback"
            f.write(f"| `{name}` | {r['status']} | {served} | {r['samples']} | {r['reason'].replace('|', ' ')} |\n")
        f.write("\n")

    with open(path_md, "w") as f:
        f.write("# PyTorch OpInfo on npu\n\nGenerated by `python3 -m npubridge conformance --opinfo`. \"served\": "
                "whether plugin kernels served the op's calls (native) or only the CPU fallback did.\n\n")
        table(f, results, "float32", TOLERANCE[torch.float32])
        if results_bf16 is not None:
            table(f, results_bf16, "bfloat16 (ops a plugin serves natively)", TOLERANCE[torch.bfloat16])
    if path_json:
        with open(path_json, "w") as f:
            json.dump({"float32": results, "bfloat16": results_bf16}, f, indent=1, sort_keys=True)
