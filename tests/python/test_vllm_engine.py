"""npubridge.vllm.LLM end to end on the npu: the engine over the real
ModelRunner and the vllm_like ops, against transformers on the CPU.

The model is a tiny random-weight LlamaForCausalLM (nothing downloaded).
Greedy output must equal transformers' greedy generate() token for token,
with and without prefix caching and under memory pressure that forces
preemption by swap and by recompute. Copy-on-write, prefix caching and
swapping are checked by the KV cache CONTENTS (ModelRunner.read_block):
block moves are copies, so their results are compared exactly.
"""
import pytest
import torch

import transformers

from npubridge.vllm import LLM, SamplingParams  # noqa: E402

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=256, initializer_range=0.1, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def random_prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n, ), generator=g).tolist() for n in lengths]


_hf_cache = {}


def hf_greedy(model, prompt, max_new_tokens):
    key = (id(model), tuple(prompt), max_new_tokens)
    if key not in _hf_cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=0)
        _hf_cache[key] = out[0, len(prompt):].tolist()
    return _hf_cache[key]


def assert_greedy_equal(model, outs, prompts, max_tokens):
    for out, prompt in zip(outs, prompts):
        expected = hf_greedy(model, prompt, max_tokens)
        got = out.outputs[0].token_ids
        assert got == expected, f"prompt of {len(prompt)} tokens: {got} != transformers' {expected}"
        assert out.outputs[0].finish_reason == ("stop" if expected[-1] == 2 else "length")


def record(runner, name):
    """Wrap runner.<name> to keep its block pairs, and each pair's source and
    destination contents around the call (all layers, K and V)."""
    calls = []
    real = getattr(runner, name)
    src_on, dst_on = {"swap_out": ("npu", "cpu"), "swap_in": ("cpu", "npu"), "copy_blocks": ("npu", "npu")}[name]

    def snap(block, on):
        return [runner.read_block(layer, block, on=on) for layer in range(runner.num_layers)]

    def wrapped(pairs):
        pairs = list(pairs)
        before = [snap(s, src_on) for s, _ in pairs]
        real(pairs)
        calls.append([(s, d, b, snap(d, dst_on)) for (s, d), b in zip(pairs, before)])

    setattr(runner, name, wrapped)
    return calls


def assert_copied(calls):
    for call in calls:
        for _, _, before, after in call:
            for (k0, v0), (k1, v1) in zip(before, after):
                assert torch.equal(k0, k1) and torch.equal(v0, v1)


PROMPTS = random_prompts([1, 5, 16, 17, 33, 40])
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_greedy_equals_transformers(model, prefix_caching):
    llm = LLM(model, num_device_blocks=64, enable_prefix_caching=prefix_caching)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = llm.generate(prompts, GREEDY)
    assert [o.prompt_token_ids for o in outs] == PROMPTS
    assert_greedy_equal(model, outs, PROMPTS, 16)
    # Again: with caching, the full blocks of every prompt now come from the cache.
    again = llm.generate(prompts, GREEDY)
    assert_greedy_equal(model, again, PROMPTS, 16)
    st = llm.llm_engine.stats()
    if prefix_caching:
        assert [o.num_cached_tokens for o in again] == [0, 0, 0, 16, 32, 32]
        assert st["prefix_cache_hits"] == 80
    else:
        assert st["prefix_cache_hits"] == 0
    llm.llm_engine.block_manager.check_invariants()
    assert st["num_free_device_blocks"] == 64


