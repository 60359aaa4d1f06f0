"""A captured one-token decode step of the tiny transformers Llama
(tests/python/tiny_models.py, eval, no grad) with transformers' StaticCache,
replayed for 10 steps with its inputs updated in place: the logits equal eager
npu's bit for bit at every step (the replay runs the same plugin kernels in the
same order on the same values), and greedy decoding picks the same tokens.

transformers 5 writes the cache at its own device-side counter
(StaticLayer.cumulative_length, advanced in place by every step, so by every
replay too); the inputs the test updates are the token and the position ids
(RoPE).

Each replay runs every recorded kernel once (npubridge.stats() counts the
kernel calls a replay makes). How much faster a replay is than the eager step
is bench/bench_graph.py's figure (bench/results/graph.json, "decode_step"):
a timing is no test."""
import collections

import pytest
import torch

import npubridge
from tiny_models import llama_config

import transformers
from transformers import StaticCache  # noqa: E402

PROMPT = 12
STEPS = 10
MAX_LEN = 32


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    # SDPA attention: transformers 5.19's eager-attention mask makes a
    # scalar tensor on the device inside the forward (a host-to-device copy,
    # which a capture refuses: it would not be replayed).
    cfg = llama_config(attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).to("npu").eval()
    ids = torch.randint(0, 128, (1, PROMPT)).npu()
    return cfg, model, ids


def prefill(cfg, model, ids, max_len=MAX_LEN):
    cache = StaticCache(config=cfg, max_cache_len=max_len)
    logits = model(ids, past_key_values=cache, cache_position=torch.arange(PROMPT).npu(), use_cache=True).logits
    return cache, logits[:, -1:].argmax(-1)


def step(model, cache, tok, pos):
    return model(tok, past_key_values=cache, cache_position=pos, position_ids=pos[None], use_cache=True).logits


@pytest.fixture(scope="module")
def captured(setup):
    cfg, model, ids = setup
    with torch.no_grad():
        cache, tok = prefill(cfg, model, ids)
        static_tok = tok.clone()
        static_pos = torch.tensor([PROMPT]).npu()
        g = torch.npu.NPUGraph()
        npubridge.reset_stats()
        with torch.npu.graph(g):
            static_logits = step(model, cache, static_tok, static_pos)
    return g, cache, static_tok, static_pos, static_logits


def test_the_decode_path_runs_on_plugin_kernels_only(captured):
    g, *_ = captured
    nodes = g.nodes()
    # A host fallback inside the capture would have raised; the update of the
    # StaticCache (index_copy_) is a cann_like kernel.
    assert "kernel cann_like: aten::index_copy.out" in nodes
    assert all(n.startswith("kernel ") or n.startswith("copy ") for n in nodes)
    stats = npubridge.stats()
    assert sum(s["fallbacks"] for s in stats.values()) == 0


def kernel_calls():
    """(plugin, op) -> the calls of the plugin's kernels of the op so far."""
    return collections.Counter({(plugin, op): n for op, s in npubridge.stats().items()
                                for plugin, n in s["native"].items()})


def recorded_kernels(g):
    """(plugin, op) -> how many of the graph's records launch that plugin's kernel of the op."""
    return collections.Counter(tuple(n.removeprefix("kernel ").split(": ", 1)) for n in g.nodes()
                               if n.startswith("kernel "))


def test_replay_matches_eager_for_ten_steps(setup, captured):
    cfg, model, ids = setup
    g, cache, static_tok, static_pos, static_logits = captured
    with torch.no_grad():
        eager_cache, eager_tok = prefill(cfg, model, ids)
        tok = eager_tok.clone()
        replayed_tokens, eager_tokens = [], []
        for i in range(STEPS):
            pos = torch.tensor([PROMPT + i]).npu()
            eager_logits = step(model, eager_cache, eager_tok, pos)
            # The static inputs updated in place, then the replay.
            static_tok.copy_(tok)
            static_pos.copy_(pos)
            before = kernel_calls()
            g.replay()
            # The replay happened: each recorded kernel ran once more.
            assert kernel_calls() - before == recorded_kernels(g), f"step {i}"
            # Bit-equal: the replay runs the eager step's plugin kernels, in
            # its order, on the same values (the prefill is the same too).
            assert torch.equal(static_logits.cpu(), eager_logits.cpu()), f"step {i}"
            tok = static_logits[:, -1:].argmax(-1)
            eager_tok = eager_logits[:, -1:].argmax(-1)
            replayed_tokens.append(int(tok.cpu()))
            eager_tokens.append(int(eager_tok.cpu()))
    assert replayed_tokens == eager_tokens

