"""`vllm serve` on the npu, as a user starts it: the OpenAI-compatible server
of the real vLLM, with npubridge's platform plugin picked up by itself, on
127.0.0.1 (a free port), asked by the `openai` client over HTTP.

/v1/completions and /v1/chat/completions, streamed and not: greedy answers
equal transformers' float64 greedy generate() of the same token ids (the
oracle test_vllm_llm.py holds LLM.generate to), and the streamed pieces
join to the unstreamed text. SIGINT then shuts the server down cleanly
(exit status 0, within the test's bound). (The engine process may outlive
vLLM's 5 s grace and be killed by the server: the interpreter's teardown
of a process that imported vLLM takes about 5 s on this machine, with or
without npubridge.)"""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from vllm_models import Reference, save_llama

import vllm  # noqa: E402,F401  (installed by the set-up: scripts/lib.sh)
import openai  # noqa: E402  (a requirement of vLLM)

MAX_TOKENS = 10
START_TIMEOUT_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", "127.0.0.1", "--port",
           str(port), "--dtype", "float32", "--kv-cache-memory-bytes", str(32 << 20), "--max-model-len", "1024",
           "--seed", "0", "--served-model-name", "tiny"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode} before it was ready:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"vllm serve not ready after {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
        time.sleep(1)
    yield proc, base, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def client(server):
    _, base, _ = server
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(model_dir):
    return Reference(model_dir)


@pytest.fixture(scope="module")
def tok(model_dir):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(model_dir)


PROMPT = " ".join(f"w{i}" for i in (7, 31, 2, 140, 99, 5, 61))


def test_completions_equal_the_reference_streamed_or_not(client, reference, tok):
    ids = tok(PROMPT)["input_ids"]
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                     logprobs=1)
    got = [tok.convert_tokens_to_ids(t) for t in full.choices[0].logprobs.tokens]
    reference.assert_greedy(got, ids, MAX_TOKENS, "completions")
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                                    temperature=0, stream=True)]
    assert len(pieces) > 1 and "".join(pieces) == full.choices[0].text
    assert full.usage.prompt_tokens == len(ids)


def test_chat_completions_equal_the_reference_streamed_or_not(client, reference, tok):
    messages = [{"role": "user", "content": PROMPT}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                          logprobs=True)
    got = [tok.convert_tokens_to_ids(t.token) for t in full.choices[0].logprobs.content]
    reference.assert_greedy(got, ids, MAX_TOKENS, "chat")
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                            stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == full.choices[0].message.content


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_sigint_shuts_the_server_down_cleanly(server):
    proc, _, log = server
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"vllm serve still running 60 s after SIGINT:\n{log.read_text()[-4000:]}")
    text = log.read_text()
    assert code == 0, f"vllm serve exited with {code} after SIGINT:\n{text[-4000:]}"
    assert "Application shutdown complete" in text, f"the HTTP server did not shut down:\n{text[-4000:]}"
