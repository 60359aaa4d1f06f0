"""PyTorch's own OpInfo database (torch.testing._internal, shipped in the
wheel) on npu against the CPU: the one runner of an OpInfo sample
(run_sample), for the whole database (run: ``python3 -m npubridge
conformance --opinfo`` and tests/python/test_opinfo.py) and for a plugin's
ATen ops (aten.py: ``--plugin``).

A sample runs on the CPU, on the CPU in float64, and, moved to npu, on npu;
outputs are judged by the error model (judge.py: within a few ulps of the
float64 result plus four times the CPU's own error against it; integer and
bool results exact), indices among ties as ATen leaves them open
(TIE_ORDER_FREE); where the op supports autograd the gradients of a fixed
projection of the outputs are compared too. A sample the CPU refuses must
be refused on npu alike. Ops whose results are random or uninitialised by
definition are not compared (SKIPPED, with the reason), as PyTorch's own
device tests skip them.

The database run (run): for every op of ``op_db`` that supports the dtype
(float32, or bfloat16 for ops a plugin serves natively), each sample (up to
``max_samples`` compared), every third also with non-contiguous inputs.
"""
import json
import time
import warnings

import torch

from .. import _C
from .judge import assert_matches, calibrated, tensors, to_device, to_float32, to_float64, tolerance, weighted_grads
from .verdict import first_line, phase

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


def opinfo_name(o):
    return o.name + ("." + o.variant_test_name if o.variant_test_name else "")


# Ops that return the indices of selected elements, which ATen does not fix
# among equal elements (a sort that is not stable, topk, max over a dim):
# an index there is right when it selects an element equal to the one ATen's
# index selects. By OpInfo entry, where the sample keeps its dimension
# (position in args, default).
TIE_ORDER_FREE = {
    "sort": (0, -1), "argsort": (0, -1), "topk": (1, -1), "kthvalue": (1, -1), "mode": (0, -1),
    "max.reduction_with_dim": (0, None), "min.reduction_with_dim": (0, None), "median": (0, None),
    "nanmedian": (0, None),
}


def _tie_dim(name, sample):
    """The dimension the op selects along, when its indices are free among
    ties for this sample; None otherwise (stable sorts, ops not listed)."""
    if name not in TIE_ORDER_FREE or sample.kwargs.get("stable", False):
        return None
    position, default = TIE_ORDER_FREE[name]
    dim = sample.kwargs.get("dim", sample.args[position] if len(sample.args) > position else default)
    if not isinstance(dim, int) or not isinstance(sample.input, torch.Tensor) or sample.input.dim() == 0:
        return None
    return dim % sample.input.dim()


def _assert_matches_up_to_ties(got, ref, wide, tol, x, dim):
    """As assert_matches, but an int64 output (indices along `dim`
    of x) passes when it selects elements equal to those ATen's selects."""
    got_l, ref_l = tensors(got), tensors(ref)
    wide_l = tensors(wide) if wide is not None else [None] * len(ref_l)
    if len(got_l) != len(ref_l) or len(wide_l) != len(ref_l):
        return assert_matches(got, ref, wide, tol)
    x = x.detach()
    for i, (g, r, w) in enumerate(zip(got_l, ref_l, wide_l)):
        if r.dtype != torch.int64 or g.dtype != torch.int64 or g.shape != r.shape:
            assert_matches(g, r, w, tol)
            continue

        def select(idx):
            idx = idx.detach().cpu()
            return torch.take_along_dim(x, idx.unsqueeze(dim) if idx.dim() < x.dim() else idx, dim)

        try:
            torch.testing.assert_close(select(g), select(r), rtol=0, atol=0, equal_nan=True)
        except (AssertionError, IndexError, RuntimeError) as e:
            raise AssertionError(f"output {i} (indices along dim {dim}): they select other elements than ATen's "
                                 f"({' '.join(str(e).split())[:300]})") from None


