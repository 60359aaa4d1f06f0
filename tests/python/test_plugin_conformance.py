"""`python3 -m npubridge conformance --plugin LIB.so` on the test plugins of
tests/plugins/conformance_plugin.cpp: a correct plugin passes, each defect
fails (or is "not covered") with a message naming the op, the dtype and the
reason, and the exit status says so."""
import json
import os
import shutil
import subprocess
import sys

import pytest

PLUGIN_DIR = os.environ.get("NPUB_TEST_CONFORMANCE_PLUGIN_DIR", "")
TESTS_FILE = os.path.join(os.path.dirname(__file__), "conformance_files", "mul_add_conformance.py")

pytestmark = pytest.mark.skipif(not PLUGIN_DIR, reason="NPUB_TEST_CONFORMANCE_PLUGIN_DIR is not set (CTest sets it)")


def plugin(mode):
    return os.path.join(PLUGIN_DIR, f"libnpub_test_conf_{mode}.so")


def conformance(tmp_path, *args, env=None):
    """Runs the command; returns (exit status, output, the JSON report)."""
    out_json = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "npubridge", "conformance", *args, "--json", str(out_json),
                        "--report", str(tmp_path / "report.md"), "--max-samples", "4"],
                       capture_output=True, text=True, timeout=600, env=env)
    output = r.stdout + r.stderr
    report = json.loads(out_json.read_text()) if out_json.exists() else None
    return r.returncode, output, report


def cells(report):
    return {(c["op"], c["dtype"]): c for c in report["results"]}


def mul_add_tests(tmp_path, name, samples):
    """A tests file `name` for conf_good::mul_add: its reference, and
    `samples` as the body of its samples function (`dtype` in scope)."""
    tests = tmp_path / name
    tests.write_text(
        "import torch\nfrom npubridge import testing\n"
        "testing.reference('conf_good::mul_add')(lambda x, y: x * y + x)\n"
        "@testing.samples('conf_good::mul_add')\n"
        "def s(dtype):\n" + samples)
    return str(tests)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """One run of the correct plugin with its tests file, which two tests
    read: (exit status, output, the JSON report, the Markdown report)."""
    tmp_path = tmp_path_factory.mktemp("good")
    status, out, report = conformance(tmp_path, "--plugin", plugin("good"), "--tests", TESTS_FILE)
    return status, out, report, (tmp_path / "report.md").read_text()


def test_a_correct_plugin_passes(good_run):
    status, out, report, markdown = good_run
    assert status == 0, out
    got = cells(report)
    for op in ("aten::hardtanh.out", "conf_good::mul_add", "conf_good::mul_add_backward"):
        for dtype in ("float32", "float64"):
            cell = got[(op, dtype)]
            assert cell["status"] == "passed", (op, dtype, cell)
            assert cell["plugin"] == "conf_good" and cell["kernel"] == "p0 {float32, float64}"
            assert cell["passed"] == cell["samples"] > 0
    assert "OpInfo nn.functional.hardtanh" in got[("aten::hardtanh.out", "float32")]["sources"]
    assert got[("aten::hardtanh.out", "float32")]["checks"] == ["forward"]  # hardtanh_backward is the CPU's
    assert {"forward", "meta", "backward", "error case"} <= set(got[("conf_good::mul_add", "float32")]["checks"])
    assert "gradcheck" in got[("conf_good::mul_add", "float64")]["checks"]
    assert report["summary"] == {"passed": 6, "failed": 0, "crashed": 0, "hung": 0, "not covered": 0}
    assert "PASS conf_good aten::hardtanh.out float64 [kernel p0 {float32, float64}]" in out
    assert markdown.count("| passed |") == 6


def test_the_tests_file_beside_the_library_is_found(tmp_path):
    shutil.copy(plugin("good"), tmp_path / "libnpub_test_conf_good.so")
    shutil.copy(TESTS_FILE, tmp_path / "npub_test_conf_good_conformance.py")
    status, out, report = conformance(tmp_path, "--plugin", str(tmp_path / "libnpub_test_conf_good.so"),
                                      "--op", "conf_good::mul_add")
    assert status == 0, out
    assert [(c["op"], c["dtype"], c["status"]) for c in report["results"]] == [
        ("conf_good::mul_add", "float32", "passed"), ("conf_good::mul_add", "float64", "passed")]


def test_the_in_tree_plugins_ship_their_tests_files(tmp_path):
    # Beside the built-in plugins (build tree and wheel): conformance of
    # mindspeed_like needs no --tests.
    import npubridge

    path = next(p["path"] for p in npubridge.plugins() if p["name"] == "mindspeed_like")
    for name in ("cann_like", "mindspeed_like", "vllm_like"):
        assert os.path.exists(os.path.join(os.path.dirname(path), f"npub_{name}_conformance.py")), name
    status, out, report = conformance(tmp_path, "--plugin", path, "--op", "mindspeed_like::npu_swiglu")
    assert status == 0, out
    assert {c["status"] for c in report["results"]} == {"passed"} and len(report["results"]) == 4


