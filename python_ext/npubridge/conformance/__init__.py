"""Conformance of one plugin: ``python3 -m npubridge conformance --plugin lib.so``.

Every op the plugin's kernels serve is run on npu with the plugin alone
enabled, and each sample is credited to the plugin's kernel only when the
dispatcher's statistics show that kernel served it (a kernel that declined
hands the call to the CPU, which is "not covered: declined", never a pass).

- ATen ops: PyTorch's OpInfo samples (forward, backward where the OpInfo
  supports autograd, and a non-contiguous copy of every sample) for every
  dtype the kernel declares, against the CPU, judged by the error model
  (``_C.judge``), by the OpInfo runner of ``--opinfo`` (opinfo.py). An aten
  op is mapped to the OpInfo entries whose names match it (hardtanh.out and
  hardtanh_backward.grad_input to nn.functional.hardtanh); a run counts for
  every op of the plugin whose kernel it reached.
- ATen ops PyTorch's OpInfo database has no entry for, when the plugin's
  ``npubridge.testing`` file declares their samples and reference
  (mindspeed_like's aten::_fused_adamw_): as the plugin's own ops below.
- The plugin's own ops: the samples and ATen-written reference its
  ``npubridge.testing`` file declares, plus its meta function against the
  kernel's outputs (fake tensors) and its derivative formula against finite
  differences (float64) and the reference's autograd.

The verdict is per (op, dtype): passed, failed (the first failure, with the
sample and the bound it missed), crashed or hung (the process running the
op's samples died, or a sample did not finish within --timeout: the sample,
the signal; the run goes on in a new process, isolate.py) or not covered
(why). See docs/plugin-authoring.md, "Testing your plugin: conformance".

``python3 -m npubridge conformance --opinfo`` runs PyTorch's whole OpInfo
database on npu instead (opinfo.run), with the same runner of a sample.

The package, one concern per module:

- plugin.py: one plugin's run (the functions below), report.py its report;
- aten.py: the plugin's ATen ops, by PyTorch's OpInfo samples;
- custom.py: the plugin's own ops, by its npubridge.testing file;
- opinfo.py: the OpInfo runner of one sample, and the database run;
- judge.py: how a result is compared (the error model, the tolerance table);
- verdict.py: the verdict per (op, dtype) and which kernel served a call;
- isolate.py: crash and hang isolation in child processes;
- known_failures.py: the OpInfo known-failure lists of tests/python.
"""
from .plugin import ANY_DTYPES, find_plugin, load_tests, run, run_in_child, select, tests_beside
from .report import Report, print_report, write_json, write_markdown
from .verdict import Cell

__all__ = ["ANY_DTYPES", "Cell", "Report", "find_plugin", "load_tests", "print_report", "run", "run_in_child",
           "select", "tests_beside", "write_json", "write_markdown"]