def run_sample(o, sample, backward, tol, probe=None):
    """The sample on the CPU and on npu, in phases: [(check, error, served,
    declined)]; check is "forward", "backward" or "error case"."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = o(sample.input, *sample.args, **sample.kwargs)
    except Exception as cpu_error:  # noqa: BLE001 - the npu must refuse it as the CPU does
        reason = (str(cpu_error).strip().splitlines() or [""])[0]
        npu_sample = sample.transform(to_device("npu"))

        def refuse():
            try:
                o(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
            except type(cpu_error) as npu_error:
                if reason in str(npu_error):
                    return
                raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), the npu "
                                     f"another error: {str(npu_error).strip()[:200]}") from None
            raise AssertionError(f"the CPU raised {type(cpu_error).__name__} ({reason[:200]}), the npu did not")

        _, error, served, declined = phase(probe, refuse)
        return [("error case", error, served, declined)]
    wide_sample, wide = None, None
    if o.supports_dtype(torch.float64, "cpu"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wide_sample = sample.transform(to_float64)
                wide = o(wide_sample.input, *wide_sample.args, **wide_sample.kwargs)
        except Exception:  # noqa: BLE001 - no float64 reference: the CPU's result at the tolerance decides
            wide_sample, wide = None, None
    narrow_sample, narrow = None, None
    if o.supports_dtype(torch.float32, "cpu") and any(
            t.dtype == torch.float64 for t in tensors([sample.input, sample.args, sample.kwargs])):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                narrow_sample = sample.transform(to_float32)
                narrow = o(narrow_sample.input, *narrow_sample.args, **narrow_sample.kwargs)
        except Exception:  # noqa: BLE001 - no float32 run: the float64 result alone is the host's
            narrow_sample, narrow = None, None
    npu_sample = sample.transform(to_device("npu"))
    box = {}

    def forward():
        box["out"] = o(npu_sample.input, *npu_sample.args, **npu_sample.kwargs)
        dim = _tie_dim(opinfo_name(o), sample)
        if dim is None:
            assert_matches(box["out"], calibrated(ref, narrow), wide, tol)
        else:
            _assert_matches_up_to_ties(box["out"], calibrated(ref, narrow), wide, tol, sample.input, dim)
            # Other tied elements selected: their gradients land elsewhere, and rightly so.
            box["other_ties"] = any(g.dtype == torch.int64 and not torch.equal(g.cpu(), r)
                                    for g, r in zip(tensors(box["out"]), tensors(ref)))

    phases = []
    _, error, served, declined = phase(probe, forward)
    phases.append(("forward", error, served, declined))
    if error is not None or not backward or box.get("other_ties"):
        return phases
    ref_outs = [t for t in tensors(ref) if t.requires_grad and t.is_floating_point()]
    npu_outs = [t for t in tensors(box["out"]) if t.requires_grad and t.is_floating_point()]
    ref_in = [t for t in tensors([sample.input, sample.args, sample.kwargs]) if t.requires_grad]
    npu_in = [t for t in tensors([npu_sample.input, npu_sample.args, npu_sample.kwargs]) if t.requires_grad]
    if not ref_outs or len(ref_outs) != len(npu_outs) or not ref_in:
        return phases

    def backward_check():
        weights = [torch.linspace(-1, 1, t.numel(), dtype=t.dtype).reshape(t.shape) for t in ref_outs]
        ref_grads = weighted_grads(ref_outs, ref_in, weights)
        npu_grads = weighted_grads(npu_outs, npu_in, weights)
        if narrow is not None:
            narrow_outs = [t for t in tensors(narrow) if t.requires_grad and t.is_floating_point()]
            narrow_in = [t for t in tensors([narrow_sample.input, narrow_sample.args, narrow_sample.kwargs])
                         if t.requires_grad]
            if len(narrow_outs) == len(ref_outs) and len(narrow_in) == len(ref_in):
                try:
                    narrow_grads = weighted_grads(narrow_outs, narrow_in, [w.float() for w in weights])
                    ref_grads = [calibrated(g, n) if g is not None and n is not None else g
                                 for g, n in zip(ref_grads, narrow_grads)]
                except Exception:  # noqa: BLE001 - no float32 gradient: the float64 one alone
                    pass
        wide_grads = None
        if wide is not None:
            wide_outs = [t for t in tensors(wide) if t.requires_grad and t.is_floating_point()]
            wide_in = [t for t in tensors([wide_sample.input, wide_sample.args, wide_sample.kwargs])
                       if t.requires_grad]
            if len(wide_outs) == len(ref_outs) and len(wide_in) == len(ref_in):
                try:
                    wide_grads = weighted_grads(wide_outs, wide_in, weights)
                except Exception:  # noqa: BLE001 - no float64 gradient: the tolerance decides
                    wide_grads = None
        for i, (g_ref, g_npu) in enumerate(zip(ref_grads, npu_grads)):
            if g_ref is None or g_npu is None:
                assert (g_ref is None) == (g_npu is None), f"gradient {i} defined on one device only"
                continue
            g_wide = wide_grads[i] if wide_grads is not None else None
            try:
                assert_matches(g_npu, g_ref, g_wide, tol)
            except AssertionError as e:
                raise AssertionError(f"gradient of input {i}: {e}") from None

    _, error, served, declined = phase(probe, backward_check)
    phases.append(("backward", error, served, declined))
    return phases


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
        name = opinfo_name(op)
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


def _native_calls():
    return sum(sum(s["native"].values()) for s in _C.stats().values())


def _error(phases):
    """The first failing check of a sample's phases (run_sample), or None."""
    return next((error for _, error, _, _ in phases if error is not None), None)