def test_a_numerically_wrong_aten_kernel_fails(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("wrong"))
    assert status == 1, out
    for dtype in ("float32", "float64"):
        assert f"FAIL conf_wrong aten::hardtanh.out {dtype} [kernel p0 {{float32, float64}}]: OpInfo " \
               "nn.functional.hardtanh sample" in out, out
        cell = cells(report)[("aten::hardtanh.out", dtype)]
        assert cell["status"] == "failed" and cell["error"] > cell["bound"] > 0, cell


def test_float64_read_as_float_fails_on_float64_only(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("f64"))
    assert status == 1, out
    got = cells(report)
    assert got[("aten::hardtanh.out", "float32")]["status"] == "passed", got
    assert got[("aten::hardtanh.out", "float64")]["status"] == "failed", got
    assert "FAIL conf_f64 aten::hardtanh.out float64" in out


def test_an_overload_typo_is_unknown_to_aten_and_nothing_is_covered(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("typo"))
    assert status == 1, out
    assert ("NOT COVERED conf_typo aten::hardtanh.outt float32: unknown to ATen: aten::hardtanh has no overload "
            "'outt' (it has '' (the default), 'out')") in out, out
    assert "; nothing was covered" in out
    assert report["summary"] == {"passed": 0, "failed": 0, "crashed": 0, "hung": 0, "not covered": 2}


def test_a_meta_function_that_disagrees_with_the_kernel_fails(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("meta"), "--tests", TESTS_FILE,
                                      "--op", "conf_meta::mul_add")
    assert status == 1, out
    cell = cells(report)[("conf_meta::mul_add", "float32")]
    assert cell["status"] == "failed", cell
    # Found by the call itself (the dispatcher holds the outputs a kernel
    # allocates to its meta function), or else by the tool's fake-tensor check.
    assert "meta" in cell["reason"], cell
    if "(meta)" in cell["reason"]:
        assert "the meta function declares shape [4] float32, the kernel returned shape [4, 5] float32" in \
            cell["reason"]


def test_a_wrong_derivative_fails_the_gradient_check(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("grad"), "--tests", TESTS_FILE,
                                      "--op", "conf_grad::mul_add")
    assert status == 1, out
    got = cells(report)
    f32, f64 = got[("conf_grad::mul_add", "float32")], got[("conf_grad::mul_add", "float64")]
    assert f32["status"] == f64["status"] == "failed", got
    assert "(derivative): gradient of y (the formula against the reference's autograd)" in f32["reason"], f32
    assert "(derivative)" in f64["reason"] and "gradient of y" in f64["reason"], f64


def test_a_custom_op_without_samples_is_not_covered(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("nosamples"))
    assert status == 1, out
    assert "NOT COVERED conf_nosamples conf_nosamples::mul_add float32: no samples: declare " \
           "@testing.samples(\"conf_nosamples::mul_add\")" in out, out
    assert "nothing was covered" in out


def test_a_declined_sample_is_not_covered_with_the_reason(tmp_path):
    status, out, report = conformance(tmp_path, "--plugin", plugin("declines"))
    assert status == 0, out  # float32 passed, nothing failed
    got = cells(report)
    assert got[("aten::hardtanh.out", "float32")]["status"] == "passed"
    f64 = got[("aten::hardtanh.out", "float64")]
    assert f64["status"] == "not covered" and f64["samples"] == 0 and f64["declined"] == 8, f64
    assert ("NOT COVERED conf_declines aten::hardtanh.out float64: declined (op 'aten::hardtanh.out' failed in the "
            "kernel of plugin 'conf_declines': aten::hardtanh.out: float64 is not implemented yet)") in out, out


def test_an_error_a_call_raises_is_a_failure_with_its_message(tmp_path):
    # The kernel refuses what ATen broadcasts: a RuntimeError from the call,
    # reported with its message.
    tests = mul_add_tests(tmp_path, "broadcast_conformance.py",
                          "    yield testing.Sample(torch.randn(4, 5, dtype=dtype), torch.randn(5, dtype=dtype))\n")
    status, out, report = conformance(tmp_path, "--plugin", plugin("good"), "--tests", tests,
                                      "--op", "conf_good::mul_add")
    assert status == 1, out
    cell = cells(report)[("conf_good::mul_add", "float32")]
    assert cell["status"] == "failed"
    assert "sample 0 (forward): RuntimeError:" in cell["reason"], cell
    assert "y: expected the shape of x [4, 5] but found [5]" in cell["reason"], cell


