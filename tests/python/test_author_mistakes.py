"""The mistakes a plugin author makes that used to pass silently (issue #14),
each now a clear error naming the op and the plugin, and the ABI 1.4 pieces
that make it so (tests/plugins/author_mistakes_plugin.cpp)."""
import os
import subprocess
import sys
import textwrap

import pytest

PLUGIN = os.environ.get("NPUB_TEST_MISTAKES_PLUGIN", "")
pytestmark = pytest.mark.skipif(not PLUGIN, reason="built by CMake (NPUB_TEST_MISTAKES_PLUGIN)")


def test_the_plugin_is_there():
    assert os.path.isfile(PLUGIN), f"NPUB_TEST_MISTAKES_PLUGIN={PLUGIN}: no such file"


def run(code, **env):
    """Runs `code` with only the mistakes plugin loaded; returns (stdout, stderr)."""
    e = dict(os.environ, NPUB_LOG_LEVEL="warn", NPUB_PLUGIN_PATH=PLUGIN, **env)
    # torch.npu.init(): the plugin ops exist under torch.ops from the runtime's start on.
    prelude = "import torch, npubridge\ntorch.npu.init()\n"
    r = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout, r.stderr


def error_of(call):
    """Code printing the exception `call` raises, as `<class>: <message>`."""
    return f"""
try:
    {call}
    print("NO ERROR")
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
"""


def test_a_second_argument_of_another_dtype_never_reaches_a_float32_kernel():
    # The guide's axpy built as shipped computed [1, 3, 1, 3] for a float64 y
    # (reading its bytes as float): the default rule is that every tensor
    # argument has the dispatch dtype, so no kernel serves the call.
    out, _ = run("x = torch.ones(4, device='npu')\n" +
                 error_of("torch.ops.mistakes.axpy(x, torch.full((4,), 2.0, dtype=torch.float64, device='npu'), 1.0)") +
                 error_of("torch.ops.mistakes.axpy(x, torch.full((4,), 2, dtype=torch.int64, device='npu'), 1.0)") +
                 "print(torch.ops.mistakes.axpy(x, torch.full((4,), 2.0, device='npu'), 1.0).tolist())")
    lines = out.strip().splitlines()
    assert lines[0] == ("RuntimeError: npubridge: op 'mistakes::axpy' cannot run on the npu: no kernel accepts the "
                        "arguments' dtypes (plugin 'mistakes' expects argument 'y' to be float32 (the dispatch "
                        "dtype) but found float64); and PyTorch has no CPU implementation of it to fall back to"), out
    assert "expects argument 'y' to be float32 (the dispatch dtype) but found int64" in lines[1], out
    assert lines[2] == "[3.0, 3.0, 3.0, 3.0]"


def test_declared_argument_rules_name_the_argument_and_what_it_may_be():
    out, _ = run("x = torch.ones(3, device='npu')\n" +
                 error_of("torch.ops.mistakes.axpy_listed(x, x.double(), 2.0)") +
                 error_of("torch.ops.mistakes.axpy_any(x, x.double(), 2.0)") +
                 "print(torch.ops.mistakes.axpy_listed(x, x, 2.0).tolist())")
    lines = out.strip().splitlines()
    assert "expects argument 'y' to be one of {float32} but found float64" in lines[0], out
    # any: the call reaches the body, which checks y itself.
    assert lines[1].startswith("RuntimeError: op 'mistakes::axpy_any' failed in the kernel of plugin 'mistakes': "
                               "mistakes::axpy_any: y: expected float32 but found float64"), out
    assert lines[2] == "[3.0, 3.0, 3.0]"


def test_a_tensor_return_left_unset_is_an_error_not_none():
    out, _ = run(error_of("torch.ops.mistakes.forgets_return(torch.ones(2, device='npu'))") +
                 "print(npubridge.stats()['mistakes::forgets_return']['errors'])")
    lines = out.strip().splitlines()
    assert lines[0] == ("RuntimeError: op 'mistakes::forgets_return': the kernel of plugin 'mistakes' returned "
                        "without setting return 0 (Tensor): a kernel must allocate each tensor return that arrives "
                        "empty (alloc_output, or Call::output in the SDK)"), out
    assert lines[1] == "1"


