import gc
import json
import os
import selectors
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import npubridge  # noqa: F401  (registers the npu backend)


def pytest_sessionfinish(session, exitstatus):
    """Python's last collection at exit would scan every object torch made
    (about 0.5 s of CPU per test process; 1.5 s with PyTorch's OpInfo
    database loaded): frozen, they are left to the end of the process."""
    gc.freeze()


@pytest.fixture
def npu():
    return torch.device("npu:0")


def assert_matches(got, fn, *inputs):
    """`got` (an npu result) against `fn` on the CPU tensors `inputs`, judged
    by npubridge's error model (docs/plugin-authoring.md, "How your kernels
    are judged"): fn in float64 is the reference, fn in the inputs' dtype
    calibrates the bound. Never a fixed tolerance against the CPU's own
    float32 output, which moves between CPUs."""
    host = fn(*inputs)
    wide = fn(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs])
    assert_judged(got, host, wide)


def assert_judged(got, host, wide, what=""):
    """`got` (an npu result) against `host` (the same computation on the CPU
    in got's dtype) and `wide` (on the CPU in float64), by npubridge's error
    model: within a few times the CPU's own error against float64."""
    msg = npubridge._C.judge(got.detach().cpu(), host.detach(), wide.detach())
    assert not msg, f"{what}: {msg}" if what else msg


def assert_no_fallbacks(what="", stats=None):
    """No op fell back to the CPU since the last npubridge.reset_stats()
    (or in `stats`, a npubridge.stats() taken earlier); the message lists
    the ops that did, with their counts."""
    fell = {op: s["fallbacks"] for op, s in (npubridge.stats() if stats is None else stats).items() if s["fallbacks"]}
    assert not fell, f"{what}: {fell}" if what else fell


def assert_gradients_judged(cpu, npu, wide, what=""):
    """Each parameter's gradient in `npu` (the model on npu) against the same
    parameter's in `cpu` and `wide` (the model on the CPU in npu's dtype and
    in float64), by the error model; a parameter has a gradient on both
    devices or on neither. Returns how many gradients were judged."""
    checked = 0
    for (pname, pc), (_, pn), (_, pw) in zip(cpu.named_parameters(), npu.named_parameters(), wide.named_parameters()):
        where = f"{what}.{pname}" if what else pname
        assert (pn.grad is None) == (pc.grad is None), f"{where}: gradient on one device only"
        if pc.grad is None:
            continue
        assert pn.grad.device.type == "npu", where
        assert_judged(pn.grad, pc.grad, pw.grad, f"{where} gradient")
        checked += 1
    return checked


def run_case(case, device):
    """A differential case's outcome on `device`: ("ok", the result on the
    CPU) or (the exception's class, the first line of its message)."""
    try:
        out = case(device)
        return "ok", out.cpu() if isinstance(out, torch.Tensor) else out
    except Exception as e:  # noqa: BLE001  (the class is compared)
        return type(e), str(e).splitlines()[0]


def assert_same_outcome(name, case, equal_nan=False):
    """A differential case gives on npu what it gives on the CPU: the same
    dtype, shape and values (exactly), or an exception of the same class
    whose message carries ATen's."""
    cpu, npu = run_case(case, "cpu"), run_case(case, "npu")
    if cpu[0] == "ok":
        assert npu[0] == "ok", f"{name}: the cpu computed, the npu raised {npu}"
        assert npu[1].dtype == cpu[1].dtype and npu[1].shape == cpu[1].shape, f"{name}: {npu[1]} vs {cpu[1]}"
        torch.testing.assert_close(npu[1], cpu[1], rtol=0, atol=0, equal_nan=equal_nan, msg=name)
    else:
        assert npu[0] is cpu[0], f"{name}: the cpu raised {cpu}, the npu gave {npu}"
        assert cpu[1] in npu[1], f"{name}: {npu[1]!r} does not carry ATen's {cpu[1]!r}"


