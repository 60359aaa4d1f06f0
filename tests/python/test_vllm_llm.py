"""The real vLLM's offline API on the npu, through npubridge's platform
plugin (python_ext/npubridge/vllm/): `vllm.LLM(model=dir)` with nothing
npu-specific in the call, as a vLLM user writes it.

A tiny random-weight Llama saved to a temporary folder (vllm_models.py):
- greedy output equals transformers' float64 greedy generate() for prompts
  of 1 to 600 tokens, across KV blocks (16 tokens) and prefill chunks
  (max_num_batched_tokens 128, so a long prompt is prefilled in chunks
  beside other sequences' decodes);
- prefix caching: the same prompts again, now served from cached blocks,
  give the same tokens; and the engine without prefix caching too, with a
  KV cache small enough that vLLM preempts requests;
- text prompts through the tokenizer, and n > 1 seeded sampling that
  repeats itself;
- the step runs on the npu's kernels: no op falls back to the CPU
  (npubridge's counters of the engine's worker, `collective_rpc("npu_stats")`).
"""
import pytest

from vllm_models import Reference, random_prompts, save_llama

import vllm  # noqa: E402  (installed by the set-up: scripts/lib.sh)

LENGTHS = [1, 2, 15, 16, 17, 33, 100, 250, 600]
MAX_TOKENS = 12
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=32 << 20, max_model_len=1024, max_num_batched_tokens=128,
              max_num_seqs=8, seed=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def reference(model_dir):
    return Reference(model_dir)


@pytest.fixture(scope="module")
def llm(model_dir):
    engine = vllm.LLM(model=model_dir, **ENGINE)
    yield engine
    engine.llm_engine.engine_core.shutdown()


def fallbacks(llm):
    return [{op: s["fallbacks"] for op, s in st.items() if s["fallbacks"]} for st in llm.collective_rpc("npu_stats")]


def greedy(max_tokens=MAX_TOKENS):
    return vllm.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=False)


def test_the_platform_is_the_npu(llm):
    from vllm.platforms import current_platform
    assert type(current_platform).__name__ == "NpuPlatform"
    assert current_platform.device_type == "npu" and current_platform.dispatch_key == "PrivateUse1"
    assert llm.llm_engine.vllm_config.device_config.device_type == "npu"


def test_greedy_equals_transformers_and_runs_on_the_npu(llm, reference):
    prompts = random_prompts(LENGTHS)
    llm.collective_rpc("npu_reset_stats")
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    assert fallbacks(llm) == [{}]
    compared = [reference.assert_greedy(o.outputs[0].token_ids, p, MAX_TOKENS) for o, p in zip(outs, prompts)]
    assert sum(compared) >= len(prompts) * MAX_TOKENS // 2, f"too few tokens compared (near-ties): {compared}"
    stats = llm.collective_rpc("npu_stats")[0]
    for op in ("vllm_like::flash_attn_varlen", "vllm_like::reshape_and_cache_flash", "vllm_like::rms_norm",
               "vllm_like::fused_add_rms_norm", "vllm_like::rotary_embedding", "vllm_like::silu_and_mul"):
        assert stats.get(op, {}).get("calls", 0) > 0, f"{op} did not run: {sorted(stats)}"


def test_prefix_cache_hits_give_the_same_tokens(llm, reference):
    base = random_prompts([200], seed=7)[0]
    prompts = [base + random_prompts([n], seed=8 + n)[0][1:] for n in (5, 40)]
    first = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    again = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy())
    for a, b, p in zip(first, again, prompts):
        assert b.num_cached_tokens >= 192, f"expected the shared 200-token prefix cached, found {b.num_cached_tokens}"
        # Two float32 computations (a whole prefill, a cached prefix and
        # the rest): equal up to the reference's first near-tie.
        n = reference.assert_greedy(a.outputs[0].token_ids, p, MAX_TOKENS)
        assert reference.assert_greedy(b.outputs[0].token_ids, p, MAX_TOKENS) == n
        assert a.outputs[0].token_ids[:n] == b.outputs[0].token_ids[:n]


def test_text_prompts_through_the_tokenizer(llm):
    text = " ".join(f"w{i}" for i in (5, 17, 3, 99, 42))
    ids = llm.get_tokenizer()(text)["input_ids"]
    by_text = llm.generate([text], greedy())[0]
    by_ids = llm.generate([{"prompt_token_ids": ids}], greedy())[0]
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids
    # (vLLM's incremental detokenizer puts the space between prompt and output first)
    assert by_text.outputs[0].text.strip() == llm.get_tokenizer().decode(by_text.outputs[0].token_ids,
                                                                         skip_special_tokens=True)


def test_seeded_sampling_repeats_itself(llm):
    prompt = {"prompt_token_ids": random_prompts([20], seed=3)[0]}

    def sample(seed):
        # Each run computes the prompt afresh (no cached prefix): the same
        # float32 computation, so the same seed must give the same tokens.
        assert llm.reset_prefix_cache()
        params = vllm.SamplingParams(n=4, temperature=1.0, top_p=0.9, seed=seed, max_tokens=10)
        return [c.token_ids for c in llm.generate([prompt], params)[0].outputs]

    llm.collective_rpc("npu_reset_stats")
    a, b, c = sample(11), sample(11), sample(12)
    assert fallbacks(llm) == [{}]  # the sampler's exponential_, sort and cumsum_ ran on the npu too
    assert a == b
    assert len({tuple(t) for t in a}) > 1, f"n=4 samples at temperature 1 all equal: {a}"
    assert a != c


def preemptions(engine):
    return sum(m.value for m in engine.get_metrics() if m.name == "vllm:num_preemptions")


def test_without_prefix_caching_and_under_preemption_the_tokens_are_the_same(model_dir, reference):
    """A KV cache of 1100 tokens (68 blocks) for 8 requests that grow to 1600:
    all are admitted, and as their decodes outgrow the cache vLLM preempts
    some (frees their blocks, recomputes them later); no prefix caching."""
    token_bytes = 2 * 2 * 2 * 16 * 4  # layers x (K, V) x KV heads x head size x float32
    engine = vllm.LLM(model=model_dir, enable_prefix_caching=False, disable_log_stats=False,
                      **dict(ENGINE, kv_cache_memory_bytes=1100 * token_bytes))
    try:
        prompts = random_prompts([100] * 7 + [20], seed=5)
        outs = engine.generate([{"prompt_token_ids": p} for p in prompts], greedy(100))
        assert all(o.num_cached_tokens == 0 for o in outs)
        assert preemptions(engine) > 0, "expected the small KV cache to force preemptions"
        for o, p in zip(outs, prompts):
            reference.assert_greedy(o.outputs[0].token_ids, p, 100)
    finally:
        engine.llm_engine.engine_core.shutdown()