def test_an_unknown_op_name_and_a_missing_file_are_errors(tmp_path):
    status, out, _ = conformance(tmp_path, "--plugin", plugin("good"), "--op", "aten::hardtanh.outt")
    assert status == 1
    assert "ERROR --op aten::hardtanh.outt: the plugin serves no op of that name" in out, out
    status, out, _ = conformance(tmp_path, "--plugin", str(tmp_path / "missing.so"))
    assert status == 1 and "--plugin " in out and "no such file" in out, out


def test_a_declared_dtype_without_samples_is_not_covered(tmp_path):
    tests = mul_add_tests(tmp_path, "float32_only_conformance.py",
                          "    if dtype == torch.float32:\n"
                          "        yield testing.Sample(torch.randn(4, 5), torch.randn(4, 5))\n")
    status, out, report = conformance(tmp_path, "--plugin", plugin("good"), "--tests", tests,
                                      "--op", "conf_good::mul_add")
    assert status == 0, out
    assert cells(report)[("conf_good::mul_add", "float32")]["status"] == "passed"
    assert ("NOT COVERED conf_good conf_good::mul_add float64: no sample for float64, which the kernel declares "
            "(the samples function yielded none)") in out, out


def test_a_rejected_plugin_is_an_error(tmp_path):
    rejected = os.path.join(os.environ["NPUB_TEST_PLUGIN_DIR"], "libnpub_test_bad_init_error.so")
    status, out, report = conformance(tmp_path, "--plugin", rejected)
    assert status == 1, out
    assert "ERROR the plugin was not loaded: " in out and "simulated failure: device firmware not found" in out, out
    # The reason is the report's, not only the loader's log line on stderr.
    assert report["results"] == [] and any("simulated failure: device firmware not found" in e
                                           for e in report["errors"]), report["errors"]


def test_a_kernel_that_crashes_or_hangs_is_reported_against_its_op_and_the_run_goes_on(tmp_path):
    # conf_crash: aten::hardtanh.out raises SIGSEGV, conf_crash::mul_add_backward
    # never returns, conf_crash::mul_add is correct. Each sample runs in a
    # child process; a death or a sample over --timeout is the op's verdict.
    # Under ASan the segfault is the test plugin's, not a finding.
    env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":handle_segv=0")
    status, out, report = conformance(tmp_path, "--plugin", plugin("crash"), "--tests", TESTS_FILE,
                                      "--timeout", "10", env=env)
    assert status == 1, out
    got = cells(report)
    for dtype in ("float32", "float64"):
        crashed = got[("aten::hardtanh.out", dtype)]
        assert crashed["status"] == "crashed", crashed
        assert crashed["reason"].startswith("crashed: the process died with signal 11 (SIGSEGV) in OpInfo "
                                            f"nn.functional.hardtanh sample 0 ({dtype})"), crashed
        assert f"CRASHED conf_crash aten::hardtanh.out {dtype} [kernel p0 {{float32, float64}}]: crashed: " in out
        hung = got[("conf_crash::mul_add_backward", dtype)]
        assert hung["status"] == "hung", hung
        assert hung["reason"].startswith(f"hung: no result within 10 s in tests {TESTS_FILE} sample 0 '[4, 5]' "
                                         f"({dtype}); killed, the run went on in a new process"), hung
        assert f"HUNG conf_crash conf_crash::mul_add_backward {dtype}" in out
        fine = got[("conf_crash::mul_add", dtype)]
        assert fine["status"] == "passed" and fine["passed"] == fine["samples"] > 0, fine
    assert report["summary"] == {"passed": 2, "failed": 0, "crashed": 2, "hung": 2, "not covered": 0}
    assert "2 passed, 0 failed, 2 crashed, 2 hung, 0 not covered" in out
    assert "| `aten::hardtanh.out` | float32 | crashed |" in (tmp_path / "report.md").read_text()


def test_in_process_a_correct_plugin_gives_the_same_report(tmp_path, good_run):
    # The same command without --in-process is good_run.
    status, out, report = conformance(tmp_path, "--plugin", plugin("good"), "--tests", TESTS_FILE, "--in-process")
    assert status == 0, out
    assert report["results"] == good_run[2]["results"]


def test_the_command_takes_a_plugin_or_the_opinfo_database():
    # --opinfo (the whole OpInfo database on every loaded plugin) is the other form.
    for args, message in (([], "one of the arguments --plugin --opinfo is required"),
                          (["--plugin", "x.so", "--opinfo"], "argument --opinfo: not allowed with argument --plugin")):
        r = subprocess.run([sys.executable, "-m", "npubridge", "conformance", *args], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 2 and message in r.stderr, r.stderr
