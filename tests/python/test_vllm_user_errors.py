"""npubridge.vllm as a new user meets it: models the runner does not compute,
bad arguments and prompts, and seeded sampling under memory pressure.

Every refusal is a clear ValueError/TypeError naming what was given and what
is supported, raised up front (not a deep AttributeError or a silent wrong
answer)."""
import pytest
import torch

import transformers

from npubridge.vllm import LLM, SamplingParams  # noqa: E402

VOCAB = 256


def llama_config(**kw):
    args = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.1,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    args.update(kw)
    return args


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_config())).eval()


def prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, VOCAB, (n, ), generator=g).tolist()} for n in lengths]


# ---- 2. seeded sampling is the same under any schedule -------------------------------------------------------------


def completions(model, requests, **llm_kwargs):
    llm = LLM(model, **llm_kwargs)
    outs = llm.generate([p for p, _ in requests], [s for _, s in requests])
    return [[o.token_ids for o in out.outputs] for out in outs], llm.llm_engine.stats()


def test_seeded_outputs_do_not_depend_on_chunking_or_preemption(model):
    seeded = [SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True),
              SamplingParams(n=1, temperature=1.0, seed=6, max_tokens=12, ignore_eos=True),
              SamplingParams(n=3, temperature=0.9, top_k=50, seed=7, max_tokens=10, ignore_eos=True)]
    requests = list(zip(prompts([21, 13, 18]), seeded))
    want, _ = completions(model, requests, block_size=8, num_device_blocks=64)
    configs = [
        dict(enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=8, num_device_blocks=12),
        dict(num_device_blocks=12, preemption_mode="recompute"),
        dict(num_device_blocks=12, num_cpu_blocks=32, preemption_mode="swap"),
        dict(enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=8, num_device_blocks=12, num_cpu_blocks=32,
             preemption_mode="swap"),
    ]
    for config in configs:
        got, stats = completions(model, requests, block_size=8, **config)
        assert got == want, (config, stats)
    # The pressured configurations did preempt (else the test shows nothing).
    _, stats = completions(model, requests, block_size=8, **configs[1])
    assert stats["num_preemptions_recompute"] > 0
    _, stats = completions(model, requests, block_size=8, **configs[2])
    assert stats["num_preemptions_swap"] > 0
    # Alone or in a batch, a seeded request draws the same tokens.
    alone, _ = completions(model, requests[:1], block_size=8, num_device_blocks=64)
    assert alone[0] == want[0]
    # The n completions differ from each other (independent draws, not one copied).
    assert len({tuple(t) for t in want[2]}) > 1


# ---- 1. only models the runner computes ----------------------------------------------------------------------------


def tiny(cls_name, config_name, **kw):
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**llama_config(**kw))
    return getattr(transformers, cls_name)(config).eval()


@pytest.mark.parametrize("cls, config, kw, message", [
    ("GPT2LMHeadModel", "GPT2Config", None, "model class GPT2LMHeadModel is not supported"),
    ("LlamaModel", "LlamaConfig", {}, "model class LlamaModel is not supported"),
    ("GemmaForCausalLM", "GemmaConfig", dict(hidden_act="silu", head_dim=16), "GemmaForCausalLM is not supported"),
    ("MistralForCausalLM", "MistralConfig", dict(sliding_window=16), "sliding_window=16"),
    ("Qwen2ForCausalLM", "Qwen2Config", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1),
     "sliding_attention"),
    ("LlamaForCausalLM", "LlamaConfig", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    ("LlamaForCausalLM", "LlamaConfig", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'dynamic'"),
])
def test_unsupported_models_are_refused_up_front(cls, config, kw, message):
    if kw is None:
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4,
                                                                     vocab_size=VOCAB)).eval()
    else:
        model = tiny(cls, config, **kw)
    with pytest.raises(ValueError, match="supported") as e:
        LLM(model, num_device_blocks=8)
    assert message in str(e.value)
    if cls != "GPT2LMHeadModel":
        from npubridge.vllm.model_runner import ModelRunner
        with pytest.raises(ValueError, match="ModelRunner: .*supported"):
            ModelRunner(model, num_device_blocks=8)


def test_mistral_without_a_window_in_effect_is_accepted():
    # MistralConfig's default window (4096) is beyond max_position_embeddings (256): full attention.
    LLM(tiny("MistralForCausalLM", "MistralConfig"), num_device_blocks=8)


def test_qwen2_with_qkv_bias_matches_transformers_greedy():
    model = tiny("Qwen2ForCausalLM", "Qwen2Config")
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():  # the qkv biases matter (random, not transformers' zeros)
        for layer in model.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.normal_(0, 0.5)
    llm = LLM(model, block_size=8, num_device_blocks=32)
    for p in prompts([5, 19]):
        got = llm.generate([p], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].outputs[0].token_ids
        ids = torch.tensor([p["prompt_token_ids"]])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                              do_sample=False, pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert got == want