def test_prefix_cache_hit_reads_the_cached_blocks_unchanged(model):
    llm = LLM(model, num_device_blocks=32, enable_prefix_caching=True)
    engine, runner = llm.llm_engine, llm.model_runner
    shared = random_prompts([32], seed=7)[0]
    a, b = shared + [5, 6, 7], shared + [9]
    llm.generate({"prompt_token_ids": a}, GREEDY)
    # a's two full prompt blocks are cached (free but evictable).
    bm = engine.block_manager
    cached = [bm.device.lookup(k) for k in bm._prefix_keys(_seq(a), 2)]
    assert None not in cached
    before = {blk: [runner.read_block(layer, blk) for layer in range(runner.num_layers)] for blk in cached}
    # They hold the prefix's K/V: what a fresh engine computes for the same prompt, bit for bit.
    fresh = LLM(model, num_device_blocks=32)
    fresh_blocks = []
    real = fresh.model_runner.execute
    fresh.model_runner.execute = lambda inp: (fresh_blocks.append(inp.block_tables[0][:2]), real(inp))[1]
    fresh.generate({"prompt_token_ids": a}, SamplingParams(temperature=0.0, max_tokens=1))
    for blk, fresh_blk in zip(cached, fresh_blocks[0]):
        for layer in range(runner.num_layers):
            for got, want in zip(before[blk][layer], fresh.model_runner.read_block(layer, fresh_blk)):
                assert torch.equal(got, want)
    seen = []
    real_execute = runner.execute

    def spy(inp):
        seen.append((list(inp.positions), [list(t) for t in inp.block_tables]))
        return real_execute(inp)

    runner.execute = spy
    out = llm.generate({"prompt_token_ids": b}, GREEDY)[0]
    # b's prefill computed its last token alone, over a's cached blocks.
    assert seen[0][0] == [32] and seen[0][1][0][:2] == cached
    assert out.num_cached_tokens == 32
    assert_greedy_equal(model, [out], [b], 16)
    for blk, kv in before.items():
        for layer, (k, v) in enumerate(kv):
            k1, v1 = runner.read_block(layer, blk)
            assert torch.equal(k, k1) and torch.equal(v, v1), "a cached block was written"


def _seq(tokens):
    from npubridge.vllm.sequence import Sequence
    return Sequence(-1, tokens)


def test_parallel_sampling_shares_the_prompt_and_copies_on_write(model):
    llm = LLM(model, num_device_blocks=32)
    engine, runner = llm.llm_engine, llm.model_runner
    copies = record(runner, "copy_blocks")
    prompt = random_prompts([20], seed=3)[0]  # one full block and 4 tokens in the second
    engine.add_request("n4", {"prompt_token_ids": prompt},
                       SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True))
    engine.step()
    group = engine.scheduler.running[0]
    tables = [list(engine.block_manager.get_block_table(s)) for s in group.seqs]
    assert len(tables) == 4 and all(t == tables[0] for t in tables)
    assert [engine.block_manager.device.ref_counts[b] for b in tables[0]] == [4, 4]
    engine.step()  # each fork writes position 20 into the shared second block
    assert len(copies) == 1 and sorted(s for s, _, _, _ in copies[0]) == [tables[0][1]] * 3
    assert_copied(copies)
    # The copies hold the prompt's 4 tokens, then each its own token 20.
    new_tables = [engine.block_manager.get_block_table(s) for s in group.seqs]
    assert all(t[0] == tables[0][0] for t in new_tables)
    firsts = [runner.read_block(0, t[1])[0] for t in new_tables]
    for k in firsts[1:]:
        assert torch.equal(k[:4], firsts[0][:4])
    tokens20 = [s.output_token_ids[0] for s in group.seqs]
    for i in range(4):
        for j in range(i):
            if tokens20[i] != tokens20[j]:
                assert not torch.equal(firsts[i][4], firsts[j][4])
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert len(outs[0].outputs) == 4 and [c.index for c in outs[0].outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 8 for c in outs[0].outputs)
    engine.block_manager.check_invariants()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_memory_pressure_preempts_and_outputs_stay_equal(model, mode):
    llm = LLM(model, block_size=8, num_device_blocks=12, num_cpu_blocks=32 if mode == "swap" else 0,
              preemption_mode=mode)
    runner = llm.model_runner
    outs_swap, ins_swap = record(runner, "swap_out"), record(runner, "swap_in")
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert_greedy_equal(model, outs, PROMPTS, 16)
    st = llm.llm_engine.stats()
    if mode == "swap":
        assert st["num_preemptions_swap"] > 0 and outs_swap and ins_swap
        assert_copied(outs_swap)
        assert_copied(ins_swap)
    else:
        assert st["num_preemptions_recompute"] > 0 and not outs_swap
    assert st["num_free_device_blocks"] == 12 and st["num_free_cpu_blocks"] == st["num_cpu_blocks"]


def test_seeded_sampling_reproduces(model):
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    first = LLM(model, num_device_blocks=32).generate({"prompt_token_ids": PROMPTS[3]}, params)[0]
    # Other requests in the batch do not change a seeded request's draws.
    crowd = [{"prompt_token_ids": p} for p in PROMPTS]
    mixed = LLM(model, num_device_blocks=64).generate(
        crowd, [SamplingParams(temperature=1.0, max_tokens=12)] * 3 + [params] + [SamplingParams()] * 2)
    assert mixed[3].outputs[0].token_ids == first.outputs[0].token_ids
    other = LLM(model, num_device_blocks=32).generate({"prompt_token_ids": PROMPTS[3]},
                                                      SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=99,
                                                                     max_tokens=12, ignore_eos=True))[0]
    assert other.outputs[0].token_ids != first.outputs[0].token_ids