def _check_op(op, name, dtype, backward, max_samples):
    """Checks every sample of `op` (up to max_samples compared); returns the
    number compared, {sample id: reason} of the failing checks and the ids
    of every check run (passed or failed)."""
    tol = tolerance(dtype)
    failures, checked, count = {}, [], 0
    deterministic = DETERMINISTIC.get(name, lambda s: s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            samples = iter(op.sample_inputs("cpu", dtype, requires_grad=backward))
        except Exception as e:  # noqa: BLE001 - PyTorch's generator failed: recorded, not the npu's fault
            return 0, {"samples": first_line(e)}, ["samples"]
        index = -1
        while count < max_samples:
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as e:  # noqa: BLE001 - the generator failed mid-way: the samples so far stand
                failures["samples"] = first_line(e)
                checked.append("samples")
                break
            index += 1
            sample = deterministic(sample)
            phases = run_sample(op, sample, backward, tol)
            if [(check, error) for check, error, _, _ in phases] == [("error case", None)]:
                continue  # refused on both sides: no result to compare
            if _error(phases) is not None:
                failures[str(index)] = _error(phases)
            checked.append(str(index))
            if count % 3 == 0:
                try:
                    variant = sample.noncontiguous()
                except Exception:  # noqa: BLE001 - a sample with no non-contiguous form (sparse): not checked
                    variant = None
                if variant is not None:
                    checked.append(f"{index}nc")
                    error = _error(run_sample(op, variant, False, tol))
                    if error is not None:
                        failures[f"{index}nc"] = error
            count += 1
    return count, failures, checked


def summary(results):
    tested = {k: v for k, v in results.items() if v["status"] != "skip"}
    passed = sum(1 for v in tested.values() if v["status"] == "pass")
    return passed, len(tested)


def write_report(results, path_md, path_json=None, results_bf16=None):
    """Markdown (and JSON) report: float32, and bfloat16 when given."""
    def table(f, res, title):
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
        table(f, results, "float32")
        if results_bf16 is not None:
            table(f, results_bf16, "bfloat16 (ops a plugin serves natively)")
    if path_json:
        with open(path_json, "w") as f:
            json.dump({"float32": results, "bfloat16": results_bf16}, f, indent=1, sort_keys=True)