# ---- 3. and 6. LLM() arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "nonsense"])
def test_a_non_npu_device_is_refused(model, device):
    with pytest.raises(ValueError, match=f"device must be an npu device .*found '{device}'"):
        LLM(model, device=device, num_device_blocks=8)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(block_size=0), ValueError, "block_size must be an int >= 1.*found 0"),
    (dict(block_size=2.5), ValueError, "block_size must be an int >= 1.*found 2.5"),
    (dict(max_model_len=0), ValueError, "max_model_len must be an int >= 2.*found 0"),
    (dict(preemption_mode="swap"), ValueError, "preemption_mode='swap' needs swap space"),
    (dict(dtype="float8"), ValueError, "dtype must be a torch.dtype or one of .*found 'float8'"),
    (dict(gpu_memory_utilization=0.9), TypeError, "gpu_memory_utilization.*kv_cache_memory.*supports .*block_size"),
    (dict(tensor_parallel_size=2, enforce_eager=True), TypeError, "enforce_eager, tensor_parallel_size"),
])
def test_bad_llm_options_are_refused(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM(model, num_device_blocks=8, **kwargs)


def test_a_swap_space_below_one_block_warns_that_the_unit_is_bytes(model):
    with pytest.warns(UserWarning, match="swap_space=4 bytes is less than one KV block.*not vLLM's GiB"):
        LLM(model, num_device_blocks=8, swap_space=4)


@pytest.mark.parametrize("name, dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16),
                                         ("float32", torch.float32), ("auto", torch.float32)])
def test_dtype_strings_as_in_vllm(model, name, dtype):
    llm = LLM(model, num_device_blocks=8, dtype=name)
    assert llm.model_runner.dtype == dtype
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2


# ---- 4. SamplingParams --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number >= 0, found inf"),
    (dict(temperature="0.5"), TypeError, "temperature must be a number, found '0.5' \\(str\\)"),
    (dict(max_tokens=2.5), TypeError, "max_tokens must be an int or None, found 2.5"),
    (dict(n=True), TypeError, "n must be an int, found True"),
    (dict(seed=2**70), ValueError, "seed must be in \\[-2\\*\\*63, 2\\*\\*64\\)"),
    (dict(seed=1.5), TypeError, "seed must be an int or None, found 1.5"),
    (dict(stop_token_ids=["a"]), TypeError, "stop_token_ids\\[0\\] must be an int \\(a token id\\), found 'a'"),
    (dict(stop_token_ids=[3, -1]), ValueError, "stop_token_ids\\[1\\] must be a token id >= 0, found -1"),
    (dict(stop_token_ids=7), TypeError, "stop_token_ids must be a list of ints, found 7"),
    (dict(stop=[1]), TypeError, "stop must be a str or a list of str"),
])
def test_bad_sampling_params_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match="SamplingParams: " + message):
        SamplingParams(**kwargs)