class CharTokenizer:
    """transformers' tokenizer API, the part LLM uses: one token per character."""
    eos_token_id = 2

    def __call__(self, text):
        return {"input_ids": [3 + (ord(c) % (VOCAB - 3)) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i - 3 + 32) if i >= 3 else "" for i in ids if i >= 3 or not skip_special_tokens)


def test_text_prompts_with_a_tokenizer(model):
    tok = CharTokenizer()
    llm = LLM(model, tokenizer=tok, num_device_blocks=32)
    outs = llm.generate(["hello world", "npu"], SamplingParams(temperature=0.0, max_tokens=6))
    for out, text in zip(outs, ["hello world", "npu"]):
        assert out.prompt == text and out.prompt_token_ids == tok(text)["input_ids"]
        c = out.outputs[0]
        assert c.text == tok.decode(c.token_ids)
        assert c.token_ids == hf_greedy(model, out.prompt_token_ids, 6)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LLM(model, num_device_blocks=8).generate("text")


def test_cache_sizing_from_bytes_and_its_errors(model):
    from npubridge.vllm.model_runner import ModelRunner

    block = ModelRunner.block_bytes(model.config, 16, torch.float32)
    assert block == 2 * 2 * 16 * 2 * 16 * 4  # K and V, 2 layers, 16 tokens, 2 kv heads of 16, float32
    llm = LLM(model, kv_cache_memory=10 * block + 5, swap_space=3 * block)
    st = llm.llm_engine.stats()
    assert st["num_device_blocks"] == 10 and st["num_cpu_blocks"] == 3
    with pytest.raises(ValueError, match=f"the KV cache holds no block: kv_cache_memory 100 bytes, one block of 16 "
                       f"tokens over all layers is {block} bytes"):
        LLM(model, kv_cache_memory=100)
    with pytest.raises(ValueError, match="give num_device_blocks or kv_cache_memory, not both"):
        LLM(model, num_device_blocks=4, kv_cache_memory=1 << 20)
    with pytest.raises(TypeError, match="not a name"):
        LLM("meta-llama/Llama-2-7b-hf")


def test_a_flat_token_id_list_is_one_prompt(model):
    llm = LLM(model, num_device_blocks=16)
    p = PROMPTS[1]
    ref = llm.generate({"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=3))
    for outs in (llm.generate(p, SamplingParams(temperature=0, max_tokens=3)),
                 llm.generate(prompt_token_ids=p, sampling_params=SamplingParams(temperature=0, max_tokens=3)),
                 llm.generate(prompt_token_ids=[p], sampling_params=SamplingParams(temperature=0, max_tokens=3))):
        assert len(outs) == 1 and outs[0].prompt_token_ids == p
        assert outs[0].outputs[0].token_ids == ref[0].outputs[0].token_ids
    assert len(llm.generate([p, PROMPTS[0]], SamplingParams(temperature=0, max_tokens=1))) == 2
    with pytest.raises(ValueError, match="not both"):
        llm.generate(p, prompt_token_ids=p)


def test_cache_sizing_uses_the_dtype_the_runner_computes_in(model):
    # A float64 model runs (and caches) in float32: its byte budget is sized
    # with float32 blocks, not float64 ones (which gave half the blocks).
    import copy

    from npubridge.vllm.model_runner import ModelRunner

    block = ModelRunner.block_bytes(model.config, 16, torch.float32)
    llm = LLM(copy.deepcopy(model).double(), kv_cache_memory=10 * block)
    assert llm.model_runner.dtype == torch.float32
    assert llm.llm_engine.stats()["num_device_blocks"] == 10
    assert llm.model_runner.key_caches[0].shape[0] == 10


def test_forks_that_fit_exactly_are_not_preempted(model):
    # 3 forks of a 6-token prompt in a 4-block pool: the first decode makes 2
    # copies of the shared half block (not 3), which fit exactly.
    llm = LLM(model, block_size=4, num_device_blocks=4)
    out = llm.generate({"prompt_token_ids": PROMPTS[1][:6]}, SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=2, ignore_eos=True))
    st = llm.llm_engine.stats()
    assert st["num_preemptions_swap"] == st["num_preemptions_recompute"] == st.get("num_ignored", 0) == 0
    assert [(len(c.token_ids), c.finish_reason) for c in out[0].outputs] == [(2, "length")] * 3