def run_python(code, **env):
    """`code` run by a fresh Python with `env` added to the environment; the
    subprocess.CompletedProcess (text output). For what one process cannot
    show: settings read at the start, a crash or a hang, the exit."""
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=120)


# The zygote's own code (see Zygote): the prelude in this process, then one
# forked child per request, which leaves the loop and runs the request's code
# as `python -c` would: an exception's traceback and exit status 1, sys.exit's
# status, then the interpreter's exit; or, unless the request asks for the
# whole exit (finalize), that exit without its finalisation, which costs
# nearly a second in a child of a process that imported torch (it touches
# every object the fork shares): non-daemon threads joined, atexit handlers
# run, output flushed, then os._exit.
_ZYGOTE_SOURCE = r"""
import atexit as _atexit, json as _json, os as _os, select as _select, sys as _sys, tempfile as _tempfile
import threading as _threading, time as _time, traceback as _traceback


def _status(run):
    try:
        run()
        return 0
    except SystemExit as e:  # as the interpreter reads it
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=_sys.stderr)
        return 1
    except BaseException:
        _traceback.print_exc()
        return 1


def _zygote():
    requests, replies = _os.fdopen(_os.dup(0), "r"), _os.fdopen(_os.dup(1), "w")
    _os.dup2(_os.open(_os.devnull, _os.O_RDONLY), 0)

    def reply(code, out, err, timed_out=False):
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
        replies.write(_json.dumps([code, texts[0], texts[1], timed_out]) + "\n")
        replies.flush()

    def wait(pid, timeout):  # whether the child ended within timeout seconds (not reaped)
        try:
            pidfd = _os.pidfd_open(pid)
        except OSError:  # no pidfd_open (a seccomp filter): polls
            deadline = _time.monotonic() + timeout
            while not _os.waitid(_os.P_PID, pid, _os.WEXITED | _os.WNOHANG | _os.WNOWAIT):
                if _time.monotonic() > deadline:
                    return False
                _time.sleep(0.002)
            return True
        ended = bool(_select.select([pidfd], [], [], timeout)[0])
        _os.close(pidfd)
        return ended

    def redirect(out, err):
        _sys.stdout.flush()
        _sys.stderr.flush()
        _os.dup2(out.fileno(), 1)
        _os.dup2(err.fileno(), 2)

    saved = _os.dup(2)
    out, err = _tempfile.TemporaryFile(), _tempfile.TemporaryFile()
    redirect(out, err)
    code = _status(lambda: exec(compile(_sys.argv[1], "<prelude>", "exec"), globals()))
    _sys.stdout.flush()
    _sys.stderr.flush()
    _os.dup2(saved, 1)  # whatever the zygote itself may still say: on its stderr, never among the replies
    _os.dup2(saved, 2)
    reply(code, out, err)
    if code:
        _sys.exit(code)
    for line in requests:
        req = _json.loads(line)
        if req["last"]:  # in this process, which then exits
            requests.close()
            replies.close()
            redirect(open(req["last"][0], "wb"), open(req["last"][1], "wb"))
            return req
        out, err = _tempfile.TemporaryFile(), _tempfile.TemporaryFile()
        pid = _os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            redirect(out, err)
            return req
        timed_out = not wait(pid, req["timeout"])
        if timed_out:
            _os.kill(pid, 9)
        reply(_os.waitstatus_to_exitcode(_os.waitpid(pid, 0)[1]), out, err, timed_out)
    _os._exit(0)  # closed: the zygote never started anything, its finalisation would cost a second


_req = _zygote()
for _name, _value in _req["env"].items():
    if _value is None:
        _os.environ.pop(_name, None)
    else:
        _os.environ[_name] = _value
_sys.argv = ["-c"]
_code = compile(_req["code"], "<string>", "exec")
if _req["finalize"]:
    del _zygote, _req, _status
    exec(_code)
else:
    _exit_status = _status(lambda: exec(_code, globals()))
    _threading._shutdown()
    _atexit._run_exitfuncs()
    _sys.stdout.flush()
    _sys.stderr.flush()
    _os._exit(_exit_status)
"""


