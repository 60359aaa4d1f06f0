"""Tensor parallelism 2 on the npu with the real vLLM: two workers on npu:0
and npu:1 (each its own spawned process), their collectives over
npubridge's "npu" backend, give transformers' float64 greedy generate()
tokens, the reference tensor parallelism 1 is held to in test_vllm_llm.py
(up to the first near-tie); with prefix caching off."""
import pytest

from vllm_models import Reference, random_prompts, save_llama

import vllm  # noqa: E402  (installed by the set-up: scripts/lib.sh)

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # 4 KV heads so that each of the 2 ranks holds 2 (and 2 query heads).
    return save_llama(tmp_path_factory.mktemp("tiny_llama"), num_kv_heads=4)


def test_tensor_parallel_2_gives_the_reference_tokens(model_dir):
    reference = Reference(model_dir)
    prompts = random_prompts([3, 17, 150], seed=11)
    engine = vllm.LLM(model=model_dir, tensor_parallel_size=2, dtype="float32", kv_cache_memory_bytes=16 << 20,
                      max_model_len=512, max_num_batched_tokens=64, enable_prefix_caching=False, seed=0)
    try:
        config = engine.llm_engine.vllm_config.parallel_config
        assert config.tensor_parallel_size == 2
        engine.collective_rpc("npu_reset_stats")
        outs = engine.generate([{"prompt_token_ids": p} for p in prompts],
                               vllm.SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
        stats = engine.collective_rpc("npu_stats")
        assert len(stats) == 2
        for rank, st in enumerate(stats):
            fell = {op: s["fallbacks"] for op, s in st.items() if s["fallbacks"]}
            assert not fell, f"rank {rank}: {fell}"
            assert st["vllm_like::flash_attn_varlen"]["calls"] > 0
        devices = engine.collective_rpc("npu_device")
        assert devices == ["npu:0", "npu:1"]
    finally:
        engine.llm_engine.engine_core.shutdown()
    for o, p in zip(outs, prompts):
        reference.assert_greedy(o.outputs[0].token_ids, p, MAX_TOKENS, "tp=2")