@pytest.mark.parametrize("validate", ["1", "0"])
def test_an_output_of_another_shape_than_the_meta_function_says_is_an_error(validate):
    # Checked on every call with NPUB_VALIDATE=1, and at the first call of
    # each signature without it.
    out, _ = run(error_of("torch.ops.mistakes.wrong_shape(torch.ones(2, 3, device='npu'))"), NPUB_VALIDATE=validate)
    assert out.strip() == ("RuntimeError: op 'mistakes::wrong_shape': the kernel of plugin 'mistakes' allocated "
                           "return 0 as float32 [1], but the op's meta function declares float32 [2, 3] for these "
                           "arguments (the next op would read a tensor of the wrong size)"), out


def test_one_body_as_kernel_and_meta_function_needs_no_guard():
    # It crashed the process (exit 139) on the first fake-tensor call: the
    # body went on to out.data() after output() in the meta call.
    out, _ = run("""
        from torch._subclasses.fake_tensor import FakeTensorMode
        x = torch.arange(6.0, device='npu').reshape(2, 3)
        print(torch.ops.mistakes.unguarded(x, 2.0).tolist())
        with FakeTensorMode() as mode:
            f = torch.ops.mistakes.unguarded(mode.from_tensor(x), 2.0)
            print(type(f).__name__, tuple(f.shape), f.dtype)
        torch.library.opcheck(torch.ops.mistakes.unguarded.default, (x, 2.0),
                              test_utils=("test_schema", "test_faketensor"))
        print("opcheck ok")
    """)
    assert out.strip().splitlines() == ["[[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]", "FakeTensor (2, 3) torch.float32",
                                        "opcheck ok"], out


def test_a_plugin_only_op_that_no_kernel_serves_gets_npubridges_message():
    # A decline, and a dtype the op has no kernel for: npubridge's message,
    # not PyTorch's "Could not run ... with arguments from the 'CPU' backend"
    # dispatch table, and no warning that it "will fall back".
    out, err = run(error_of("torch.ops.mistakes.declines(torch.ones(2, device='npu'))") +
                   error_of("torch.ops.mistakes.head(torch.ones(2, dtype=torch.float64, device='npu'))"))
    lines = out.strip().splitlines()
    assert lines[0] == ("RuntimeError: npubridge: op 'mistakes::declines' cannot run on the npu: op "
                        "'mistakes::declines' failed in the kernel of plugin 'mistakes': mistakes::declines: this "
                        "kernel declines every call; and PyTorch has no CPU implementation of it to fall back to"), out
    assert lines[1] == ("RuntimeError: npubridge: op 'mistakes::head' cannot run on the npu: no kernel accepts dtype "
                        "float64 (plugin 'mistakes': {float32}); and PyTorch has no CPU implementation of it to "
                        "fall back to"), out
    assert "Could not run" not in out + err
    assert "fall back to the host" not in err and "fell back" not in err, err


def test_a_misspelt_aten_overload_is_reported_when_pytorch_loads_the_plugin():
    _, err = run("")
    assert ("npubridge: plugin 'mistakes' registers a kernel for 'aten::hardtanh.outt', which ATen does not have, "
            "so no PyTorch call can reach it; did you mean 'aten::hardtanh.out'?") in err, err


def test_kernels_and_meta_functions_reach_host_table_user_data_and_op_name_through_the_context_head():
    out, _ = run("""
        from torch._subclasses.fake_tensor import FakeTensorMode
        x = torch.zeros(3, device='npu')
        print(torch.ops.mistakes.head(x).tolist())
        with FakeTensorMode() as mode:
            print(tuple(torch.ops.mistakes.head(mode.from_tensor(x)).shape))
    """)
    assert out.strip().splitlines() == ["[1.0, 1.0, 1.0]", "(3,)"], out