def test_a_dict_as_sampling_params_is_a_type_error(model):
    llm = LLM(model, num_device_blocks=8)
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams .*found dict.*SamplingParams\\(\\*\\*d"):
        llm.generate([{"prompt_token_ids": [5, 6]}], {"temperature": 0})
    with pytest.raises(TypeError, match="sampling_params\\[1\\] must be a SamplingParams"):
        llm.generate([{"prompt_token_ids": [5, 6]}] * 2, [SamplingParams(), 0.5])
    assert not llm.llm_engine.has_unfinished_requests()


# ---- 5. prompts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt, message", [
    ({"prompt_token_ids": [3, 4.7, True]}, "prompt token ids must be ints, found 4.7 \\(float\\) at "
     "prompt_token_ids\\[1\\]"),
    ({"prompt_token_ids": [3, 4, True]}, "found True \\(bool\\) at prompt_token_ids\\[2\\]"),
    ({"prompt_token_ids": "abc"}, "\\['prompt_token_ids'\\] must be a list of ints, found str"),
    ({"prompt_token_ids": [[3, 4]]}, "found \\[3, 4\\] \\(list\\) at prompt_token_ids\\[0\\]"),
    ({"prompt_token_ids": ["3"]}, "found '3' \\(str\\) at prompt_token_ids\\[0\\]"),
])
def test_bad_prompt_token_ids_name_the_prompt_and_element(model, prompt, message):
    llm = LLM(model, num_device_blocks=8)
    with pytest.raises(TypeError, match="LLM.generate: prompts\\[1\\].*" + message):
        llm.generate([{"prompt_token_ids": [5, 6]}, prompt], SamplingParams(max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()


def test_engine_add_request_checks_token_ids_too(model):
    engine = LLM(model, num_device_blocks=8).llm_engine
    with pytest.raises(TypeError, match="add_request\\('r'\\): prompt token ids must be ints, found 3.0"):
        engine.add_request("r", {"prompt_token_ids": [3.0]})


@pytest.mark.parametrize("prompts", [None, 5, object()])
def test_generate_of_no_prompts_is_a_type_error(model, prompts):
    with pytest.raises(TypeError, match="LLM.generate: prompts must be a prompt or a list of prompts"):
        LLM(model, num_device_blocks=8).generate(prompts)


def test_stop_token_ids_beyond_the_vocab_are_refused(model):
    llm = LLM(model, num_device_blocks=8)
    with pytest.raises(ValueError, match=f"stop_token_ids must be in \\[0, {VOCAB}\\).*found \\[{VOCAB}\\]"):
        llm.generate([{"prompt_token_ids": [5, 6]}], SamplingParams(stop_token_ids=[3, VOCAB]))


# ---- 7. raw cache ops ----------------------------------------------------------------------------------------------


def legacy_caches(num_blocks=4, kv_heads=2, head_size=8, block_size=8, layers=2):
    from npubridge.vllm import _custom_ops
    kshape, vshape = _custom_ops.legacy_cache_shapes(num_blocks, kv_heads, head_size, block_size, torch.float32)
    return ([torch.randn(kshape).to("npu") for _ in range(layers)],
            [torch.randn(vshape).to("npu") for _ in range(layers)])


def test_copy_blocks_refuses_empty_lists_and_overlapping_caches():
    from npubridge.vllm import _custom_ops
    with pytest.raises(RuntimeError, match="copy_blocks: key_caches, value_caches: expected one cache per layer but "
                       "found lists of 0 and 0"):
        _custom_ops.copy_blocks([], [], [(0, 3)])
    keys, values = legacy_caches()
    with pytest.raises(RuntimeError, match="value_caches\\[1\\] and key_caches\\[0\\] overlap|key_caches\\[0\\] and "
                       "value_caches\\[1\\] overlap"):
        _custom_ops.copy_blocks(keys, [values[0], keys[0]], [(0, 3)])
    # Per-layer views of one allocation do not overlap: accepted, and copied.
    whole = torch.randn((2, ) + tuple(keys[0].shape)).to("npu")
    _custom_ops.copy_blocks([whole[0], whole[1]], values, [(0, 3)])
    assert torch.equal(whole[1, 3].cpu(), whole[1, 0].cpu())


def test_copy_blocks_kernel_refuses_caches_that_disagree():
    keys, values = legacy_caches()
    mapping = torch.tensor([[0, 3]]).to("npu")
    # A value cache with another block size than the key cache's (16 tokens, not 8).
    wrong_value = torch.zeros(4, 2, 8, 16).to("npu")
    with pytest.raises(RuntimeError, match="value_caches\\[0\\]: expected the dtype and the block size .* of "
                       "key_caches\\[0\\] \\(float32 \\[4, 2, 2, 8, 4\\]\\) but found float32 \\[4, 2, 8, 16\\]"):
        torch.ops.vllm_like.copy_blocks([keys[0]], [wrong_value], mapping)
    with pytest.raises(RuntimeError, match="key_caches\\[1\\]: expected key_caches\\[0\\]'s dtype and shape"):
        torch.ops.vllm_like.copy_blocks([keys[0], keys[1][:, :1].contiguous()], values, mapping)
    # A dtype mismatch is refused by the dispatcher (one dispatch dtype per call), naming the list.
    with pytest.raises(RuntimeError, match="'value_caches' to be float32 .* but found float16"):
        torch.ops.vllm_like.copy_blocks(keys, [values[0], values[1].half()], mapping)
    # Empty lists never reach the kernel (the dispatch dtype would be block_mapping's int64): _custom_ops refuses them.


def test_swap_blocks_of_0d_tensors_asks_for_a_block_dimension():
    from npubridge.vllm import _custom_ops
    msg = "swap_blocks: src, dst: expected caches with a block dimension \\(dim 0\\) but found shapes \\[\\] and \\[\\]"
    with pytest.raises(RuntimeError, match=msg):
        _custom_ops.swap_blocks(torch.tensor(1.0), torch.tensor(2.0), [(0, 0)])
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.vllm_like.swap_blocks(torch.tensor(1.0).to("npu"), torch.tensor(2.0).to("npu"),
                                        torch.zeros(1, 2, dtype=torch.int64).to("npu"))