class Zygote:
    """A fresh Python (with `env` added to the environment and `flags` on
    its command line) that ran `prelude`, by default the imports, which must
    not start the npu runtime (a child forked after the start cannot use the
    npu); run() forks it and runs code in the child. A fresh interpreter
    costs seconds (npubridge autoloads into `import torch`), a fork
    milliseconds, and the child is a process of its own, as fresh after the
    imports as a new one: the runtime starts at its first npu use (Note [The
    runtime starts at the first npu use], python_ext/csrc/init.cpp), from
    the NPUB_* settings as they are then, so run()'s `env`, set in the child
    before its code, is read as if set at the start; it crashes, hangs and
    exits alone. For what happens during the imports, a new interpreter
    (run_python) or the prelude's outcome (`self.prelude`, a
    CompletedProcess: its exit code, stdout and stderr)."""

    def __init__(self, prelude="import torch, npubridge", flags=(), **env):
        self._proc = subprocess.Popen([sys.executable, *flags, "-c", _ZYGOTE_SOURCE, textwrap.dedent(prelude)],
                                      env=dict(os.environ, **env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        self.prelude = self._reply("the prelude", 300)

    def _reply(self, what, timeout):
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout + 60)  # the zygote itself stuck: not to wait forever
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the zygote gave no outcome of {what} (exit code {self._proc.poll()})")
        code, out, err, timed_out = json.loads(line)
        if timed_out:
            raise subprocess.TimeoutExpired(what, timeout, out, err)
        return subprocess.CompletedProcess(what, code, out, err)

    def run(self, code, timeout=120, finalize=False, **env):
        """`code` in a child forked from the zygote, with `env` (a value
        None unsets the variable) set before it: the CompletedProcess (its
        exit code, stdout and stderr), or subprocess.TimeoutExpired (the
        child killed) after `timeout` seconds. The child exits as the
        interpreter does but for its finalisation, unless `finalize`."""
        assert self.prelude.returncode == 0, f"the zygote's prelude failed:\n{self.prelude.stderr}"
        request = {"code": textwrap.dedent(code), "env": env, "last": None, "timeout": timeout, "finalize": finalize}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return self._reply(code, timeout)

    def run_last(self, code, timeout=120, **env):
        """`code` in the zygote itself, a fresh interpreter after the
        prelude, which then exits (its exit code in the CompletedProcess):
        for what happens at exit, in one more process than run() gives."""
        assert self.prelude.returncode == 0, f"the zygote's prelude failed:\n{self.prelude.stderr}"
        with tempfile.TemporaryDirectory() as folder:
            paths = [os.path.join(folder, name) for name in ("stdout", "stderr")]
            request = {"code": textwrap.dedent(code), "env": env, "last": paths, "timeout": timeout, "finalize": True}
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                raise
            out, err = (open(p, errors="replace").read() for p in paths)
        return subprocess.CompletedProcess(code, self._proc.returncode, out, err)

    def close(self):
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def plugins_loaded_with(**env):
    """(names of the loaded plugins, npubridge.load_failures() as text) of a
    fresh Python that imports npubridge with `env` added to the environment."""
    code = "import torch, npubridge; print([p['name'] for p in npubridge.plugins()]); print(npubridge.load_failures())"
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                       env=dict(os.environ, NPUB_LOG_LEVEL="error", **env), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    names, failures = r.stdout.strip().splitlines()
    return names, failures


# npubridge's torch_npu compatibility package (compat/torch_npu): ctest puts
# it on PYTHONPATH for the tests that use it; run by hand, they take it from
# the source tree. It must come before transformers/accelerate are imported,
# which decide at import whether an NPU is there.
TORCH_NPU_COMPAT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "compat", "torch_npu")


def import_torch_npu_compat():
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        sys.path.insert(0, os.path.normpath(TORCH_NPU_COMPAT_DIR))
    import torch_npu

    assert getattr(torch_npu, "__npubridge_compat__", False), f"not npubridge's torch_npu: {torch_npu.__file__}"
    return torch_npu
